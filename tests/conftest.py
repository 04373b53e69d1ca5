import os
import shutil

import pytest
import torch
from hypothesis import HealthCheck, settings

settings.register_profile(
    "fp8lab", deadline=None, max_examples=60, suppress_health_check=[HealthCheck.too_slow], derandomize=True
)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "fp8lab"))

torch.set_num_threads(min(2, torch.get_num_threads()))
# the kernels' tests split tensors of tens of thousands of elements over threads (the same bits for any split): the
# threshold a passive OpenMP wait would raise to a million elements stays where they split (kernels.parallel_min)
os.environ.setdefault("FP8LAB_PARALLEL_MIN", "32768")


def has_fp8_gpu() -> bool:
    return torch.cuda.is_available() and torch.cuda.get_device_capability() >= (8, 9)


gpu = pytest.mark.skipif(not has_fp8_gpu(), reason="needs a CUDA GPU with compute capability >= 8.9")


# tests/notebooks/test_notebooks.py runs each notebook by nbclient twice: at workshop size and in smoke mode
NBCLIENT_RUNS = ("test_runs_at_workshop_size_under_1_5_gb_with_its_claims", "test_runs_top_to_bottom_in_smoke_mode")
BROWSER_RUN = "test_notebook_in_the_browser"  # tests/notebooks/test_browser.py, one per notebook


# Tests whose numbers move with the machine: training runs and sums whose last bits follow the thread
# count and the CPU's instruction set. They check claims, and numbers within tolerances measured
# across such settings (each states its own); `make test-machines` runs them again under two other
# machines' settings. Matched against each test's node id.
MACHINE_SENSITIVE = (
    "tests/notebooks/test_lessons.py::",
    "tests/notebooks/test_fp4_lessons.py::",
    "tests/harness/answers/test_answers.py::test_the_committed_key_is_what_the_panels_say_now",
    "tests/harness/answers/test_answers.py::test_every_claim_holds",
    "tests/lab/test_widgets.py::test_the_sink_cliff_recomputes_a_shipped_point_live",
    "tests/notebooks/test_explanations.py::test_the_flush_costs_measured_now_are_the_shipped_ones",
    "tests/training/test_distributed.py::test_cli_blockwise_on_two_processes_matches_one",
    "tests/training/test_distributed.py::test_fp32_reduction_order_floor",
    *(f"tests/notebooks/test_notebooks.py::test_runs_at_workshop_size_under_1_5_gb_with_its_claims[{nb}"
      for nb in ("06", "07", "08")),
)


def pytest_itemcollected(item):  # as each test is collected, before -m selects
    if item.nodeid.startswith(MACHINE_SENSITIVE):
        item.add_marker(pytest.mark.machine)


@pytest.hookimpl(trylast=True)  # after -m and -k have deselected theirs
def pytest_collection_modifyitems(config, items):
    """Each notebook runs once per `make test`, the way a learner runs it. The browser test runs
    every notebook top to bottom at workshop size in JupyterLab, with the workshop run's checks
    (under 1.5 GB, the notebook's own claims: tests/notebook_checks.py) and its
    widgets dragged, so where it runs a notebook, test_notebooks' nbclient runs of the same notebook
    (workshop size, and smoke mode: the CI shortcut) are deselected, and the summary says so. With
    -m "not browser" (make test BROWSER=0), or without chromium, the nbclient runs stay."""
    if shutil.which("chromium") is None:
        return
    in_browser = {item.callspec.id for item in items
                  if item.originalname == BROWSER_RUN and hasattr(item, "callspec")}
    repeated = [item for item in items if item.originalname in NBCLIENT_RUNS and item.callspec.id in in_browser]
    if repeated:
        config.hook.pytest_deselected(items=repeated)
        items[:] = [item for item in items if item not in repeated]
        config._fp8lab_nbclient_left_to_browser = len(repeated)


def pytest_terminal_summary(terminalreporter, exitstatus, config):
    n = getattr(config, "_fp8lab_nbclient_left_to_browser", 0)
    if n:
        terminalreporter.write_line(f"fp8lab: {n} nbclient notebook runs left to the browser test, which runs the same "
                                    "notebooks at workshop size with the same checks (deselected here; "
                                    "-m 'not browser' runs them)")


@pytest.fixture(scope="module", params=["kernels", "torch"])
def both_paths(request):
    """The module's tests run twice: on the C kernels (where built) and on the torch code, the
    definition (which the kernels' tests compare them with, but which these formulas pin)."""
    from fp8lab.numerics import kernels

    if request.param == "torch":
        with kernels.disabled():
            yield request.param
    elif not kernels.engine().kernels:
        pytest.skip(f"kernels not built here: {kernels.status()[1]}")
    else:
        yield request.param
