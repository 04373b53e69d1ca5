"""The optional extras, and the one message that says how to add a missing one.

Public: EXTRAS, NEEDS, MissingExtra, available(extra), unusable(extra), require(extra, what).
`pip install fp8lab` brings the lab without them; `fp8lab[lab]` brings both (and JupyterLab):
  fp8lab[torchao]  torchao: convert(engine="torchao"), export(..., "torchao").config, notebook 07's torchao runs
  fp8lab[data]     scikit-learn: the handwritten digits of notebook 08's capstone
Each place that needs one calls require() before it imports anything from it. An extra installed
beside a torch too old for it (torchao 0.18 needs torch 2.11) counts as missing, and says so; so does
one that is installed but fails when imported (import_error: a broken install), with its error.
"""

from __future__ import annotations

import contextlib
import importlib
import importlib.metadata
import importlib.util
import logging
import re
import warnings

__all__ = ["EXTRAS", "NEEDS", "MissingExtra", "available", "import_error", "require", "unusable"]

# extra -> (the module it provides, the distribution pip installs for it)
EXTRAS = {"torchao": ("torchao", "torchao"), "data": ("sklearn", "scikit-learn")}
# extra -> (distribution, oldest version) the extra's package needs at run time (pyproject.toml's extra
# declares the same): torchao 0.18 calls torch APIs that torch 2.11 brings (its pytree registrations)
NEEDS = {"torchao": ("torch", "2.11")}


class MissingExtra(ImportError, ValueError):
    """An optional extra that `what` needs is not installed.

    An ImportError (a package is missing) and a ValueError (a choice this installation cannot serve:
    the lab's panels show a ValueError's message in place of their plot). In IPython the message
    alone is shown, without a traceback into fp8lab."""

    def __init__(self, extra: str, what: str) -> None:
        module, dist = EXTRAS[extra]
        problem = unusable(extra)
        broken = import_error(extra) if problem is None and available(extra, installed_only=True) else None
        if broken is not None:
            message = (f"{what} needs {dist}, and the installed one is broken: `import {module}` fails with "
                       f"{broken}. Reinstall it with\n"
                       f'    pip install --force-reinstall "fp8lab[{extra}]"\n'
                       f"(or pip uninstall {dist}: fp8lab's own engine runs everything else), then restart the kernel")
        elif problem is not None and available(extra, installed_only=True):
            need, floor = NEEDS[extra]
            message = (f"{what} needs {dist}, and the installed one cannot run here: {problem}. Upgrade with\n"
                       f'    pip install "{need}>={floor}"\n'
                       f"(a CUDA build of torch: the command pytorch.org/get-started gives), then restart the kernel")
        else:
            message = (f"{what} needs {dist}, which fp8lab's optional extra [{extra}] brings. Add it with\n"
                       f'    pip install "fp8lab[{extra}]"\n'
                       f'(in a notebook: %pip install "fp8lab[{extra}]", then restart the kernel; '
                       f'"fp8lab[lab]" brings every extra)')
        super().__init__(message, name=module)
        self.extra = extra

    def _render_traceback_(self) -> list[str]:  # IPython shows these lines instead of a traceback
        return [f"{type(self).__name__}: {self.msg}"]


def _version(text: str) -> tuple[int, ...]:
    return tuple(int(p) for p in re.findall(r"[0-9]+", text.split("+")[0])[:3])


def unusable(extra: str) -> str | None:
    """Why `extra`'s package cannot run here though it may be installed ("torchao 0.18.0 needs torch >=
    2.11, this is torch 2.9.1"), or None."""
    if extra not in NEEDS:
        return None
    need, floor = NEEDS[extra]
    try:
        have = importlib.metadata.version(need)
    except importlib.metadata.PackageNotFoundError:
        return f"{EXTRAS[extra][1]} needs {need} >= {floor}, which is not installed"
    if _version(have) >= _version(floor):
        return None
    try:
        mine = f"{EXTRAS[extra][1]} {importlib.metadata.version(EXTRAS[extra][1])}"
    except importlib.metadata.PackageNotFoundError:
        mine = EXTRAS[extra][1]
    return f"{mine} needs {need} >= {floor}, this is {need} {have}"


_IMPORT_ERRORS: dict[str, str | None] = {}


def import_error(extra: str, quiet: bool = False) -> str | None:
    """Why importing `extra`'s package fails here ("RuntimeError: ..."), or None where it imports. It is
    imported, once per process (the answer is kept); quiet: with its import-time warnings and log messages
    held back (torchao logs the GPU kernels it cannot load on a CPU machine)."""
    if extra not in _IMPORT_ERRORS:
        module = EXTRAS[extra][0]
        with _held_back() if quiet else contextlib.nullcontext():
            try:
                importlib.import_module(module)
                _IMPORT_ERRORS[extra] = None
            except Exception as err:  # whatever a broken install raises: ImportError, OSError, RuntimeError, ...
                text = " ".join(str(err).split())
                _IMPORT_ERRORS[extra] = f"{type(err).__name__}: {text[:300]}"
    return _IMPORT_ERRORS[extra]


@contextlib.contextmanager
def _held_back():
    previous = logging.root.manager.disable
    logging.disable(logging.WARNING)
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            yield
    finally:
        logging.disable(previous)


def available(extra: str, installed_only: bool = False) -> bool:
    """Whether the package of `extra` ("torchao" or "data") is installed, new enough torch is beside it, and
    it imports (import_error: it is imported, once per process); installed_only: whether it is installed at
    all, runnable or not (not imported)."""
    if extra not in EXTRAS:
        raise ValueError(f"unknown extra {extra!r}; valid: {', '.join(EXTRAS)}")
    try:
        installed = importlib.util.find_spec(EXTRAS[extra][0]) is not None
    except (ImportError, ValueError):  # a broken or hidden package counts as missing
        return False
    if installed_only or not installed:
        return installed
    return unusable(extra) is None and import_error(extra) is None


def require(extra: str, what: str) -> None:
    """Raise MissingExtra, naming `what` needs it and how to add it, where `extra` is not installed, cannot
    run beside this torch (and then how to upgrade torch), or fails when imported (and then its error)."""
    if not available(extra):
        raise MissingExtra(extra, what)
