"""Figures: plots take data and an optional ax and return the ax; render draws them, png encodes them.

  axes.py    the theme, a figure and its PNG, axes that stay legible and put while sliders move
  plots.py   every figure of the lab, declarative (one seaborn theme, a colour-blind palette)
  gemms.py   a linear layer's GEMMs: one activation as two GEMMs quantize it; rowwise's mismatch (notebooks 05, 06)
  scales.py  where scales land: NVFP4's block scales against E4M3's range and floors (04); a weight's two copies (06)
  fp4.py     the gradient side and the 4-bit recipe's parts (notebook 09)
  fp4_parts.py each backward part at work: sums, small updates, the transform by contrast, depth (09)
  render.py  Agg that keeps rendered glyphs and the background: the same pixels in half the time
  png.py     the PNG of those pixels, compressing only the bands of rows a change touched
The panels (fp8lab.lab.panels) show them; their in-place redraws are fp8lab.lab.redraw.
"""
