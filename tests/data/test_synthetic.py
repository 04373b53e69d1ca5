"""fp8lab.data.synthetic: seeded tensors with outliers where the docstring puts them."""

import pytest
import torch

from fp8lab.data.synthetic import DISTRIBUTIONS, OUTLIER_TOKENS, activation_stream, sample
from tests.defaults import OTHER_DEFAULTS, torch_defaults


def test_the_same_seed_gives_the_same_tensor_and_each_distribution_its_shape():
    for d in DISTRIBUTIONS:
        x = sample(d, (16, 32), seed=3)
        assert x.shape == (16, 32) and x.dtype == torch.float32
        assert torch.equal(x, sample(d, (16, 32), seed=3))
    assert not torch.equal(sample("normal", (16, 32), seed=3), sample("normal", (16, 32), seed=4))
    assert bool((sample("lognormal", (8, 8)) > 0).all())
    assert float(sample("uniform", (64, 64)).abs().max()) <= 1.0


def test_channel_outliers_multiply_exactly_the_named_columns():
    base = sample("normal", (32, 64), seed=1)
    x, idx = sample("normal", (32, 64), outliers=100.0, outlier_channels=3, seed=1, return_outliers=True)
    assert len(idx) == 3 and torch.equal(idx, idx.sort().values)
    others = torch.ones(64, dtype=torch.bool)
    others[idx] = False
    assert torch.equal(x[:, others], base[:, others])
    assert torch.equal(x[:, idx], base[:, idx] * 100.0)


def test_token_and_both_placements_return_a_mask_of_the_outliers():
    base = sample("normal", (16, 64), seed=2)
    x, mask = sample("normal", (16, 64), outliers=50.0, outlier_channels=4, seed=2, return_outliers=True,
                     placement="tokens")
    assert mask.dtype == torch.bool and mask.shape == (16, 64)
    assert int(mask.sum()) == 4 * OUTLIER_TOKENS and not mask[OUTLIER_TOKENS:].any()
    assert torch.equal(x[mask], base[mask] * 50.0) and torch.equal(x[~mask], base[~mask])
    y, both = sample("normal", (16, 64), outliers=50.0, outlier_channels=4, seed=2, return_outliers=True,
                     placement="both")
    assert int(both.sum()) == 4 * 16 + 4 * OUTLIER_TOKENS  # 4 whole channels, 4 channels in the first tokens
    assert torch.equal(y[both], base[both] * 50.0) and torch.equal(y[~both], base[~both])


def test_normalize_standardizes_each_channel_and_bad_arguments_are_refused():
    x = sample("channel scales", (128, 16), normalize=True)
    torch.testing.assert_close(x.mean(0), torch.zeros(16), atol=1e-5, rtol=0)
    torch.testing.assert_close(x.std(0), torch.ones(16), atol=1e-5, rtol=0)
    for kwargs in (dict(distribution="cauchy"), dict(outliers=-1.0), dict(placement="rows")):
        with pytest.raises(ValueError):
            sample(**kwargs)


def test_activation_stream_spikes_at_its_step_and_drifts():
    plain = activation_stream(5, (4, 8), spike_step=None, seed=0)
    spiked = activation_stream(5, (4, 8), spike_step=2, spike=20.0, seed=0)
    assert torch.equal(spiked[2], plain[2] * 20.0) and torch.equal(spiked[3], plain[3])
    drift = activation_stream(3, (4, 8), spike_step=None, drift=0.5, seed=0)
    torch.testing.assert_close(drift[2], plain[2] * 1.5**2, atol=0, rtol=1e-6)


@pytest.mark.parametrize(("dtype", "device"), OTHER_DEFAULTS, ids=str)
def test_every_tensor_is_the_seeds_float32_cpu_tensor_whatever_torchs_defaults(dtype, device):
    """A notebook that called torch.set_default_dtype or set_default_device still draws the notebook's numbers:
    every distribution, placement and stream gives the default's float32 CPU tensors, bit for bit."""

    def everything() -> list[torch.Tensor]:
        out = [sample(d, (16, 32), outliers=50.0, seed=5) for d in DISTRIBUTIONS]
        out += list(sample("normal", (16, 32), outliers=50.0, placement="both", seed=6, return_outliers=True))
        return out + activation_stream(steps=3, shape=(8, 16), spike_step=1, drift=0.1)

    want = everything()
    with torch_defaults(dtype, device):
        got = everything()
    assert all(a.dtype == b.dtype and a.device.type == "cpu" and torch.equal(a, b)
               for a, b in zip(got, want, strict=True))
