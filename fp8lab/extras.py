"""The optional extras, and the one message that says how to add a missing one.

Public: EXTRAS, MissingExtra, available(extra), require(extra, what).
`pip install fp8lab` brings the lab without them; `fp8lab[lab]` brings both (and JupyterLab):
  fp8lab[torchao]  torchao: convert(engine="torchao"), export(..., "torchao").config, notebook 07's torchao runs
  fp8lab[data]     scikit-learn: the handwritten digits of notebook 08's capstone
Each place that needs one calls require() before it imports anything from it.
"""

from __future__ import annotations

import importlib.util

__all__ = ["EXTRAS", "MissingExtra", "available", "require"]

# extra -> (the module it provides, the distribution pip installs for it)
EXTRAS = {"torchao": ("torchao", "torchao"), "data": ("sklearn", "scikit-learn")}


class MissingExtra(ImportError, ValueError):
    """An optional extra that `what` needs is not installed.

    An ImportError (a package is missing) and a ValueError (a choice this installation cannot serve:
    the lab's panels show a ValueError's message in place of their plot). In IPython the message
    alone is shown, without a traceback into fp8lab."""

    def __init__(self, extra: str, what: str) -> None:
        module, dist = EXTRAS[extra]
        super().__init__(
            f"{what} needs {dist}, which fp8lab's optional extra [{extra}] brings. Add it with\n"
            f'    pip install "fp8lab[{extra}]"\n'
            f'(in a notebook: %pip install "fp8lab[{extra}]", then restart the kernel; '
            f'"fp8lab[lab]" brings every extra)', name=module)
        self.extra = extra

    def _render_traceback_(self) -> list[str]:  # IPython shows these lines instead of a traceback
        return [f"{type(self).__name__}: {self.msg}"]


def available(extra: str) -> bool:
    """Whether the package of `extra` ("torchao" or "data") can be imported here (it is not imported)."""
    if extra not in EXTRAS:
        raise ValueError(f"unknown extra {extra!r}; valid: {', '.join(EXTRAS)}")
    try:
        return importlib.util.find_spec(EXTRAS[extra][0]) is not None
    except (ImportError, ValueError):  # a broken or hidden package counts as missing
        return False


def require(extra: str, what: str) -> None:
    """Raise MissingExtra, naming `what` needs it and how to add it, where `extra` is not installed."""
    if not available(extra):
        raise MissingExtra(extra, what)
