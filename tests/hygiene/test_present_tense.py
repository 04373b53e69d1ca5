"""The code, the tests, the tools, the notebooks and the docs speak in the present tense: history lives
in git. No commit hashes, issue numbers, "it was"/"no longer"/"Before: ... Now ..." stories, and no dates
except where a measurement names the machine it ran on (a benchmark table's date-and-machine line). A
test's docstring says what the test proves and the hazard it guards against."""

import io
import re
import tokenize
from pathlib import Path

import nbformat
import pytest

ROOT = Path(__file__).resolve().parents[2]
PROSE = [*sorted((ROOT / "docs").glob("*.md")), ROOT / "README.md", ROOT / "FACILITATOR.md",
         ROOT / "notebooks" / "ANSWERS.md"]
CODE = sorted((ROOT / "fp8lab").rglob("*.py")) + sorted((ROOT / "fp8lab").rglob("*.c"))
NOTEBOOKS = sorted((ROOT / "notebooks").glob("*.ipynb"))
# this file is left out: its patterns and examples are the history it looks for
TESTS_AND_TOOLS = [path for path in sorted((ROOT / "tests").rglob("*.py")) + sorted((ROOT / "tools").glob("*.py"))
                   if path != Path(__file__).resolve() and "fixtures" not in path.relative_to(ROOT).parts]

DATE = re.compile(r"\b20\d\d-\d\d-\d\d\b")
MACHINE = re.compile(r"\b(EPYC|Xeon|Intel|AMD|Apple|Ryzen|cores?|threads?|GPU|CPU)\b")
HASH = re.compile(r"\b(?=[0-9a-f]*[a-f])(?=[0-9a-f]*\d)[0-9a-f]{7,12}\b")
ISSUE = re.compile(r"\b(issues?|PR)\s*#?\d+\b|(?<![\w/])#\d{2,}\b", re.IGNORECASE)
HISTORY = re.compile(r"\(it was\b|\bit was \d|\b(it used to|used to be|no longer|formerly|previously|was changed|"
                     r"was \w+ until|until 20\d\d|this branch|before \(|old code)\b"
                     r'|(?:^|"""|[#(:;.])\s*before[:,]', re.IGNORECASE)  # "Before: ..." opening a docstring or sentence
URL = re.compile(r"https?://\S+")


def _texts():
    for path in PROSE:
        if path.exists():
            yield path, path.read_text()
    for path in CODE:  # comments and strings say things; identifiers and hex constants do not
        text = path.read_text()
        yield path, _comments_and_strings(text) if path.suffix == ".py" else text
    for path in NOTEBOOKS:
        yield path, "\n".join(cell.source for cell in nbformat.read(path, as_version=4).cells)
    for path in TESTS_AND_TOOLS:  # every comment and string, docstrings whole (their lines hold no quote)
        yield path, _comments_and_strings(path.read_text())


def _comments_and_strings(source: str) -> str:
    tokens = tokenize.generate_tokens(io.StringIO(source).readline)
    return "\n".join(tok.string for tok in tokens if tok.type in (tokenize.COMMENT, tokenize.STRING))


def findings(text: str) -> list[str]:
    out = []
    for line in (URL.sub("<url>", line) for line in text.splitlines()):  # a link's path says nothing
        if DATE.search(line) and not MACHINE.search(line):
            out.append(f"a date without the machine it was measured on: {line.strip()[:140]}")
        for pattern, what, data in ((HASH, "a commit hash", _not_a_hash), (ISSUE, "an issue number", _a_colour),
                                    (HISTORY, "history", None)):
            if (m := pattern.search(line)) and not (data and data(line, m)):
                out.append(f"{what} ({m.group(0)!r}): {line.strip()[:140]}")
    return out


def _not_a_hash(line: str, m: re.Match) -> bool:
    """Hex that is data, not this project's history: codes and masks (0x7e), digests, cache file names,
    a shared library's name (libgomp-e985bcbb.so), and another project's source cited at the commit it
    was read at ("recipe/__init__.py @ 000b637e")."""
    before = line[: m.start()]
    return (before.endswith(("0x", "0X", "\\x", "@ ")) or "sha256" in line or "kernels-" in before
            or line[m.end():].startswith(".so"))


def _a_colour(line: str, m: re.Match) -> bool:
    """A CSS colour (color: #333;), not an issue number."""
    return re.match(r"#(?:[0-9a-f]{3}){1,2}\s*;", line[m.start():], re.IGNORECASE) is not None


@pytest.mark.parametrize("path, text", list(_texts()), ids=lambda v: str(v.relative_to(ROOT)) if isinstance(v, Path)
                         else "")
def test_speaks_in_the_present_tense(path, text):
    found = findings(text)
    assert not found, f"{path.relative_to(ROOT)}:\n" + "\n".join(found[:15])


def test_the_check_finds_history():
    assert findings("Before (until 364d66d) each notebook ran twice")
    assert findings("see issue 17 for the targets")
    assert findings("it was 64 until 2026-11-29")
    assert findings("measured 2026-11-30: block 573 ms")  # a date, no machine
    assert findings("(tmpXXXXXXXX.so before 2026-12-01)")
    assert not findings("Measured 2026-12-01 on an Intel Xeon, 2 cores, no GPU")
    assert not findings("E4M3's largest code is 0x7e; its NaN 0x7f")
    assert not findings("Reveal the answer after the question, not before it")
    assert not findings("the model is left as it was; it reads lines until it exits")
    assert not findings("read from transformer_engine/common/recipe/__init__.py @ 000b637e")
    assert findings("(it was `widgets.bench_widgets`, which imported `bench`)")
    assert findings("fp8lab no longer flips that setting")
    assert findings('"""Before: x was broken."""')
    assert findings("# Before, every block was padded")
    assert findings("kernels (a stand-in). Before: the histories were not in state_dict")
    assert findings("the layout: before, 9 in 200 such products differed")
    assert not findings("the scale is applied before the cast; (before recording)")
    assert not findings(".note { font-size: 11px; color: #777; }")
    assert not findings('vendored = "/site-packages/scikit_learn.libs/libgomp-e985bcbb.so.1.0.0"')
    assert findings("see #333 for the plan")
