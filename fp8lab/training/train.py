"""Recipes trained side by side: the one training step, the loop, the lesson's settings and sweeps.

Public: train (several recipes from the same weights on the same batches), TrainResult,
train_step (the one training step every caller uses), BASELINES, LESSON (notebook 06's
settings), block_size_recipes, delayed_recipes, compare_real_emulated, lesson_table,
cliff_sweep and history_sweep (the runs behind notebook 06's sink cliff and exercises, shipped
in fp8lab.training.measured), steps_to_recover, history_in_a_loop (what a delayed layer's history
records in a training loop: notebook 03). The models and tasks are fp8lab.training.models.
"""

from __future__ import annotations

import copy
import math
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace

import torch
from torch import nn

from fp8lab.data.synthetic import FLOAT32_CPU
from fp8lab.gemm import GemmBackend, default_backend
from fp8lab.numerics.recipes import RECIPES, ROLES, DelayedSpec, Recipe, TensorScaling, get_recipe
from fp8lab.numerics.scaling import PerBlock
from fp8lab.progress import progress_bar
from fp8lab.training.convert import convert
from fp8lab.training.delayed import end_step
from fp8lab.training.models import MODELS, MarkovTask, TeacherTask, make_model
from fp8lab.training.monitor import Monitor

__all__ = [
    "BASELINES",
    "CLIFF_RUNS",
    "CLIFF_SINKS",
    "HISTORIES",
    "LESSON",
    "TrainResult",
    "block_size_recipes",
    "cliff_sweep",
    "compare_real_emulated",
    "delayed_recipes",
    "history_sweep",
    "steps_to_recover",
    "train",
    "train_step",
]

BASELINES = ("fp32", "bf16")  # high-precision references trained beside the FP8 recipes


# ---- the documented settings ---------------------------------------------------------------------


@dataclass(frozen=True)
class Lesson:
    """The settings of notebook 06 and tests/notebooks/test_lessons.py (measured numbers: README).

    MLP 256 -> 1024 -> 1024 -> 8, Adam 2e-3, batch 128, 150 steps, teacher task.
    sink_magnitude: 4 adjacent hidden channels set to 1e6 after fc1, in every token (fc2 ignores them).
    gain_drop: fc1's input shrinks 1e5-fold at step 75 (fp32 does not notice).
    """

    steps: int = 150
    batch: int = 128
    lr: float = 2e-3
    sink_magnitude: float = 1e6
    gain_drop: float = 1e-5
    gain_drop_step: int = 75
    short_history: int = 4
    long_history: int = 256

    def gain_schedule(self, step: int) -> float:
        """Input gain: 1 before gain_drop_step, gain_drop after."""
        return 1.0 if step < self.gain_drop_step else self.gain_drop


LESSON = Lesson()


def block_size_recipes(cols: Sequence[int] = (32, 128, 512)) -> list[Recipe]:
    """DeepSeek-style blockwise recipes whose activation and gradient tiles are 1 x cols."""
    base = RECIPES["blockwise"]
    return [base.replace(name=f"blockwise 1x{c}", input=TensorScaling(base.input.fmt, PerBlock(1, c)),
                         grad_output=TensorScaling(base.grad_output.fmt, PerBlock(1, c))) for c in cols]


def delayed_recipes(lengths: Sequence[int] = (LESSON.short_history, LESSON.long_history),
                    algo: str = "max", margin: int = 0) -> list[Recipe]:
    """The delayed recipe with amax histories of these lengths (and this margin on every role:
    scale = amax_used * 2**margin / fmt.max_value). Named "delayed h{n}" ("... m{margin}" if any)."""
    base = RECIPES["delayed"]
    roles = {role: replace(getattr(base, role), margin=margin) for role in ROLES} if margin else {}
    suffix = f" m{margin}" if margin else ""
    return [base.replace(name=f"delayed h{n}{suffix}", delayed=DelayedSpec(n, algo), **roles) for n in lengths]


# ---- training ------------------------------------------------------------------------------------


@dataclass
class Run:
    label: str
    model: nn.Module
    optimizer: torch.optim.Optimizer
    recipe: Recipe | None
    monitor: Monitor | None
    autocast: bool = False
    stopped: str = ""
    backend: GemmBackend | None = None  # fp8lab FP8 runs: counts which backend each GEMM used


@dataclass
class TrainResult:
    """history: tidy DataFrame (step, run, loss); monitor: per-layer statistics; messages;
    backends: which backend ran each run's GEMMs (run, gemm, backend, reason, calls), kept up to
    date as the runs go (backend_lines() says it in words); announced: the lines train() printed
    after each run's first step (which GEMMs run real or emulated, and why)."""

    history: object
    monitor: object
    messages: list[str] = field(default_factory=list)
    seconds: float = 0.0
    backends: object = None
    announced: list[str] = field(default_factory=list)

    def backend_lines(self) -> list[str]:
        """One line per run and backend: which GEMMs ran real or emulated, and why."""
        return _backend_lines(self.backends)

    def final_loss(self, last: int = 10):
        """Mean loss of each run over its last `last` recorded steps (NaN-stopped runs: inf)."""
        import pandas as pd

        out = {}
        for run, df in self.history.groupby("run", sort=False):
            vals = df["loss"].tail(last)
            out[run] = float(vals.mean()) if vals.notna().all() and len(vals) else math.inf
        return pd.Series(out, name="final loss")


def train_step(model: nn.Module, optimizer: torch.optim.Optimizer, loss_fn: Callable, x: torch.Tensor,
               y: torch.Tensor, autocast: bool = False,
               reduce_loss: Callable[[torch.Tensor], float] | None = None) -> float:
    """One training step, the same everywhere in fp8lab (train, compare_real_emulated, the
    benchmarks, the GPU check, fp8lab.training.distributed, the capstone): forward (bf16 autocast if
    asked), loss_fn(output, y), backward, step, and the toy models' projection (sink-channel
    weights held at zero). Returns the loss; a non-finite loss is returned without stepping,
    so the caller decides what to do.
    reduce_loss(loss) -> the value returned and checked (None: loss.item()); data-parallel
    ranks pass the mean over ranks, so that every rank sees the same value and all stop together."""
    with torch.autocast(x.device.type, dtype=torch.bfloat16, enabled=autocast):
        loss = loss_fn(model(x).float(), y)
    value = loss.item() if reduce_loss is None else reduce_loss(loss.detach())
    if not math.isfinite(value):
        return value
    optimizer.zero_grad(set_to_none=True)
    loss.backward()
    optimizer.step()
    if hasattr(model, "project"):
        model.project()
    return value


def _make_runs(recipes: Sequence[str | Recipe], base: nn.Module, lr: float, engine: str, backend: str | GemmBackend,
               monitor_every: int | None, keep_first_last: bool, skip: Sequence[str] | None) -> list[Run]:
    runs = []
    for r in recipes:
        if r in BASELINES:
            model = copy.deepcopy(base)
            runs.append(Run(r, model, torch.optim.Adam(model.parameters(), lr=lr), None, None, autocast=r == "bf16"))
            continue
        recipe = get_recipe(r)
        monitor = Monitor(monitor_every) if monitor_every else None
        gemms = default_backend(backend).fresh() if engine == "fp8lab" else None  # this run's own counts
        model = convert(base, recipe, engine=engine, backend=gemms if gemms is not None else "auto",
                        monitor=monitor if engine == "fp8lab" else None, keep_first_last=keep_first_last, skip=skip)
        label = recipe.name if engine == "fp8lab" else f"{recipe.name} (torchao)"
        runs.append(Run(label, model, torch.optim.Adam(model.parameters(), lr=lr), recipe, monitor, backend=gemms))
    labels = [run.label for run in runs]
    if len(set(labels)) != len(labels):
        raise ValueError(f"each recipe once, please: got {labels}")
    return runs


def train(
    recipes: Sequence[str | Recipe] = ("fp32", "tensorwise", "blockwise", "mxfp8"),
    model: str = "mlp",
    steps: int = LESSON.steps,
    seed: int = 0,
    sink_magnitude: float = 0.0,
    placement: str = "channels",
    batch: int | None = None,
    lr: float = LESSON.lr,
    gain_schedule: Callable[[int], float] | None = None,
    callback: Callable[[TrainResult, int], bool | None] | None = None,
    every: int = 10,
    monitor_every: int | None = 10,
    engine: str = "fp8lab",
    backend: str | GemmBackend = "auto",
    keep_first_last: bool = False,
    skip: Sequence[str] | None = None,
    progress: bool = True,
    should_stop: Callable[[], bool] | None = None,
    device: torch.device | str | None = None,
    announce: bool | None = None,
) -> TrainResult:
    """Train one model per recipe, side by side, from the same weights on the same batches.

    recipes: FP8 recipe names (RECIPES, VARIANTS) and/or baselines "fp32", "bf16" (a single
            name or Recipe trains that one).
    sink_magnitude / placement: the sinks' value and where they sit (fp8lab.training.models.PLACEMENTS:
            every token's sink channels, a few tokens' ones, or both).
    batch: default 128 samples for the mlp, 32 sequences (1024 tokens) for the transformer.
    gain_schedule: step -> input gain (ToyMLP only): a mid-run change of activation size.
    keep_first_last / skip: linears kept in high precision (see fp8lab.nn.convert).
    callback(result_so_far, step) runs every `every` steps (live plots); returning False,
    or should_stop() returning True, ends training early. A run whose loss turns NaN/inf
    stops with a message; the others continue. Returns a TrainResult.
    device: where the models train (None: the GPU if there is one, else the CPU); backend:
    "auto" (real FP8 GEMMs where the GPU has the kernel), "emulated", or a GemmBackend.
    TrainResult.backends says which backend each run's GEMMs used; announce: print it once per
    run, after the run's first step, one line per backend (which GEMMs ran real, emulated or fell
    back, and why; kept in TrainResult.announced). None: where GEMMs can run real (on a GPU, or
    with a GemmBackend acting as one); on the CPU everything is emulated, and doctor says why.
    """
    import pandas as pd

    batch = _checked(recipes, model, steps, batch, gain_schedule)
    recipes = (recipes,) if isinstance(recipes, str | Recipe) else recipes  # one recipe, not its letters
    device = torch.device(device if device is not None else ("cuda" if torch.cuda.is_available() else "cpu"))
    if announce is None:
        announce = device.type == "cuda" or (isinstance(backend, GemmBackend) and backend.arch is not None)
    base = make_model(model, seed, sink_magnitude, placement=placement).to(device)
    task = TeacherTask(seed=seed) if model == "mlp" else MarkovTask(seed=seed)
    runs = _make_runs(recipes, base, lr, engine, backend, monitor_every, keep_first_last, skip)
    rows: list[dict] = []
    result = TrainResult(pd.DataFrame(columns=["step", "run", "loss"]), None, [])
    data = torch.Generator().manual_seed(1_000 + seed)
    bar = progress_bar(total=steps, desc=f"{model}: {', '.join(r.label for r in runs)}") if progress else None
    t0 = time.perf_counter()
    for step in range(steps):
        x, y = task.batch(data, batch)  # one batch, shared by every run (drawn on the CPU: same on any device)
        gain = gain_schedule(step) if gain_schedule is not None else None
        _step_every_run(runs, task, x.to(device), y.to(device), step, gain, rows, result.messages)
        if step == 0:  # every run's three GEMMs have run once: say where, once per run
            result.backends = _backend_frame(runs)
            result.announced = _backend_lines(result.backends)
            if announce:
                for line in result.announced:
                    print(f"fp8lab: {line}")
        if bar is not None:
            bar.update(1)
        if (callback is not None and (step + 1) % every == 0) or step == steps - 1:
            _snapshot(result, runs, rows, t0)
            if callback is not None and callback(result, step) is False:
                result.messages.append(f"stopped by the callback at step {step}")
                break
        if should_stop is not None and should_stop():
            result.messages.append(f"stopped at step {step}")
            break
        if all(run.stopped for run in runs):
            break
    if bar is not None:
        bar.close()
    return _snapshot(result, runs, rows, t0)


def _checked(recipes, model: str, steps: int, batch: int | None, gain_schedule) -> int:
    """train's arguments checked; returns the batch size (the model's default where None)."""
    if model not in MODELS:
        raise ValueError(f"unknown model {model!r}; valid: {', '.join(MODELS)}")
    if batch is None:  # the transformer's batch holds 32 tokens per sequence
        batch = LESSON.batch if model == "mlp" else LESSON.batch // 4
    if steps < 1 or batch < 1:
        raise ValueError("steps and batch must be positive")
    if gain_schedule is not None and model != "mlp":
        raise ValueError("gain_schedule needs the mlp (its fc1 carries the gain)")
    return batch


def _step_every_run(runs: list[Run], task, x: torch.Tensor, y: torch.Tensor, step: int, gain: float | None,
                    rows: list[dict], messages: list[str]) -> None:
    """One training step of every run still going, on the same batch; a run whose loss is not finite
    stops, with a message, and the others go on."""
    for run in runs:
        if run.stopped:
            continue
        if run.monitor is not None:
            run.monitor.step = step
        if gain is not None:
            run.model.gain = gain
        value = train_step(run.model, run.optimizer, task.loss, x, y, run.autocast)
        if not math.isfinite(value):
            run.stopped = f"{run.label} stopped at step {step}: loss is {value} (the other runs go on)"
            messages.append(run.stopped)
            value = math.nan
        rows.append({"step": step, "run": run.label, "loss": value})


def _snapshot(result: TrainResult, runs: list[Run], rows: list[dict], t0: float) -> TrainResult:
    """The result so far: its history, monitors, backends and time."""
    import pandas as pd

    result.history = pd.DataFrame(rows, columns=["step", "run", "loss"])
    result.monitor = _monitor_frame(runs)
    result.backends = _backend_frame(runs)
    result.seconds = time.perf_counter() - t0
    return result


def _backend_lines(backends) -> list[str]:
    """One line per run and backend of a backends frame (run, gemm, backend, reason, calls)."""
    if backends is None or len(backends) == 0:
        return []
    lines = []
    for (run, backend, reason), df in backends.groupby(["run", "backend", "reason"], sort=False):
        gemms = "/".join(dict.fromkeys(df["gemm"]))
        lines.append(f"{run}: {gemms} {reason.split(': ', 1)[0] if backend != 'fallback' else 'FELL BACK'} "
                     f"({reason.split(': ', 1)[-1]}; {int(df['calls'].sum())} GEMMs)")
    return lines


def _backend_frame(runs: list[Run]):
    import pandas as pd

    rows = [{"run": run.label, **r} for run in runs if run.backend is not None for r in run.backend.report()]
    cols = ["run", "gemm", "backend", "reason", "calls"]
    if not rows:
        return pd.DataFrame(columns=cols)
    return pd.DataFrame(rows).groupby(cols[:-1], sort=False, as_index=False)["calls"].sum()


def _monitor_frame(runs: list[Run]):
    import pandas as pd

    frames = []
    for run in runs:
        if run.monitor is not None and run.monitor.rows:
            df = run.monitor.frame()
            df.insert(0, "run", run.label)
            frames.append(df)
    if not frames:
        return pd.DataFrame(columns=["run", "step", "layer", "gemm", "role", "amax", "scale_max", "scale_min",
                                     "overflow", "underflow"])
    return pd.concat(frames, ignore_index=True)


# ---- on a GPU: real vs emulated -------------------------------------------------------------------------------------


def compare_real_emulated(steps: int = 200, device: torch.device | str = "cuda",
                          recipes: Sequence[str] = ("tensorwise", "rowwise", "blockwise", "mxfp8", "nvfp4"),
                          backend: GemmBackend | None = None) -> list[dict]:
    """Train the toy MLP with real and with emulated FP8 GEMMs, side by side: per recipe the
    final losses, the largest loss difference, and which backend ran its GEMMs (fallbacks: GEMMs
    that should have run real, failed and were emulated). backend: default_backend("auto")."""
    real = train(recipes, steps=steps, device=device, backend=backend or "auto", progress=False,
                 monitor_every=None)
    emulated = train(recipes, steps=steps, device=device, backend="emulated", progress=False, monitor_every=None)
    rows = []
    for name in recipes:
        a = real.history[real.history["run"] == name]["loss"].to_numpy()
        b = emulated.history[emulated.history["run"] == name]["loss"].to_numpy()
        used = real.backends[real.backends["run"] == name]
        calls = {k: int(used[used["backend"] == k]["calls"].sum()) for k in ("scaled_mm", "emulated", "fallback")}
        rows.append({"recipe": name, "steps": steps, "final loss real": float(a[-1]),
                     "final loss emulated": float(b[-1]), "max |loss diff|": float(abs(a - b).max()),
                     "real GEMMs": calls["scaled_mm"], "emulated GEMMs": calls["emulated"],
                     "fallbacks": calls["fallback"]})
    return rows


# ---- the lesson table --------------------------------------------------------------------------------


def lesson_table(seeds: Sequence[int] = (0, 1, 2)):
    """Final losses (mean of the last 10 steps) of every FP8 recipe without and with the sink
    channels, and the delayed-scaling drift run: the numbers behind notebook 06 and the README."""
    import pandas as pd

    recipes = ("fp32", "tensorwise", "rowwise", "blockwise", "mxfp8", "nvfp4", *block_size_recipes((32, 512)))
    rows = []
    for seed in seeds:
        for magnitude in (0.0, LESSON.sink_magnitude):
            res = train(recipes, seed=seed, sink_magnitude=magnitude, progress=False, monitor_every=None)
            for run, loss in res.final_loss().items():
                rows.append({"seed": seed, "sinks": magnitude, "run": run, "final loss": loss})
        short, long = delayed_recipes()
        res = train(("tensorwise", short, long), seed=seed, gain_schedule=LESSON.gain_schedule, progress=False,
                    monitor_every=None)
        for run, loss in res.final_loss().items():
            rows.append({"seed": seed, "sinks": "input shrinks 1e5x at step 75", "run": run, "final loss": loss})
    df = pd.DataFrame(rows)
    table = df.pivot_table(index="run", columns="sinks", values="final loss", aggfunc="mean", sort=False)
    print(table.to_string(float_format=lambda v: f"{v:.4f}"))
    return df


# ---- the sweeps behind notebook 06's cliff and exercises (shipped in fp8lab.training.measured) ----------------

CLIFF_SINKS = (0.0, 1e1, 1e2, 1e3, 1e4, 1e5, 1e6, 1e7)
CLIFF_RUNS = ("fp32", "tensorwise", "delayed", "rowwise", "blockwise", "mxfp8", "nvfp4")
HISTORIES = (1, 2, 4, 8, 16, 32, 64, 128, 256)


def cliff_sweep(sinks: Sequence[float] = CLIFF_SINKS, seeds: Sequence[int] = (0, 1, 2),
                runs: Sequence[str] = CLIFF_RUNS, steps: int = LESSON.steps, short: int = 30,
                placement: str = "channels"):
    """Final loss against sink magnitude, per recipe (LESSON settings, the sinks at `placement`): one row per
    seed, sink magnitude and run, with `loss` (mean of the last 10 of `steps` steps) and `loss_short`
    (mean of steps short-10 .. short-1: what a `short`-step run ends at, since a run's first
    steps do not depend on how many follow)."""
    import pandas as pd

    rows = []
    for seed in seeds:
        for magnitude in sinks:
            res = train(runs, steps=steps, seed=seed, sink_magnitude=magnitude, placement=placement, progress=False,
                        monitor_every=None)
            early = TrainResult(res.history[res.history.step < short], None).final_loss()
            for run, loss in res.final_loss().items():
                rows.append({"seed": seed, "sinks": magnitude, "run": run, "loss": loss,
                             "loss_short": early[run]})
    return pd.DataFrame(rows)


def history_sweep(lengths: Sequence[int] = HISTORIES, seed: int = 0, margin: int = 0):
    """fc1's input underflow (fprop, every step) of the delayed recipe with each amax history
    length when fc1's input shrinks at LESSON.gain_drop_step: columns history, step, underflow."""
    res = train(delayed_recipes(lengths, margin=margin), seed=seed, gain_schedule=LESSON.gain_schedule,
                progress=False, monitor_every=1)
    m = res.monitor
    m = m[(m.layer == "fc1") & (m.role == "input") & (m.gemm == "fprop")]
    df = m[["run", "step", "underflow"]].copy()
    df.insert(0, "history", [int(r.split()[1][1:]) for r in df.pop("run")])
    return df.reset_index(drop=True)


def steps_to_recover(underflow_by_step, drop_step: int = LESSON.gain_drop_step, threshold: float = 0.01) -> int | None:
    """Steps after `drop_step` until underflow stays below `threshold` to the end (None: never).

    underflow_by_step: a pandas Series indexed by step."""
    after = underflow_by_step[underflow_by_step.index >= drop_step]
    bad = after[after >= threshold]
    if len(bad) == 0:
        return 0
    last_bad = int(bad.index.max())
    return None if last_bad >= int(after.index.max()) else last_bad + 1 - drop_step


def history_in_a_loop(steps: int = 6, micro_batches: int = 2, nan_step: int | None = 3, seed: int = 0):
    """What an FP8 layer's delayed-scaling history records in a training loop (notebook 03), step by step.

    A delayed-scaling layer trains `steps` optimizer steps of `micro_batches` micro-batches each; after
    each step's micro-batches an evaluation forward runs on a batch 100x larger in magnitude (under
    no_grad); on `nan_step` the first micro-batch holds a NaN: its loss is NaN, so that step takes no
    optimizer step (as a loss scaler skips it) and ends by fp8lab.nn.end_step. Returns a DataFrame, one
    row per step: the input amax of each micro-batch, the evaluation batch's amax, the amax the step's
    input scale came from, the history's length and its largest entry after the step, and the step's
    loss (the mean over its micro-batches).
    """
    import pandas as pd

    g = torch.Generator().manual_seed(seed)
    torch.manual_seed(seed)
    layer = convert(nn.Linear(16, 8), "delayed", backend="emulated")
    opt = torch.optim.SGD(layer.parameters(), lr=0.05)
    history = layer.histories["input"]
    rows = []
    for step in range(steps):
        scaled_with = history.amax()
        losses, amaxes = [], []
        for micro in range(micro_batches):
            x = torch.randn(32, 16, generator=g, **FLOAT32_CPU) * (1 + step / 2)
            if step == nan_step and micro == 0:
                x[0, 0] = math.nan
            amaxes.append(float(x.abs().max()))
            loss = layer(x).square().mean()
            losses.append(float(loss.detach()))
            if math.isfinite(losses[-1]):
                loss.backward()
        evaluation = torch.randn(32, 16, generator=g, **FLOAT32_CPU) * 100
        with torch.no_grad():
            layer(evaluation)
        if all(math.isfinite(v) for v in losses):
            opt.step()
        else:
            end_step(layer)
        opt.zero_grad()
        rows.append({"step": step, **{f"amax, micro-batch {i + 1}": a for i, a in enumerate(amaxes)},
                     "evaluation amax": float(evaluation.abs().max()),
                     "scaled with": amaxes[0] if scaled_with is None else scaled_with,
                     "history entries": len(history), "history max": history.amax(),
                     "loss": sum(losses) / len(losses)})
    return pd.DataFrame(rows).set_index("step")
