"""`python -m fp8lab bench train`: one training step per recipe against fp32 and bf16."""

from __future__ import annotations

import statistics

import torch

from fp8lab.bench.table import print_table
from fp8lab.timing import time_interleaved

__all__ = ["bench_train"]


def bench_train(size: int | None = None, rounds: int | None = None, consecutive: int = 4) -> list[dict]:
    """Step time of the toy MLP and transformer: fp32, bf16, fp8lab emulated, torchao emulate."""
    from fp8lab.training.convert import convert
    from fp8lab.training.models import MarkovTask, TeacherTask, make_model
    from fp8lab.training.monitor import Monitor
    from fp8lab.training.train import BASELINES, LESSON, train_step

    rounds = rounds or 20
    rows = []
    # the lab's two models, and the transformer at half its width (more emulation overhead)
    for kind, label_kind, kw in (("mlp", "mlp", {}), ("transformer", "transformer", {}),
                                 ("transformer", "transformer d=64", {"d": 64})):
        task = TeacherTask() if kind == "mlp" else MarkovTask()
        g = torch.Generator().manual_seed(0)
        x, y = task.batch(g, LESSON.batch if kind == "mlp" else 32)
        cands = {}
        for label in ("fp32", "bf16", "tensorwise", "rowwise", "blockwise", "mxfp8", "nvfp4",
                      "tensorwise + monitor every step", "tensorwise (torchao)"):
            base = make_model(kind, 0, **kw)
            autocast = label == "bf16"
            if label in BASELINES:
                model = base
            elif label.endswith("(torchao)"):
                try:
                    model = convert(base, "tensorwise", engine="torchao")
                except ImportError:
                    continue
            elif label.endswith("monitor every step"):
                model = convert(base, "tensorwise", monitor=Monitor(1))
            else:
                model = convert(base, label)
            opt = torch.optim.Adam(model.parameters(), lr=1e-3)

            def steps(model=model, opt=opt, autocast=autocast, task=task, x=x, y=y):
                for _ in range(consecutive):
                    train_step(model, opt, task.loss, x, y, autocast)

            cands[label] = steps
        # each sample is a few consecutive steps, as in a training loop (caches warm with this
        # model's tensors); the candidates take turns, so machine noise hits all of them alike
        times = time_interleaved(cands, rounds=rounds, warmup=2)
        base_t = statistics.median(times["fp32"])
        for label, ts in times.items():
            median = statistics.median(ts)
            rows.append({"model": label_kind, "what": label, "median ms/step": median / consecutive * 1e3,
                         "x fp32": median / base_t})
    print_table(f"training step time, Adam, MLP batch {LESSON.batch} / transformer batch 32 (median of {rounds} "
                f"samples of {consecutive} consecutive steps, candidates interleaved)", rows)
    return rows
