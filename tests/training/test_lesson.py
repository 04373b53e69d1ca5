"""fp8lab.training.lesson: notebook 06's MLP at its initial weights with train()'s first batch, and the loss of
predicting the mean."""

import torch

from fp8lab.training.lesson import constant_loss, lesson_model_and_batch
from fp8lab.training.models import make_model
from fp8lab.training.train import LESSON, train


def test_the_model_and_batch_are_what_train_starts_from():
    """train()'s first fp32 loss is the lesson model's MSE on the lesson batch, bit for bit."""
    model, x, y, task = lesson_model_and_batch(0.0, seed=1)
    assert x.shape == (LESSON.batch, 256) and y.shape == (LESSON.batch, 8)
    with torch.no_grad():
        want = float(task.loss(model(x), y))
    res = train("fp32", seed=1, steps=1, sink_magnitude=0.0, progress=False, monitor_every=None)
    assert res.final_loss()["fp32"] == want


def test_seed_sinks_and_placement_reach_the_model_and_the_same_arguments_give_the_same_start():
    a_model, a_x, a_y, _ = lesson_model_and_batch(1e6, seed=2, placement="tokens")
    b_model, b_x, b_y, _ = lesson_model_and_batch(1e6, seed=2, placement="tokens")
    assert torch.equal(a_x, b_x) and torch.equal(a_y, b_y)
    ref = make_model("mlp", 2, 1e6, placement="tokens").state_dict()
    for name, p in a_model.state_dict().items():
        assert torch.equal(p, ref[name]) and torch.equal(p, b_model.state_dict()[name]), name
    assert a_model.sink.magnitude == 1e6 and a_model.sink.placement == "tokens"
    assert lesson_model_and_batch(0.0, seed=2)[0].sink.placement == "channels"  # the default placement
    _, other_x, _, _ = lesson_model_and_batch(1e6, seed=3)
    assert not torch.equal(other_x, a_x)


def test_the_constant_loss_is_the_mean_targets_mse_over_the_last_steps():
    """Predicting 0 (the targets' mean) on train()'s batches: the mean MSE over the last `last` of `steps`."""
    _, _, y0, task = lesson_model_and_batch(0.0, seed=0)
    g = torch.Generator().manual_seed(1_000)
    ys = [task.batch(g, LESSON.batch)[1] for _ in range(5)]
    assert torch.equal(ys[0], y0)
    want = sum(float(y.square().mean()) for y in ys[3:]) / 2
    assert constant_loss(0, steps=5, last=2) == want
    assert constant_loss(0, steps=5, last=2) != constant_loss(1, steps=5, last=2)
    assert constant_loss(0) == constant_loss(0, LESSON.steps, 10)
