"""Figures: plots take data and an optional ax and return the ax; render makes their PNGs.

  plots.py   every figure of the lab, declarative (one seaborn theme, a colour-blind palette)
  render.py  Agg that keeps rendered glyphs: the same PNG bytes in half the time
The panels (fp8lab.lab.panels) show them; their in-place redraws are fp8lab.lab.redraw.
"""
