"""One notebook's Run All in a kernel started the way a learner starts it: what `bench load` and `bench room` time.

Public: START_WAYS, kernel_environment(start, tree), spec(...), run_in_subprocess(spec) -> dict, main().
A run happens in a process of its own (`python -m fp8lab.bench.kernelrun SPEC.json`), so that the
environment the kernel gets is exactly the one the spec names (this process's fp8lab has set its own
thread variables; the kernel must not inherit them unless the start way gives them). The time runs
from the kernel's start to the end of the last cell (kernel start included, as a learner waits for it);
after the last cell the kernel reports its peak memory, its CPU time and the threads it ran with.

The start ways (the kernel's environment and its first cells):
  lab          the environment `fp8lab lab` / `make lab` gives its Jupyter server, which its kernels inherit
  jupyter      a plain `jupyter lab` (nothing set); the notebook's first cell imports fp8lab first, as
               the hosted first cell does on Colab, Kaggle or a JupyterHub
  torch-first  as jupyter, with a cell `import torch` before the notebook's first: OpenMP has read its
               environment before fp8lab can set anything
A kernel can be placed in a cgroup (its cgroup.procs file) as it starts, and given extra cells to run
after the notebook's (the slider drag).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from fp8lab.bench.notebooks import PEAK_MB
from fp8lab.threads import MARKER

__all__ = ["START_WAYS", "kernel_environment", "main", "run_in_subprocess", "spec"]

START_WAYS = ("lab", "jupyter", "torch-first")
PROBE = PEAK_MB + """\
import json as _json, os as _os, resource as _resource, sys as _sys
_self, _kids = _resource.getrusage(_resource.RUSAGE_SELF), _resource.getrusage(_resource.RUSAGE_CHILDREN)
_t = _sys.modules.get("torch")
_line = ""
try:
    from fp8lab import threads as _threads
    _line = _threads.decision().line()
except ImportError:  # a --tree checkout from before the thread policy
    pass
print("PROBE", _json.dumps({"peak_mb": _peak_mb(), "cpu_s": _self.ru_utime + _self.ru_stime,
    "children_cpu_s": _kids.ru_utime + _kids.ru_stime, "torch_threads": _t.get_num_threads() if _t else None,
    "omp_wait_policy": _os.environ.get("OMP_WAIT_POLICY"), "omp_num_threads": _os.environ.get("OMP_NUM_THREADS"),
    "threads": _line}))
"""
# the kernel process writes its own pid into the cgroup, then becomes the kernel (same pid: exec)
ENTER_CGROUP = "import os, sys; open(sys.argv[1], 'w').write(str(os.getpid())); os.execv(sys.argv[2], sys.argv[2:])"


def _clean_environ() -> dict[str, str]:
    """os.environ as a learner's shell has it: without the variables this process's fp8lab set
    (named by FP8LAB_THREADS_SET) and without FP8LAB_SMOKE (workshop size)."""
    env = dict(os.environ)
    for name in filter(None, env.pop(MARKER, "").split(",")):
        env.pop(name, None)
    env.pop("FP8LAB_SMOKE", None)
    return env


def kernel_environment(start: str, tree: Path) -> dict[str, str]:
    """The environment a kernel started `start` gets, with the fp8lab of `tree` (a checkout) on PYTHONPATH.
    For "lab" it is what that tree's launcher gives its server (asked of the tree's own code)."""
    if start not in START_WAYS:
        raise ValueError(f"unknown start way {start!r}; valid: {', '.join(START_WAYS)}")
    env = _clean_environ()
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(tree), env.get("PYTHONPATH", "")) if p)
    if start == "lab":
        code = ("import json, sys; from fp8lab.lab.launcher import lab_environment; "
                "print(json.dumps(lab_environment('bench-token', json.loads(sys.stdin.read()))))")
        out = subprocess.run([sys.executable, "-c", code], input=json.dumps(env), env=env, capture_output=True,
                             text=True, timeout=300, check=True).stdout
        env = json.loads(out.strip().splitlines()[-1])
    return env


def spec(notebook: Path, start: str, tree: Path, cgroup_procs: str | None = None, after: str = "",
         timeout: float = 1800.0) -> dict:
    """What run_in_subprocess runs: the notebook, the kernel's environment and argv, cells to run after it."""
    return {"notebook": str(notebook), "start": start, "env": kernel_environment(start, tree),
            "cgroup_procs": cgroup_procs, "after": after, "timeout": timeout}


def run_in_subprocess(run: dict, wait: float | None = None) -> dict:
    """Run the spec in a process of its own; its result (see _run), or {"error": ...}."""
    proc = start_in_subprocess(run)
    return finish(proc, wait or run["timeout"] + 120)


def start_in_subprocess(run: dict) -> subprocess.Popen:
    """Start the runner for `run` and return at once (bench room starts several together)."""
    with tempfile.NamedTemporaryFile("w", suffix=".json", delete=False) as f:
        json.dump(run, f)
    runner_env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[2])}
    return subprocess.Popen([sys.executable, "-m", "fp8lab.bench.kernelrun", f.name], env=runner_env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def finish(proc: subprocess.Popen, wait: float) -> dict:
    try:
        out, err = proc.communicate(timeout=wait)
    except subprocess.TimeoutExpired:
        proc.kill()
        out, err = proc.communicate()
        return {"error": f"the run did not finish within {wait:.0f} s"}
    lines = [x for x in out.splitlines() if x.startswith("RESULT ")]
    if proc.returncode or not lines:
        return {"error": f"the runner exited {proc.returncode}: {(err or out)[-1500:]}"}
    return json.loads(lines[-1][len("RESULT "):])


def _kernel_spec_dir(cgroup_procs: str | None) -> str:
    """A kernelspec folder (for JUPYTER_PATH) whose python3 kernel is this Python's ipykernel, as
    Jupyter's own native kernel, entered into the cgroup first where one is given."""
    folder = Path(tempfile.mkdtemp(prefix="fp8lab-kernels-"))
    argv = [sys.executable, "-m", "ipykernel_launcher", "-f", "{connection_file}"]
    if cgroup_procs:
        argv = [sys.executable, "-c", ENTER_CGROUP, cgroup_procs, *argv]
    (folder / "kernels" / "python3").mkdir(parents=True)
    (folder / "kernels" / "python3" / "kernel.json").write_text(json.dumps(
        {"argv": argv, "display_name": "Python 3 (fp8lab bench)", "language": "python"}))
    return str(folder)


def _printed(cell, tag: str) -> dict | None:
    text = "".join(o.get("text", "") for o in cell.outputs if o.get("output_type") == "stream")
    line = next((x for x in text.splitlines() if x.startswith(tag + " ")), None)
    return None if line is None else json.loads(line[len(tag) + 1:])


def _run(run: dict) -> dict:
    """The run itself, in the runner process: Run All timed from the kernel's start; then the probe and
    the `after` cells in the same kernel."""
    import nbformat
    from nbclient import NotebookClient

    path = Path(run["notebook"])
    nb = nbformat.read(path, as_version=4)
    if run["start"] == "torch-first":
        first = next(i for i, c in enumerate(nb.cells) if c.cell_type == "code")
        nb.cells.insert(first, nbformat.v4.new_code_cell("import torch  # before fp8lab: OpenMP is loaded now"))
    own = len(nb.cells)
    os.environ["JUPYTER_PATH"] = _kernel_spec_dir(run["cgroup_procs"])
    client = NotebookClient(nb, timeout=run["timeout"], kernel_name="python3",
                            resources={"metadata": {"path": str(path.parent)}})
    t0 = time.perf_counter()
    with client.setup_kernel(env=run["env"]):
        started = time.perf_counter() - t0
        for index in range(own):
            client.execute_cell(nb.cells[index], index)
        seconds = time.perf_counter() - t0
        errors = [f"{o.get('ename')}: {o.get('evalue')}" for c in nb.cells for o in c.get("outputs", [])
                  if o.get("output_type") == "error"]
        probe = nbformat.v4.new_code_cell(PROBE)
        nb.cells.append(probe)
        client.execute_cell(probe, len(nb.cells) - 1)
        result = {"notebook": path.stem, "start": run["start"], "run_all_s": seconds, "kernel_start_s": started,
                  "errors": errors, **(_printed(probe, "PROBE") or {})}
        if run["after"]:
            after = nbformat.v4.new_code_cell(run["after"])
            nb.cells.append(after)
            client.execute_cell(after, len(nb.cells) - 1)
            result["after"] = _printed(after, "AFTER")
            if result["after"] is None:
                said = "".join(str(o.get("evalue", o.get("text", ""))) for o in after.outputs)
                result["errors"].append(f"the cells after the notebook printed nothing: {said[-800:]}")
    return result


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if len(argv) != 1:
        print("usage: python -m fp8lab.bench.kernelrun SPEC.json (written by fp8lab.bench.kernelrun.spec)",
              file=sys.stderr)
        return 2
    run = json.loads(Path(argv[0]).read_text())
    Path(argv[0]).unlink(missing_ok=True)
    print("RESULT " + json.dumps(_run(run)), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
