"""The notebooks' hosted links and install cell, and the README's links block, from one setting.

The setting: `Repository` under [project.urls] in pyproject.toml (a public https URL). From it:
  - each notebook's links cell (between `<!-- links:begin -->` and `<!-- links:end -->`): "Open in
    Colab / Kaggle / Binder" for a GitHub repository, Binder for a GitLab one, and for any other host
    (or none set) a sentence without a link, so that no learner clicks a broken one;
  - each notebook's first code cell, which installs fp8lab where it is missing (Colab, Kaggle, a
    JupyterHub) from `FP8LAB_SOURCE` if set, else from this default: `fp8lab[torchao,data] @
    git+URL` with a Repository; without one it installs nothing and says how to get fp8lab (a
    wheel, a repository URL, FP8LAB_SOURCE): fp8lab is not on PyPI, and the cell never installs a
    package someone else may register under its name. The source reaches pip as one argument of
    an argument list, never through a shell;
  - the README's block between the same markers.

    python tools/links.py            write them
    python tools/links.py --check    exit 1 (and say which files) where a file differs
"""

from __future__ import annotations

import argparse
import json
import re
import sys
import tomllib
import urllib.parse
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
NOTEBOOKS = ROOT / "notebooks"
BEGIN, END = "<!-- links:begin -->", "<!-- links:end -->"
BRANCH = "main"
EXTRAS = "torchao,data"  # what a hosted notebook needs beyond its service's torch and Jupyter
SOURCE_VARIABLE = "FP8LAB_SOURCE"


def repository_url(pyproject: Path = ROOT / "pyproject.toml") -> str | None:
    """[project.urls] Repository, without a trailing slash or .git; None where it is not set."""
    urls = tomllib.loads(pyproject.read_text())["project"].get("urls", {})
    url = (urls.get("Repository") or "").strip().removesuffix("/").removesuffix(".git")
    if url and not url.startswith("https://"):
        raise ValueError(f"[project.urls] Repository must be a public https URL, not {url!r}")
    return url or None


def install_source(url: str | None) -> str | None:
    """The pip requirement a hosted notebook installs when FP8LAB_SOURCE is not set: fp8lab from the
    repository once pyproject.toml names it; None without one (fp8lab is not on PyPI, and a package
    someone may register under that name there is not this one)."""
    return f"fp8lab[{EXTRAS}] @ git+{url}" if url else None


NO_SOURCE = ("fp8lab is not installed here, and FP8LAB_SOURCE does not say where to get it. In a cell above "
             "this one, run %env FP8LAB_SOURCE= followed by a wheel file "
             "(/content/fp8lab-0.1.0-py3-none-any.whl[torchao,data]) or a repository "
             "(fp8lab[torchao,data] @ git+https://...), then run this cell again (docs/install.md).")


def setup_cell(url: str | None) -> str:
    """Every notebook's first code cell: install where fp8lab is missing, then the setup call.

    The source reaches pip as one argument of an argument list (subprocess, no shell: a quote or a
    `$(...)` in FP8LAB_SOURCE is part of a file name or requirement, never a command), after `--`
    (a value that starts with a dash is not an option); pip's output is printed in the notebook.
    Without FP8LAB_SOURCE and without a default, the cell stops with NO_SOURCE."""
    default = install_source(url)
    source = (f'os.environ.get("{SOURCE_VARIABLE}") or {default!r}' if default else
              f'os.environ.get("{SOURCE_VARIABLE}", "")')
    return (
        "import importlib.util, os, subprocess, sys  # where fp8lab is missing (Colab, Kaggle, a JupyterHub)\n"
        'if importlib.util.find_spec("fp8lab") is None:\n'
        f"    source = {source}\n"
        "    if not source:\n"
        f"        raise ModuleNotFoundError({NO_SOURCE!r})\n"
        '    pip = subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--", source],\n'
        "                         capture_output=True, text=True)  # one argument, no shell\n"
        '    print(pip.stdout + pip.stderr, end="")\n'
        "    if pip.returncode:\n"
        '        raise ModuleNotFoundError(f"pip could not install fp8lab from {source!r} (its output is above)")\n'
        "    importlib.invalidate_caches()\n"
        "import fp8lab\n"
        "fp8lab.setup()"
    )


def _host(url: str | None) -> tuple[str, str] | None:
    """(host, "owner/name") for the hosts whose links are known; None for any other."""
    if not url:
        return None
    parts = urllib.parse.urlsplit(url)
    path = parts.path.strip("/")
    if parts.netloc in ("github.com", "gitlab.com") and path.count("/") >= 1:
        return parts.netloc, path
    return None


def hosted_links(url: str | None, notebook: str) -> list[tuple[str, str]]:
    """[(service, URL)] that open `notebook` (a file name in notebooks/) on a hosted service."""
    host = _host(url)
    if host is None:
        return []
    netloc, path = host
    in_repo = f"notebooks/{notebook}"
    open_lab = f"HEAD?urlpath=lab/tree/{in_repo}"  # Binder opens JupyterLab at the notebook
    if netloc == "gitlab.com":
        return [("Binder", f"https://mybinder.org/v2/gl/{urllib.parse.quote(path, safe='')}/{open_lab}")]
    blob = f"https://github.com/{path}/blob/{BRANCH}/{in_repo}"
    return [
        ("Colab", f"https://colab.research.google.com/github/{path}/blob/{BRANCH}/{in_repo}"),
        ("Kaggle", f"https://kaggle.com/kernels/welcome?src={blob}"),
        ("Binder", f"https://mybinder.org/v2/gh/{path}/{open_lab}"),
    ]


def notebook_links(url: str | None, notebook: str) -> str:
    """The body of a notebook's links cell."""
    links = hosted_links(url, notebook)
    if install_source(url):
        where = ("On Colab, Kaggle or a JupyterHub the next cell installs fp8lab from the repository where it is "
                 "missing.")
    else:
        where = ("On Colab, Kaggle or a JupyterHub the next cell installs fp8lab where it is missing, from the wheel "
                 "or repository that `FP8LAB_SOURCE` names (docs/install.md says how to set it).")
    if not links:
        return where
    return "Open this notebook in " + " · ".join(f"[{name}]({href})" for name, href in links) + ". " + where


def readme_links(url: str | None) -> str:
    """The body of the README's links block."""
    links = hosted_links(url, "00_setup_check.ipynb")
    if links:
        return ("Open the first notebook without installing anything: "
                + " · ".join(f"[{name}]({href})" for name, href in links)
                + ". Every notebook carries the same links at its top; docs/install.md has the details.")
    return ("Hosted notebooks (Colab, Kaggle, a JupyterHub): each notebook's first cell installs fp8lab where it "
            "is missing, from the wheel or repository that `FP8LAB_SOURCE` names (docs/install.md). The one-click "
            "links and a default source appear here once pyproject.toml names the "
            "repository's public URL (`Repository` under `[project.urls]`) and `python tools/links.py` has run.")


def _region(body: str) -> str:
    return f"{BEGIN}\n{body}\n{END}"


def _replace_region(text: str, body: str, where: str) -> str:
    pattern = re.compile(re.escape(BEGIN) + r".*?" + re.escape(END), re.S)
    if len(pattern.findall(text)) != 1:
        raise ValueError(f"{where}: expected one {BEGIN} ... {END} block")
    return pattern.sub(lambda _: _region(body), text)


def _cell_source(cell: dict) -> str:
    return "".join(cell["source"])


def _as_lines(text: str) -> list[str]:
    return text.splitlines(keepends=True)


def updated_notebook(raw: str, url: str | None, name: str) -> str:
    """The notebook's JSON text with its links cell and first code cell as the setting says."""
    nb = json.loads(raw)
    cells = nb["cells"]
    first_code = next(i for i, c in enumerate(cells) if c["cell_type"] == "code")
    cells[first_code]["source"] = _as_lines(setup_cell(url))
    marked = [i for i, c in enumerate(cells) if c["cell_type"] == "markdown" and BEGIN in _cell_source(c)]
    if marked:
        (i,) = marked
        cells[i]["source"] = _as_lines(_replace_region(_cell_source(cells[i]), notebook_links(url, name), name))
    else:
        cells.insert(first_code, {"cell_type": "markdown", "id": "fp8lab-links", "metadata": {},
                                  "source": _as_lines(_region(notebook_links(url, name)))})
    return json.dumps(nb, indent=1, ensure_ascii=False) + "\n"


def plan(root: Path = ROOT) -> dict[Path, str]:
    """{file: its text as the setting says} for every file that differs now."""
    url = repository_url(root / "pyproject.toml")
    changes = {}
    for path in sorted((root / "notebooks").glob("*.ipynb")):
        raw = path.read_text()
        new = updated_notebook(raw, url, path.name)
        if new != raw:
            changes[path] = new
    readme = root / "README.md"
    if readme.exists() and BEGIN in (text := readme.read_text()):
        new = _replace_region(text, readme_links(url), "README.md")
        if new != text:
            changes[readme] = new
    return changes


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--check", action="store_true", help="change nothing; exit 1 where a file differs")
    args = parser.parse_args(argv)
    changes = plan()
    for path, text in changes.items():
        if args.check:
            print(f"{path.relative_to(ROOT)}: differs from what tools/links.py writes", file=sys.stderr)
        else:
            path.write_text(text)
            print(f"wrote {path.relative_to(ROOT)}")
    return 1 if args.check and changes else 0


if __name__ == "__main__":
    sys.exit(main())
