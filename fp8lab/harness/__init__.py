"""The harness: what the project uses to measure and maintain itself, kept apart from what a learner imports.

  answers/        the answer key (notebooks/ANSWERS.md): every question under a widget, answered from the panels
                  (`python -m fp8lab answers [--write]`)
  measure.py      notebook 06's shipped runs measured again (`python -m fp8lab measured --write`)
  measure_fp4.py  notebook 09's shipped runs trained again (`python -m fp8lab measured_fp4 --write`)
  tables.py       writing the runs' data files, fp8lab/training/runs/*.json (fp8lab.training.shipped reads them)
fp8lab.bench, the benchmarks and their process control (CPU quotas, cgroups, rooms, thread counts), is the
harness's other folder, at the same layer. Nothing in fp8lab.lab, training or below imports the harness.
"""
