"""Notebook 01's panels: the bits of one code (BitsPanel) and the formats' number lines (NumberLinePanel).

Public: BitsPanel, NumberLinePanel. Wiring only: the numbers come from fp8lab's functions.
"""


from __future__ import annotations

import math
from typing import ClassVar

import ipywidgets as W

from fp8lab.figures import plots
from fp8lab.lab.panels.base import (
    Panel,
    dropdown,
    metrics_html,
)
from fp8lab.numerics.anatomy import anatomy, rounding
from fp8lab.numerics.formats import FORMATS, get_format

__all__ = ["BitsPanel", "NumberLinePanel"]


class BitsPanel(Panel):
    """Click the bits of a code and see its value; type a value and see its code. As
    float.exposed does: the bits grouped and coloured by field, the neighbouring values, the
    gap (ulp) and relative step at the value, and what rounding did to a typed value."""

    title = "bits -> value (click a bit) and value -> bits (type a number)"
    height = 1.8
    FIELD_STYLE: ClassVar[dict[str, str]] = {"sign": "danger", "exponent": "info", "mantissa": "success"}

    def __init__(self, fmt: str = "e4m3") -> None:
        self.bits = [W.ToggleButton(value=False, description="0", layout=W.Layout(width="34px")) for _ in range(8)]
        super().__init__(
            fmt=dropdown(("e4m3", "e5m2", "e2m1", "e8m0"), fmt, "format"),
            code=W.BoundedIntText(value=0x38, min=0, max=255, description="code (0-255)"),
            value=W.FloatText(value=1.0, description="type a value"),
        )
        for i, b in enumerate(self.bits):
            b.observe(lambda change, i=i: self._on_bit(i, change), names="value")
        self.bit_row = W.HBox([])
        self._grouped_for: str | None = None
        self.widget.children = (self.widget.children[0], self.widget.children[1], self.bit_row,
                                *self.widget.children[2:])
        self._sync = False

    def _group_bits(self, fmt_name: str) -> None:
        """Lay the toggles out in labelled groups, one colour per field (sign, exponent, mantissa)."""
        if self._grouped_for == fmt_name:
            return
        f = get_format(fmt_name)
        groups, i = [], 0
        for field_name, n in (("sign", int(f.signed)), ("exponent", f.exponent_bits), ("mantissa", f.mantissa_bits)):
            if n == 0:
                continue
            for b in self.bits[i:i + n]:
                b.button_style = self.FIELD_STYLE[field_name]
                b.tooltip = field_name
            label = W.HTML(f"<span style='font-size:11px'>{field_name} ({n})</span>")
            groups.append(W.VBox([label, W.HBox(self.bits[i:i + n])], layout=W.Layout(margin="0 10px 0 0")))
            i += n
        self.bit_row.children = tuple(groups)
        self._grouped_for = fmt_name

    def _on_bit(self, i: int, change) -> None:
        if self._sync:
            return
        fmt = get_format(self.controls["fmt"].value)
        code = sum(1 << (fmt.bits - 1 - j) for j, b in enumerate(self.bits[: fmt.bits]) if b.value)
        self.update(code=code)

    def update(self, **values) -> dict:
        if "value" in values and "code" not in values:  # a typed value selects its rounded code
            fmt = get_format(values.get("fmt", self.controls["fmt"].value))
            try:
                values["code"] = fmt.encode(values["value"])
            except ValueError:  # e.g. a NaN typed into a format without NaN
                pass
        return super().update(**values)

    def _on_change(self, change) -> None:
        if self._busy:
            return
        if change["owner"] is self.controls["value"]:
            self.update(value=change["new"])
        else:
            self.refresh()

    def compute(self, fmt: str, code: int, value: float) -> dict:
        f = get_format(fmt)
        code = code % (2**f.bits)
        a = anatomy(f, code)
        fields = a.fields
        v = a.value
        m, e, bias = f.mantissa_bits, fields["exponent"], f.bias
        if math.isnan(v) or math.isinf(v):
            formula = "special code"
        elif e == 0 and f.has_subnormals:
            formula = f"(-1)^{fields['sign']} x 2^(1-{bias}) x {fields['mantissa']}/{2**m}   (subnormal)"
        else:
            formula = f"(-1)^{fields['sign']} x 2^({e}-{bias}) x (1 + {fields['mantissa']}/{2**m})"
        return {"fmt": f.name, "code": code, "bits": format(code, f"0{f.bits}b"), "fields": fields, "value": v,
                "formula": formula, "typed": value, "anatomy": a, "rounding": rounding(f, value)}

    def refresh(self) -> dict:
        data = super().refresh()
        if "bits" in data:  # show the code on the toggles (and only the format's bits)
            self._sync = True
            try:
                self._group_bits(data["fmt"])
                for j, b in enumerate(self.bits):
                    if j < len(data["bits"]):
                        b.value = data["bits"][j] == "1"
                        b.description = data["bits"][j]
            finally:
                self._sync = False
            if self.controls["code"].value != data["code"]:
                self._busy = True
                self.controls["code"].value = data["code"]
                self._busy = False
        return data

    @staticmethod
    def _mark(data) -> float | None:
        v = data["value"]
        return abs(v) if math.isfinite(v) and v != 0 else None

    def draw(self, data, ax) -> None:
        f = get_format(data["fmt"])
        lo = math.floor(math.log2(f.min_subnormal)) - 1
        hi = math.ceil(math.log2(f.max_value)) + 1
        mark = self._mark(data)
        plots.number_line([f], ax, lo=lo, hi=hi, mark=mark)
        self._drawn = (data["fmt"], ax.lines[0], ax.get_legend()) if mark is not None else None

    def draw_in_place(self, data) -> bool:
        """The same format, a value marked before and now: the marked value's line and its legend entry move (as
        number_line draws them); the number line and its axes stay."""
        moving = self._drawn
        mark = self._mark(data)
        if moving is None or mark is None or moving[0] != data["fmt"]:
            return False
        _, line, legend = moving
        line.set_xdata([math.log2(mark)] * 2)
        line.set_label(f"{mark:g}")
        legend.get_texts()[0].set_text(f"{mark:g}")
        return True

    def describe(self, data) -> str:
        f = get_format(data["fmt"])
        a, r = data["anatomy"], data["rounding"]
        b = data["bits"]
        s = 1 if f.signed else 0
        colored = (f"<span style='color:#d55e00'>{b[:s]}</span> " if s else "") + \
            f"<span style='color:#0072b2'>{b[s:s + f.exponent_bits]}</span> " + \
            f"<span style='color:#009e73'>{b[s + f.exponent_bits:]}</span>"

        def num(v):
            return "none (the end of the format)" if v is None else f"{v:.6g}"

        rows = {"value": f"{data['value']:.6g}", "formula": data["formula"],
                "code": f"{data['code']} (0x{data['code']:02X})",
                "neighbours (below, above)": f"{num(a.below)}, {num(a.above)}"}
        if a.gap is not None:
            rows["gap to the next value (ulp)"] = f"{a.gap:.6g}"
        if a.relative_step is not None:
            kind = "subnormal: fewer significant bits" if a.subnormal else f"2^-{f.mantissa_bits} at a binade's start"
            rows["relative step (gap / |value|)"] = f"{100 * a.relative_step:.3g}%  ({kind})"
        rows[f"typed {r.typed:g} ->"] = (
            f"{r.rounded:.6g}: {r.status}" + ("" if r.status in ("exact", "NaN") else
                                              f", error {r.error:+.3g} ({100 * r.relative_error:.3g}%)"))
        return metrics_html(rows) + \
            f"<div style='font-family:monospace;font-size:18px'>{colored}</div>"


class NumberLinePanel(Panel):
    """Where each format's values sit: dense near 1, sparse at the ends, and how far they reach."""

    title = "number lines: E4M3 vs E5M2 vs bf16 (and FP4, fp16)"
    height = 2.6
    keep_axes = True

    def __init__(self) -> None:
        super().__init__(
            formats=W.SelectMultiple(options=["e4m3", "e5m2", "e2m1", "bf16", "fp16"], value=["e4m3", "e5m2", "bf16"],
                                     description="formats", rows=5),
            window=W.IntRangeSlider(value=(-17, 17), min=-30, max=30, description="log2 range"),
        )

    def compute(self, formats, window) -> dict:
        if not formats:
            raise ValueError("pick at least one format")
        rows = {f: {"max": FORMATS[f].max_value, "min subnormal": FORMATS[f].min_subnormal,
                    "binades": FORMATS[f].dynamic_range_binades,
                    "values in range": int(((FORMATS[f].values() > 0) & (FORMATS[f].values() >= 2.0 ** window[0])
                                            & (FORMATS[f].values() <= 2.0 ** window[1])).sum())}
                for f in formats}
        return {"formats": list(formats), "window": window, "rows": rows}

    def draw(self, data, ax) -> None:
        plots.number_line(data["formats"], ax, lo=data["window"][0], hi=data["window"][1])

    def describe(self, data) -> str:
        return metrics_html({f: f"max {r['max']:g}, smallest {r['min subnormal']:g}, {r['binades']:.1f} binades"
                              for f, r in data["rows"].items()})
