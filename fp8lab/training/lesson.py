"""Notebook 06's lesson MLP at its fixed inputs: what the measured runs, the published ratios and the operand views
start from.

Public: lesson_model_and_batch(sinks, seed, placement) (the MLP at its initial weights with its task and train()'s
first batch), constant_loss(seed) (the lesson task's loss of predicting the mean: the line a failed run crosses).
"""

from __future__ import annotations

import functools

import torch

from fp8lab.training.models import TeacherTask, make_model
from fp8lab.training.train import LESSON

__all__ = ["constant_loss", "lesson_model_and_batch"]


def lesson_model_and_batch(sinks: float, seed: int, placement: str = "channels"):
    """The lesson MLP (LESSON, seed, sinks at `placement`) at its initial weights, its input batch x, target y, and
    its TeacherTask: x, y are train()'s first batch."""
    model = make_model("mlp", seed, sinks, placement=placement)
    task = TeacherTask(seed=seed)
    x, y = task.batch(torch.Generator().manual_seed(1_000 + seed), LESSON.batch)  # train()'s first batch
    return model, x, y, task


@functools.lru_cache(maxsize=32)
def constant_loss(seed: int = 0, steps: int | None = None, last: int = 10) -> float:
    """The lesson task's final loss for a model that ignores its input and predicts the mean target (0: the
    teacher y = W2 tanh(W1 x) is odd in x ~ N(0, 1)), on train()'s batches: the mean of its MSE over the last
    `last` of `steps` steps, as TrainResult.final_loss averages a run's. A run above it did worse than a constant."""
    steps = LESSON.steps if steps is None else steps
    task = TeacherTask(seed=seed)
    g = torch.Generator().manual_seed(1_000 + seed)  # the batches train() draws, in order
    losses = []
    for _ in range(steps):
        _, y = task.batch(g, LESSON.batch)
        losses.append(float(y.square().mean()))
    return sum(losses[-last:]) / len(losses[-last:])
