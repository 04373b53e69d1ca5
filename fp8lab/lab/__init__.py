"""What the notebooks show: panels, predictions, the answer key, exercises, the doctor and the launcher.

  panels/         one ipywidgets panel file per notebook, on one Panel base class
  predictions.py  Prediction: commit to an answer, then reveal what the panels measure
  answers/        the answer key (notebooks/ANSWERS.md), computed from the panels, one module per part
  exercises/      check_*, hint_* and solution_* for the notebooks' exercises, one module per notebook
  doctor.py       what this machine runs real and emulated, and why (notebook 00)
  launcher.py     `python -m fp8lab lab`: JupyterLab with the lab's settings
  redraw.py       clear_data, kept_colorbar: a panel redrawn in place (its axes kept, its data drawn again)
"""
