"""The toy transformer trained on several processes: FSDP2 under torchrun, FP8 linears from either engine.

Public: DistConfig (one run's settings, passed whole), config, run_single, run_distributed, compare,
DistributedRunError; the command
`python -m fp8lab distributed --nproc 2 --recipe blockwise --steps 20 [--engine torchao] [--out f.json]`.
Every rank builds the same global batch from the seed and keeps its slice; gradients and the
printed loss are averaged over ranks, so both are the single-process run's on that batch.
amax_all_reduce=True: scales that span the token dim use the max amax over ranks. Notebook 07.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import math
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import warnings
from collections import deque
from collections.abc import Callable
from dataclasses import asdict, dataclass, field, fields, replace
from datetime import timedelta
from pathlib import Path
from typing import get_args, get_type_hints

import torch

from fp8lab.extras import require
from fp8lab.numerics.recipes import GEMMS, RECIPES, TORCHAO_RECIPES, VARIANTS, get_recipe
from fp8lab.training import watchdog
from fp8lab.training.convert import ENGINES, convert
from fp8lab.training.layers import tokens_per_scale
from fp8lab.training.models import MarkovTask, make_model
from fp8lab.training.torchrun import (
    MAX_TIMEOUT_S,
    check_timeout,
    end_run,
    follow_output,
    free_port,
    own_process_group,
    root_cause,
    worker_env,
    write_atomically,
)
from fp8lab.training.train import LESSON, train_step

__all__ = ["DistConfig", "DistributedRunError", "compare", "config", "main", "run_distributed", "run_single"]

DEVICES = ("auto", "cpu", "cuda")
FAIL_MODES = ("raise", "kill", "hang")
TAIL_LINES = 40  # lines of output quoted in a DistributedRunError


class DistributedRunError(RuntimeError):
    """A distributed run failed or ran out of time.

    tail: its last lines of output; returncode: torchrun's exit code (None if it was killed
    before answering); run_dir: the run's scratch folder (removed by then), which appears
    in every worker's command line.
    """

    def __init__(self, message: str, tail: str = "", returncode: int | None = None, run_dir: str = "") -> None:
        super().__init__(f"{message}\n--- last lines of output ---\n{tail}" if tail else message)
        self.tail = tail
        self.returncode = returncode
        self.run_dir = run_dir


@dataclass(frozen=True)
class DistConfig:
    """One training run of fp8lab.training.models.TinyTransformer on MarkovTask.

    batch is the GLOBAL batch (sequences of 32 tokens): each of nproc ranks trains on
    batch // nproc of them. amax_all_reduce: scales covering the token dim (per-tensor
    activations and gradients, per-row scales of the wgrad GEMM) use the max amax over
    ranks (engine "fp8lab" only). fail_rank / fail_step / fail_mode inject a failure for tests:
    at that step, that rank raises ("raise"), dies from SIGKILL as if the kernel's OOM killer
    struck ("kill"), or stops answering ("hang").
    """

    # each field is also a flag of `python -m fp8lab distributed` (_parser reads help and choices here)
    recipe: str = field(default="blockwise", metadata={
        "help": f"one of {', '.join([*RECIPES, *VARIANTS])}, or fp32 (no FP8: the reduction-order floor)"})
    steps: int = 20
    seed: int = 0
    batch: int = field(default=32, metadata={"help": "global batch (sequences), split over ranks"})
    lr: float = LESSON.lr
    engine: str = field(default="fp8lab", metadata={"choices": ENGINES})
    amax_all_reduce: bool = field(default=False, metadata={
        "help": "scales that span the token dim use the max amax over ranks (engine fp8lab)"})
    sink_magnitude: float = 0.0
    nproc: int = field(default=2, metadata={"help": "processes (ranks)"})
    device: str = field(default="auto", metadata={"choices": DEVICES})
    fail_rank: int | None = field(default=None, metadata={"help": "testing: this rank fails ..."})
    fail_step: int = field(default=0, metadata={"help": "testing: ... at this step"})
    fail_mode: str = field(default="raise", metadata={"choices": FAIL_MODES})

    def __post_init__(self) -> None:
        names = (*RECIPES, *VARIANTS, "fp32")
        if not isinstance(self.recipe, str) or self.recipe not in names:
            raise ValueError(f"recipe must be a recipe name (processes are given names): one of {', '.join(names)}; "
                             f"got {self.recipe!r}")
        if self.engine not in ENGINES:
            raise ValueError(f"unknown engine {self.engine!r}; valid: {', '.join(ENGINES)}")
        if self.engine == "torchao" and self.recipe not in (*TORCHAO_RECIPES, "fp32"):
            raise ValueError(f"engine 'torchao' trains {', '.join(TORCHAO_RECIPES)}, not {self.recipe!r}; "
                             "use engine 'fp8lab' for it")
        if self.amax_all_reduce and self.engine != "fp8lab":
            raise ValueError("amax_all_reduce needs engine 'fp8lab': torchao computes activation scales per rank")
        if self.engine == "torchao":  # after the settings no installation could serve
            require("torchao", "engine 'torchao'")  # here, before any worker starts
        if self.steps < 1 or self.nproc < 1:
            raise ValueError("steps and nproc must be positive")
        if self.batch < self.nproc or self.batch % self.nproc:
            raise ValueError(f"the global batch ({self.batch}) must split evenly over nproc={self.nproc} ranks")
        if self.device not in DEVICES:
            raise ValueError(f"unknown device {self.device!r}; valid: {', '.join(DEVICES)}")
        if self.fail_mode not in FAIL_MODES:
            raise ValueError(f"unknown fail_mode {self.fail_mode!r}; valid: {', '.join(FAIL_MODES)}")
        if self.fail_rank is not None and not 0 <= self.fail_rank < self.nproc:
            raise ValueError(f"fail_rank must be in 0..{self.nproc - 1}, got {self.fail_rank}")

    def args(self) -> list[str]:
        """This config as flags of a worker of `python -m fp8lab distributed` (torchrun sets nproc).

        nproc is left out: torchrun's parser would read `--nproc` as an ambiguous
        abbreviation of its own --nproc-per-node, even after the module name.
        """
        out = []
        for f in fields(self):
            if f.name == "nproc":
                continue
            value = getattr(self, f.name)
            flag = "--" + f.name.replace("_", "-")
            if isinstance(value, bool):
                out += [flag] if value else []
            elif value is not None:
                out += [flag, str(value)]
        return out


# ---- the training loop (one process, or one rank) ---------------------------------------------------------


def _pick_device(device: str, nproc: int) -> torch.device:
    """cuda:LOCAL_RANK where every rank gets a GPU of its own ("auto", "cuda"), else the CPU."""
    gpus = torch.cuda.device_count()
    if device == "cpu" or (device == "auto" and gpus < nproc):
        return torch.device("cpu")
    if gpus < nproc:
        raise RuntimeError(f"device 'cuda' needs a GPU per rank: {nproc} rank(s), {gpus} GPU(s) visible")
    return torch.device("cuda", int(os.environ.get("LOCAL_RANK", 0)))


def _token_block(recipe: str) -> int:
    """How many tokens one scale block spans along M, the dim data parallelism splits (1: none);
    per scale, nn.tokens_per_scale says (scales spanning every token are amax_all_reduce's business)."""
    if recipe == "fp32":
        return 1
    r = get_recipe(recipe)
    spans = (tokens_per_scale(role, gemm, s.granularity) for gemm, roles in GEMMS.items() for role in roles
             if (s := r.scaling(role, gemm)) is not None)
    return max([1, *(n for n in spans if n)])


def _all_reduce_max(group) -> Callable[[torch.Tensor], torch.Tensor]:
    import torch.distributed as dist

    def reduce(amax: torch.Tensor) -> torch.Tensor:
        out = amax.clone()
        dist.all_reduce(out, op=dist.ReduceOp.MAX, group=group)
        return out

    return reduce


def _train(cfg: DistConfig, rank: int = 0, world: int = 1, device: torch.device | None = None,
           log: Callable[[str], object] | None = None) -> dict:
    """Train cfg's model on this rank's slice of each global batch; returns {"step": [...], "loss": [...]}.

    world > 1 needs an initialised process group: the model is sharded with FSDP2
    (fully_shard on each block, then the root), and the loss is averaged over ranks.
    """
    device = device or torch.device("cpu")
    reducer = None
    if world > 1:
        import torch.distributed as dist
        from torch.distributed.fsdp import fully_shard

        if cfg.amax_all_reduce:  # a group of its own, so amax reductions never interleave with FSDP's
            reducer = _all_reduce_max(dist.new_group(list(range(world))))
    task = MarkovTask(seed=cfg.seed)
    model = make_model("transformer", cfg.seed, cfg.sink_magnitude)
    if cfg.recipe != "fp32":
        model = convert(model, get_recipe(cfg.recipe), engine=cfg.engine, amax_reducer=reducer)
    model = model.to(device)
    if world > 1:
        for block in model.blocks:
            fully_shard(block)
        fully_shard(model)
    optimizer = torch.optim.Adam(model.parameters(), lr=cfg.lr)
    data = torch.Generator().manual_seed(1_000 + cfg.seed)  # as fp8lab.training.train.train
    per_rank = cfg.batch // world
    reduce_loss = None
    if world > 1:
        def reduce_loss(loss: torch.Tensor) -> float:  # the mean of equal-sized slices' means: the global batch's
            value = loss.clone()
            dist.all_reduce(value, op=dist.ReduceOp.SUM)
            return (value / world).item()

    steps, losses, messages = [], [], []
    t0 = time.perf_counter()
    for step in range(cfg.steps):
        x, y = task.batch(data, cfg.batch)  # the global batch, the same on every rank
        x, y = x[rank * per_rank:(rank + 1) * per_rank].to(device), y[rank * per_rank:(rank + 1) * per_rank].to(device)
        if cfg.fail_rank == rank and step == cfg.fail_step:
            _inject_failure(cfg.fail_mode, rank, step)
        # FSDP2 reduce-scatters the gradients (averaged over ranks) in backward; the sink-channel
        # weights are zeroed on each rank's shard (TinyTransformer.project)
        value = train_step(model, optimizer, task.loss, x, y, reduce_loss=reduce_loss)
        steps.append(step)
        losses.append(value)
        if not math.isfinite(value):  # every rank sees the same reduced value, so all stop together
            messages.append(f"stopped at step {step}: loss is {value}")
            break
        if log is not None:
            log(f"step {step + 1:>3}/{cfg.steps}  loss {value:.5f}")
    return {"step": steps, "loss": losses, "train_seconds": time.perf_counter() - t0, "messages": messages}


def _inject_failure(mode: str, rank: int, step: int) -> None:
    """DistConfig.fail_mode, for tests: raise, die from SIGKILL, or stop answering."""
    if mode == "raise":
        raise RuntimeError(f"injected failure: rank {rank} at step {step} (fail_rank/fail_step)")
    print(f"rank {rank}: injected failure at step {step} (fail_mode {mode!r})", flush=True)
    if mode == "kill":
        os.kill(os.getpid(), getattr(signal, "SIGKILL", signal.SIGTERM))  # (Windows: TerminateProcess)
    time.sleep(10**6)


def _frame(result: dict, **attrs):
    import pandas as pd

    df = pd.DataFrame({"step": result["step"], "loss": result["loss"]})
    df.attrs.update({k: v for k, v in result.items() if k not in ("step", "loss")}, **attrs)
    return df


def config(recipe: DistConfig | str | None = None, **changes) -> DistConfig:
    """A DistConfig: `recipe` itself (a DistConfig, or a recipe name for DistConfig(recipe)), with
    `changes` replacing its fields (DistConfig checks them; an unknown name is refused with the valid ones).

    run_single, run_distributed and compare take a DistConfig whole, or these same arguments:
    compare("tensorwise", steps=3) is compare(DistConfig("tensorwise", steps=3)).
    """
    names = [f.name for f in fields(DistConfig)]
    unknown = sorted(set(changes) - set(names))
    if unknown:
        raise TypeError(f"unknown DistConfig field(s) {', '.join(unknown)}; valid: {', '.join(names)}")
    if isinstance(recipe, DistConfig):
        return replace(recipe, **changes)
    return DistConfig(**({} if recipe is None else {"recipe": recipe}), **changes)


def run_single(cfg: DistConfig | str | None = None, **changes):
    """cfg's training in this process, on the whole global batch: DataFrame (step, loss).

    cfg: a DistConfig, or a recipe name and DistConfig fields (see `config`); nproc and the
    failure injection do not apply here. Equals fp8lab.training.train.train(recipes=[recipe],
    model="transformer", ...) on the CPU. df.attrs["train_seconds"] holds the loop's time.
    """
    cfg = replace(config(cfg, **changes), nproc=1, fail_rank=None)
    device = _pick_device(cfg.device, 1)
    return _frame(_train(cfg, device=device), nproc=1, device=str(device))


# ---- launching torchrun -------------------------------------------------------------------------------------


def run_distributed(cfg: DistConfig | str | None = None, *, timeout_s: float = 120.0,
                    stream: Callable[[str], object] | None = print, out: str | os.PathLike | None = None,
                    **changes):
    """Train cfg on cfg.nproc processes under torchrun; returns DataFrame (step, loss) of the global batch.

    cfg: a DistConfig, or a recipe name and DistConfig fields (see `config`).
    Each line the processes print is passed to `stream` as it comes (None: silent). Rank 0
    writes the losses as JSON; on success they are copied to `out` if given (whole, by a
    rename: a failed run leaves an existing `out` as it was). Raises DistributedRunError,
    quoting the last lines of output, if any rank fails (torchrun then stops the others) or the
    run takes longer than timeout_s (then torchrun and every rank are killed). torchrun runs
    under a watchdog (fp8lab/training/watchdog.py) that ends it, its ranks and their scratch folder if
    this process dies first (a notebook kernel killed or restarted). df.attrs holds
    wall_seconds (launch to exit), train_seconds (rank 0's loop), backend and device.
    """
    cfg = config(cfg, **changes)
    nproc = cfg.nproc
    timeout_s = check_timeout(timeout_s)
    out_file = Path(out) if out is not None else None
    if out_file is not None and not out_file.parent.is_dir():
        raise ValueError(f"out: the folder {out_file.parent} does not exist")
    run_dir = Path(tempfile.mkdtemp(prefix="fp8lab-dist-"))
    out_path = run_dir / "losses.json"
    tail: deque[str] = deque(maxlen=10 * TAIL_LINES)

    def error(message: str, returncode: int | None) -> DistributedRunError:
        return DistributedRunError(message, "\n".join(list(tail)[-TAIL_LINES:]), returncode, str(run_dir))

    t0 = time.perf_counter()
    proc = _start_watched(_torchrun_command(cfg, run_dir, out_path, timeout_s), run_dir)
    try:
        try:
            returncode = follow_output(proc, t0 + timeout_s, tail, stream)
        except TimeoutError:
            end_run(proc, run_dir)
            raise error(f"the {nproc}-process run did not finish within timeout_s={timeout_s:g} s; "
                        "torchrun and every rank were killed", None) from None
        except BaseException:  # e.g. KeyboardInterrupt in a notebook: leave nothing running
            end_run(proc, run_dir)
            raise
        wall = time.perf_counter() - t0
        if returncode != 0:
            end_run(proc, run_dir, grace_s=0)  # torchrun has stopped its workers; make sure
            cause = root_cause(list(tail))
            raise error(f"the {nproc}-process run failed (torchrun exit code {returncode})"
                        + (f"; root cause: {cause}" if cause else "")
                        + "; torchrun stopped the other ranks", returncode)
        if not out_path.exists():
            raise error(f"rank 0 wrote no losses to {out_path}", returncode)
        text = out_path.read_text()
        result = json.loads(text)
        if out_file is not None:
            write_atomically(out_file, text)
    finally:
        with contextlib.suppress(OSError, ValueError):
            proc.stdin.close()  # (the watchdog has exited by now; if not, this tells it to stop)
        shutil.rmtree(run_dir, ignore_errors=True)
    return _frame(result, wall_seconds=wall, nproc=nproc)


def _torchrun_command(cfg: DistConfig, run_dir: Path, out_path: Path, timeout_s: float) -> list[str]:
    """torchrun starting cfg.nproc workers of this module on one node, rank 0 writing to out_path."""
    return [
        sys.executable, "-m", "torch.distributed.run",
        "--nnodes", "1", "--nproc-per-node", str(cfg.nproc),
        "--master-addr", "127.0.0.1", "--master-port", str(free_port()),
        "--max-restarts", "0",
        "-m", "fp8lab.training.distributed", "--worker", "--run-dir", str(run_dir), "--out", str(out_path),
        # collectives time out after the wall clock: the launcher's kill comes first
        "--timeout", str(timeout_s + 30), *cfg.args(),
    ]


def _start_watched(cmd: list[str], run_dir: Path) -> subprocess.Popen:
    """cmd under the watchdog, in a process group of its own, its output one pipe of text lines."""
    # -I: the watchdog's folder must not shadow the standard library
    watched = [sys.executable, "-I", str(Path(watchdog.__file__)), str(run_dir), "--", *cmd]
    return subprocess.Popen(watched, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            text=True, encoding="utf-8", errors="replace", bufsize=1, env=worker_env(),
                            **own_process_group())


def compare(cfg: DistConfig | str | None = None, *, stream: Callable[[str], object] | None = print,
            timeout_s: float = 120.0, **changes):
    """run_single and run_distributed side by side: DataFrame (step, single, distributed, abs_diff).

    cfg: a DistConfig, or a recipe name and DistConfig fields (see `config`). Both run on the
    device the distributed run gets (a GPU per rank, else the CPU).
    """
    cfg = config(cfg, **changes)
    cfg = replace(cfg, device=_pick_device(cfg.device, cfg.nproc).type)
    single = run_single(cfg)
    dist_ = run_distributed(cfg, timeout_s=timeout_s, stream=stream)
    df = single.rename(columns={"loss": "single"}).merge(dist_.rename(columns={"loss": "distributed"}), on="step")
    df["abs_diff"] = (df["single"] - df["distributed"]).abs()
    df.attrs.update(single=single.attrs, distributed=dist_.attrs)
    return df


# ---- the command line: launcher, and the worker torchrun starts ---------------------------------------------


def _seconds(text: str) -> float:
    try:
        return check_timeout(text)
    except ValueError as err:
        raise argparse.ArgumentTypeError(str(err).removeprefix("timeout ")) from None


def _parser() -> argparse.ArgumentParser:
    """The command line: one flag per DistConfig field (its type, default, help and choices from
    the dataclass), then the launcher's own options."""
    p = argparse.ArgumentParser(
        prog="python -m fp8lab distributed",
        description="Train fp8lab's toy transformer with FSDP2 on several processes (torchrun; gloo on the "
                    "CPU, nccl on GPUs) and print the loss of each step.")
    hints = get_type_hints(DistConfig)
    for f in fields(DistConfig):
        flag, kind = "--" + f.name.replace("_", "-"), hints[f.name]
        help_ = f.metadata.get("help")
        if kind is bool:
            p.add_argument(flag, action="store_true", default=f.default, help=help_)
            continue
        types = [t for t in get_args(kind) if t is not type(None)] or [kind]  # int | None -> int
        p.add_argument(flag, type=types[0], default=f.default, choices=f.metadata.get("choices"), help=help_)
    p.add_argument("--out", help="write the losses (JSON) here")
    p.add_argument("--timeout", type=_seconds, default=120.0,
                   help=f"wall-clock limit in seconds (positive, up to {MAX_TIMEOUT_S:.0f})")
    p.add_argument("--compare", action="store_true", help="also train in this process and print both curves")
    p.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)  # set by the launcher for torchrun
    p.add_argument("--run-dir", help=argparse.SUPPRESS)
    return p


def _config(ns: argparse.Namespace) -> DistConfig:
    return DistConfig(**{f.name: getattr(ns, f.name) for f in fields(DistConfig)})


def _worker(ns: argparse.Namespace) -> int:
    """One rank, started by torchrun: join the group, train, and (rank 0) write the losses."""
    import torch.distributed as dist

    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    if ns.run_dir:  # so the launcher can kill this process even if torchrun cannot
        Path(ns.run_dir, f"pid.{rank}").write_text(str(os.getpid()))
    torch.set_num_threads(1)
    # TinyTransformer returns head(...)'s output, a reshaped view; nothing modifies it in place
    warnings.filterwarnings("ignore", message=r"FSDP2-wrapped module .* returned a view tensor")
    ns.nproc = world
    cfg = _config(ns)
    device = _pick_device(cfg.device, world)
    backend = "nccl" if device.type == "cuda" else "gloo"
    if device.type == "cuda":
        torch.cuda.set_device(device)
    dist.init_process_group(backend, timeout=timedelta(seconds=ns.timeout))
    try:
        log = (lambda line: print(line, flush=True)) if rank == 0 else None
        if rank == 0:
            tokens = cfg.batch // world * MarkovTask(seed=cfg.seed).seq
            print(f"{world} ranks, {backend} on {device.type}; recipe {cfg.recipe} ({cfg.engine}); global batch "
                  f"{cfg.batch} = {world} x {cfg.batch // world} sequences ({tokens} tokens per rank); "
                  f"amax_all_reduce={cfg.amax_all_reduce}", flush=True)
            block = _token_block(cfg.recipe)
            if tokens % block:
                print(f"note: {tokens} tokens per rank is not a multiple of the recipe's {block}-token blocks: "
                      "blocks at the edges differ from the single-process run's", flush=True)
        result = _train(cfg, rank, world, device, log)
        if rank == 0:
            result.update(config=asdict(cfg), backend=backend, device=device.type, world_size=world)
            if ns.out:
                write_atomically(Path(ns.out), json.dumps(result))  # whole or absent, never half-written
            print(f"done: {len(result['loss'])} steps in {result['train_seconds']:.2f} s, "
                  f"final loss {result['loss'][-1]:.5f}", flush=True)
        dist.barrier()
    finally:
        dist.destroy_process_group()
    return 0


def main(argv: list[str] | None = None) -> int:
    ns = _parser().parse_args(argv)
    if ns.worker:
        missing = [k for k in ("RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT") if k not in os.environ]
        if missing:
            verb = "is" if len(missing) == 1 else "are"
            print(f"error: --worker marks the processes torchrun starts, and {', '.join(missing)} (set by torchrun) "
                  f"{verb} missing here. To train on several processes, run the launcher: "
                  "python -m fp8lab distributed --nproc 2 --recipe blockwise", file=sys.stderr)
            return 2
    try:
        if ns.worker:
            from torch.distributed.elastic.multiprocessing.errors import record

            record(_worker)(ns)  # on an exception, torchrun's failure summary names it
            sys.stdout.flush()
            sys.stderr.flush()
            os._exit(0)  # all written and flushed: skip the interpreter's teardown, ~1 s with torch loaded
        cfg = _config(ns)
        df = run_distributed(cfg, timeout_s=ns.timeout, out=ns.out)
    except ValueError as err:
        print(f"error: {err}", file=sys.stderr)
        return 1
    except DistributedRunError as err:  # its output was printed as it came: the first line is news
        print(f"error: {str(err).splitlines()[0]}", file=sys.stderr)
        return 1
    print(f"{cfg.nproc} processes: {df.attrs['wall_seconds']:.1f} s from launch to exit "
          f"({df.attrs['train_seconds']:.1f} s training)")
    if ns.compare:
        single = run_single(cfg, device=df.attrs["device"])
        print(" step      single   distributed    |diff|")
        for step, a, b in zip(single["step"], single["loss"], df["loss"], strict=False):
            print(f"{step:>5}  {a:10.5f}  {b:12.5f}  {abs(a - b):8.2e}")
    if ns.out:
        print(f"losses written to {ns.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
