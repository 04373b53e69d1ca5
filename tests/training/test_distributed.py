"""fp8lab.training.distributed: 2 CPU processes (torchrun, gloo, FSDP2) against the single-process run.

Why the curves differ at all, measured here (torch 2.13 CPU, 2 ranks x 16 sequences, 8 steps):
- reduction order: gradients are summed as two partial GEMMs plus a reduce-scatter instead
  of one GEMM. In fp32 (recipe "fp32", no FP8) the losses differ by <= 5e-7.
- FP8 amplifies that: once weights differ in the last bit, some elements round to the
  neighbouring FP8 value, and the loss differences grow to ~1e-4..7e-4 by step 8
  (blockwise 7.1e-4, mxfp8 2.7e-4, rowwise 3.8e-4), though steps 0 and 1 still agree.
- per-rank amax: a per-tensor scale of activations / gradients comes from the rank's own
  half of the batch. Tensorwise differs by 1.5e-3 already at step 0; with amax_all_reduce
  steps 0 and 1 agree to <= 5e-7 (the scales, hence the FP8 codes, are the single run's).
- nvfp4's second-level per-tensor scale stays per rank (not reduced): 2.8e-4 at step 0.
Tolerances below are these measurements with a margin (x5 or more).
"""

import contextlib
import json
import os
import signal
import stat
import subprocess
import sys
import time
from datetime import timedelta
from pathlib import Path

import pytest
import torch
from torch import nn

import fp8lab.nn
from fp8lab.extras import available
from fp8lab.nn import FP8Linear, Monitor, scale_spans_tokens
from fp8lab.numerics.scaling import PerBlock, PerRow, PerTensor
from fp8lab.training.distributed import DistConfig, DistributedRunError, compare, main, run_distributed, run_single
from fp8lab.training.train import train

REPO = Path(__file__).resolve().parents[2]
FLOOR = 1e-5  # steps that must agree: measured <= 5e-7 (fp32 reduction-order noise)
CURVE = 5e-3  # the whole 8-step curve: measured <= 7.1e-4


def _alive(run_dir: str) -> list[int]:
    """Processes whose command line names run_dir (every worker's does)."""
    pids = []
    for proc in Path("/proc").iterdir():
        if proc.name.isdigit():
            try:
                if run_dir.encode() in (proc / "cmdline").read_bytes():
                    pids.append(int(proc.name))
            except OSError:
                pass
    return pids


# ---- the amax hook, in one process ---------------------------------------------------------------------------


def test_scale_spans_tokens():
    assert scale_spans_tokens("input", "fprop", PerTensor())
    assert scale_spans_tokens("grad_output", "wgrad", PerRow())
    assert not scale_spans_tokens("input", "fprop", PerRow())  # a row is one token
    assert not scale_spans_tokens("input", "wgrad", PerBlock(1, 128))  # a block of 128 tokens
    assert not scale_spans_tokens("weight", "fprop", PerTensor())  # whole on every rank under FSDP


@pytest.mark.parametrize("recipe, shapes", [
    ("tensorwise", [(1, 1), (1, 1)]),  # fprop input, dgrad grad_output (wgrad reuses both)
    ("rowwise", [(96, 1), (160, 1)]),  # wgrad only: dy^T[N, M] and x^T[K, M], one amax per row
    ("blockwise", []),
    ("mxfp8", []),
])
def test_amax_reducer_is_asked_where_a_scale_spans_tokens(recipe, shapes):
    calls = []
    layer = FP8Linear.from_linear(nn.Linear(160, 96), recipe, amax_reducer=lambda a: calls.append(a.shape) or a)
    layer(torch.randn(256, 160)).sum().backward()
    assert [tuple(s) for s in calls] == shapes


def test_reduced_amax_sets_the_scale_and_the_delayed_history():
    x = torch.randn(64, 160)
    monitor = Monitor()
    lin = nn.Linear(160, 96)
    layer = FP8Linear.from_linear(lin, "delayed", monitor=monitor, amax_reducer=lambda a: a * 4)
    layer(x).sum().backward()
    fp8lab.nn.end_step(layer)
    rows = monitor.frame().set_index(["gemm", "role"])["amax"]
    assert rows["fprop", "input"] == pytest.approx(4 * float(x.abs().max()))
    assert rows["fprop", "weight"] == pytest.approx(float(lin.weight.detach().abs().max()))  # weights are not reduced
    assert layer.histories["input"].history == [pytest.approx(4 * float(x.abs().max()))]


@pytest.mark.parametrize("recipe", ["tensorwise", "rowwise", "blockwise", "mxfp8", "delayed"])
def test_two_simulated_ranks_with_reduced_amax_equal_one_process(recipe):
    """Two halves of a batch, each quantized with the max amax of both halves (what the
    all-reduce gives), reproduce the whole batch's output and input gradient bit for bit,
    and its weight gradient up to the order of summation."""
    g = torch.Generator().manual_seed(3)
    lin = nn.Linear(160, 96)
    x = torch.randn(256, 160, generator=g)
    x[128:] *= 8  # the second rank's activations are larger
    gy = torch.randn(256, 96, generator=g)

    def run(rows, reducer):
        layer = FP8Linear.from_linear(nn.Linear(160, 96), recipe, amax_reducer=reducer)
        layer.weight, layer.bias = nn.Parameter(lin.weight.detach().clone()), nn.Parameter(lin.bias.detach().clone())
        xr = x[rows].clone().requires_grad_()
        out = layer(xr)
        out.backward(gy[rows])
        return out.detach(), xr.grad, layer.weight.grad

    halves = (slice(0, 128), slice(128, 256))
    local = ([], [])  # each rank's own amaxes, in call order (the same order on both ranks)
    for r in (0, 1):
        run(halves[r], lambda a, r=r: local[r].append(a) or a)

    def all_reduce_max():  # the k-th call gets the max of both ranks' k-th amax
        calls = iter(range(len(local[0])))

        def reduce(amax):
            k = next(calls)
            return torch.maximum(local[0][k], local[1][k])

        return reduce

    results = [run(halves[r], all_reduce_max()) for r in (0, 1)]
    full_out, full_dx, full_dw = run(slice(0, 256), None)
    for r in (0, 1):
        assert torch.equal(results[r][0], full_out[halves[r]])
        assert torch.equal(results[r][1], full_dx[halves[r]])
    # fp32 summation order: two partial sums over 128 tokens against one over 256
    torch.testing.assert_close(results[0][2] + results[1][2], full_dw, rtol=0, atol=1e-6 * full_dw.abs().max().item())


# ---- configuration and the single-process reference ---------------------------------------------------------


@pytest.mark.parametrize("kw, words", [
    ({"recipe": "nope"}, "tensorwise"),
    ({"batch": 33}, "split evenly"),
    ({"engine": "torchao", "recipe": "blockwise"}, "tensorwise, rowwise"),
    ({"engine": "torchao", "recipe": "tensorwise", "amax_all_reduce": True}, "engine 'fp8lab'"),
    ({"fail_rank": 2}, "fail_rank"),
    ({"device": "tpu"}, "cpu"),
])
def test_config_errors_name_the_valid_choices(kw, words):
    with pytest.raises(ValueError, match=words):
        DistConfig(**kw)


def test_a_config_is_passed_whole_or_built_from_its_fields():
    from fp8lab.training.distributed import config

    cfg = DistConfig("mxfp8", steps=4, seed=3)
    assert config(cfg) == cfg
    assert config(cfg, batch=64) == DistConfig("mxfp8", steps=4, seed=3, batch=64)
    assert config("mxfp8", steps=4, seed=3) == cfg
    assert config() == DistConfig()
    with pytest.raises(TypeError, match=r"unknown DistConfig field.*stepz.*valid: recipe, steps"):
        config("mxfp8", stepz=4)
    with pytest.raises(ValueError, match="split evenly"):  # the dataclass checks what config builds
        config(cfg, batch=33)


def test_the_command_line_is_the_dataclass():
    """One flag per DistConfig field, with its default; every value set on the command line
    arrives in the config (nothing is repeated by hand, so nothing can be forgotten)."""
    from dataclasses import fields

    from fp8lab.training.distributed import _config, _parser

    parser = _parser()
    dests = {a.dest: a for a in parser._actions}
    for f in fields(DistConfig):
        assert f.name in dests, f"no flag for DistConfig.{f.name}"
        assert dests[f.name].default == f.default, f.name
    argv = ["--recipe", "mxfp8", "--steps", "5", "--seed", "7", "--batch", "48", "--lr", "0.001", "--engine",
            "fp8lab", "--amax-all-reduce", "--sink-magnitude", "1000.0", "--nproc", "3", "--device", "cpu",
            "--fail-rank", "2", "--fail-step", "4", "--fail-mode", "hang"]
    assert _config(parser.parse_args(argv)) == DistConfig(
        "mxfp8", 5, 7, 48, 0.001, "fp8lab", True, 1000.0, 3, "cpu", 2, 4, "hang")
    worker = DistConfig("rowwise", steps=2, sink_magnitude=1e6)
    assert _config(parser.parse_args([*worker.args(), "--nproc", "2"])) == worker  # a worker's flags give it back


def test_tokens_one_block_spans():
    from fp8lab.training.distributed import _token_block

    # a rank must hold a multiple of these for its blocks to be the single-process run's blocks
    assert {r: _token_block(r) for r in ("tensorwise", "rowwise", "blockwise", "mxfp8", "nvfp4")} == {
        "tensorwise": 1, "rowwise": 1, "blockwise": 128, "mxfp8": 32, "nvfp4": 16}


def test_run_single_equals_train():
    """One training step function (fp8lab.training.train.train_step) behind both: the same losses, bit for bit,
    with the sink channels on (their weights held at zero by the model's projection)."""
    single = run_single("blockwise", steps=3, seed=1, device="cpu", sink_magnitude=1e6)
    ref = train(["blockwise"], model="transformer", steps=3, seed=1, batch=32, progress=False, monitor_every=None,
                sink_magnitude=1e6)
    assert single["loss"].tolist() == ref.history["loss"].tolist()
    assert run_single(DistConfig("blockwise", steps=3, seed=1, device="cpu", sink_magnitude=1e6, nproc=4,
                                 fail_rank=0))["loss"].tolist() == single["loss"].tolist()  # nproc, failures: n/a


# ---- two processes ------------------------------------------------------------------------------------------------


def test_cli_blockwise_on_two_processes_matches_one(tmp_path):
    """The command line, once: blockwise blocks (1x128 along the tokens in wgrad) never
    straddle ranks here (512 tokens per rank), so only the reduction order differs."""
    out = tmp_path / "losses.json"
    proc = subprocess.run(  # (timeout: a hang guard only)
        [sys.executable, "-m", "fp8lab.training.distributed", "--nproc", "2", "--recipe", "blockwise", "--steps", "8",
         "--device", "cpu", "--out", str(out)],
        cwd=REPO, capture_output=True, text=True, timeout=180,
        env={**os.environ, "PYTHONPATH": str(REPO)},
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "2 ranks, gloo on cpu" in proc.stdout and "step   8/8" in proc.stdout
    result = json.loads(out.read_text())
    assert result["step"] == list(range(8)) and result["world_size"] == 2
    single = run_single("blockwise", steps=8, device="cpu")["loss"].tolist()
    diffs = [abs(a - b) for a, b in zip(single, result["loss"], strict=True)]
    assert diffs[0] <= FLOOR, diffs  # the same weights: fp32 reduction-order noise only
    # after one step the weights carry that noise, which can move an element across an FP8
    # rounding boundary: measured 1.1e-5 on the 128-wide transformer (loss ~4.1)
    assert diffs[1] <= 1e-4, diffs
    assert max(diffs) <= CURVE, diffs


# The amax all-reduce (per-rank amaxes differ at step 0, all-reduced ones agree to fp32 rounding) is
# checked on notebook 07's own runs, which make that comparison: tests/notebook_checks.py.


def test_a_failing_rank_fails_the_run_quickly_and_leaves_out_as_it_was(tmp_path):
    out = tmp_path / "losses.json"
    out.write_text("the user's earlier results")
    with pytest.raises(DistributedRunError, match=r"root cause: rank 1.*injected failure") as err:
        run_distributed("tensorwise", steps=8, stream=None, fail_rank=1, fail_step=2, out=out)
    # (its failure ends the run, not the timeout: the message names the injected failure as the root cause)
    assert err.value.returncode != 0
    assert _alive(err.value.run_dir) == []
    assert not Path(err.value.run_dir).exists()
    assert out.read_text() == "the user's earlier results" and list(tmp_path.iterdir()) == [out]


HANG_TIMEOUT_S = 30


@pytest.mark.parametrize("process_groups", [True, False], ids=["posix", "without-process-groups"])
def test_a_hanging_rank_is_killed_at_the_timeout(monkeypatch, process_groups):
    """Without process groups (Windows has no os.killpg / os.setsid, nor SIGKILL) the launcher
    must still end every process: through the watchdog, then by pid."""
    if not process_groups:
        for name in ("killpg", "setsid"):
            monkeypatch.delattr(os, name)
        monkeypatch.delattr(signal, "SIGKILL")
    t0 = time.perf_counter()
    # the ranks start in ~4 s on a quiet machine and took over 8 s on a loaded CI machine: rank 1 hangs at its
    # first step, rank 0 waits for it, and the launcher ends both at the timeout
    with pytest.raises(DistributedRunError, match=rf"did not finish within timeout_s={HANG_TIMEOUT_S}") as err:
        run_distributed("tensorwise", steps=8, stream=None, fail_rank=1, fail_step=0, fail_mode="hang",
                        timeout_s=HANG_TIMEOUT_S)
    assert "rank 1: injected failure at step 0 (fail_mode 'hang')" in str(err.value)  # a hang, not a slow start
    # a hang guard: the timeout, then 5 s of SIGTERM grace (11 s without groups), with room for a loaded machine
    assert time.perf_counter() - t0 < HANG_TIMEOUT_S + 30
    time.sleep(0.5)
    assert _alive(err.value.run_dir) == []


def test_a_killed_notebook_kernel_leaves_no_run_behind(tmp_path):
    """A kernel killed (or restarted) mid-run: torchrun runs in a session of its own, so nothing
    signals it; the watchdog sees the kernel's end of its pipe close and ends the run, and the
    scratch folder goes too."""
    code = ("from fp8lab.training.distributed import run_distributed\n"
            "run_distributed('tensorwise', steps=8, stream=lambda line: print(line, flush=True), fail_rank=1,\n"
            "                fail_step=0, fail_mode='hang', timeout_s=300)\n")
    kernel = subprocess.Popen([sys.executable, "-c", code], cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                              text=True, env={**os.environ, "TMPDIR": str(tmp_path), "PYTHONPATH": str(REPO)})
    run_dirs: list[Path] = []
    try:
        deadline = time.monotonic() + 120
        for line in kernel.stdout:  # until rank 1 hangs (rank 0 then waits for it in a collective)
            if "injected failure" in line or time.monotonic() > deadline:
                break
        run_dirs = list(tmp_path.glob("fp8lab-dist-*"))
        assert len(run_dirs) == 1 and _alive(str(run_dirs[0])), "the run did not start"
        kernel.kill()  # SIGKILL, as a kernel restart ends a kernel: no cleanup of its own runs
        kernel.wait()
        deadline = time.monotonic() + 30  # the watchdog: SIGTERM, then SIGKILL after 5 s
        while (_alive(str(run_dirs[0])) or run_dirs[0].exists()) and time.monotonic() < deadline:
            time.sleep(0.2)
        assert _alive(str(run_dirs[0])) == [], "processes of the run outlived the kernel"
        assert not run_dirs[0].exists(), "the run's scratch folder outlived the kernel"
    finally:
        kernel.kill()
        for run_dir in run_dirs:  # whatever a failure above left running
            for pid in _alive(str(run_dir)):
                with contextlib.suppress(OSError):
                    os.kill(pid, signal.SIGKILL)


def test_the_worker_flag_outside_torchrun_says_what_to_run(monkeypatch, capsys):
    for name in ("RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT", "LOCAL_RANK"):
        monkeypatch.delenv(name, raising=False)
    assert main(["--worker"]) == 2
    err = capsys.readouterr().err
    assert "torchrun" in err and "RANK" in err and "python -m fp8lab distributed --nproc" in err
    assert "Traceback" not in err and "KeyError" not in err


@pytest.mark.parametrize("value", ["0", "-5", "nan", "inf", "soon"])
def test_the_timeout_must_be_a_positive_number_of_seconds(value, capsys):
    with pytest.raises(SystemExit) as exit_:
        main(["--timeout", value])
    assert exit_.value.code == 2
    err = capsys.readouterr().err
    assert "--timeout" in err and "positive" in err and "number of seconds" in err, err
    with pytest.raises(ValueError, match="positive, finite number of seconds"):
        run_distributed(steps=1, stream=None, timeout_s=float(value) if value != "soon" else -1.0)


@pytest.mark.parametrize("value", ["1e14", "1e10", str(31 * 86400)])
def test_a_timeout_beyond_thirty_days_is_refused_before_any_rank_starts(value, capsys):
    """A timeout beyond 30 days (--timeout 1e14) is refused before any rank starts: accepted, it kills every
    worker with OverflowError (the collectives' timedelta)."""
    with pytest.raises(SystemExit) as exit_:
        main(["--timeout", value])
    assert exit_.value.code == 2
    assert "up to 2592000 (30 days)" in capsys.readouterr().err
    with pytest.raises(ValueError, match=r"up to 2592000 \(30 days\)"):
        run_distributed(steps=1, stream=None, timeout_s=float(value))
    from fp8lab.training.distributed import MAX_TIMEOUT_S, check_timeout

    assert check_timeout(MAX_TIMEOUT_S) == MAX_TIMEOUT_S  # the limit itself is a valid timeout
    timedelta(seconds=MAX_TIMEOUT_S + 30)  # what the workers make of it


def test_out_is_written_through_a_private_temporary_never_a_planted_link(tmp_path):
    """--out is written through a temporary created anew under an unguessable name: a predictable one
    beside the file (.NAME.PID.tmp) follows a symlink planted there, so anyone who can write the folder
    could have the run overwrite another file of the user's."""
    from fp8lab.training.distributed import write_atomically

    victim = tmp_path / "victim.txt"
    victim.write_text("the user's other file")
    out = tmp_path / "losses.json"
    for pid in {os.getpid(), os.getppid()}:  # the predictable names a temporary could take
        (tmp_path / f".{out.name}.{pid}.tmp").symlink_to(victim)
    (tmp_path / f"{out.name}.tmp").symlink_to(victim)
    write_atomically(out, '{"loss": [1.0]}')
    assert victim.read_text() == "the user's other file"
    assert out.read_text() == '{"loss": [1.0]}' and not out.is_symlink()
    assert stat.S_IMODE(out.stat().st_mode) == 0o666 & ~_umask()
    leftovers = {p.name for p in tmp_path.iterdir()} - {"victim.txt", "losses.json"}
    assert all((tmp_path / name).is_symlink() for name in leftovers)  # only the planted links remain


def _umask() -> int:
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


def test_out_in_a_missing_folder_is_refused_before_the_run(tmp_path):
    with pytest.raises(ValueError, match="does not exist"):
        run_distributed(steps=1, stream=None, out=tmp_path / "no-such-folder" / "losses.json")


@pytest.mark.slow
def test_a_killed_rank_fails_the_run():
    with pytest.raises(DistributedRunError, match=r"rank 1.*Signal 9") as err:
        run_distributed("blockwise", steps=8, stream=None, fail_rank=1, fail_step=1, fail_mode="kill")
    assert _alive(err.value.run_dir) == []


@pytest.mark.slow
def test_fp32_reduction_order_floor():
    df = compare("fp32", steps=8, stream=None)
    assert df["abs_diff"].max() <= FLOOR, df  # measured <= 4.8e-7


@pytest.mark.slow
@pytest.mark.skipif(not available("torchao"), reason="torchao is not installed or cannot run beside this torch "
                    "(fp8lab[torchao] needs torch 2.11): make compat runs at torch 2.9")
def test_torchao_engine_trains_under_fsdp2():
    lines = []
    df = compare("rowwise", steps=4, engine="torchao", stream=lines.append)
    assert any("rowwise (torchao)" in line for line in lines)
    assert df["abs_diff"][:2].max() <= FLOOR and df["abs_diff"].max() <= CURVE, df
