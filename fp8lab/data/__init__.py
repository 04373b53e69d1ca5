"""Data generated in code or shipped with Python: nothing is downloaded.

  synthetic.py  tensors for notebooks 01-05: distributions, outlier channels, spikes over steps
  real.py       real data that ships with Python and scikit-learn: Python's own docs (text), digits (images)
"""
