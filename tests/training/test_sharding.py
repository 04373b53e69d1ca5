"""fp8lab.training.sharding: an FP8 all-gather is the unsharded cast, code for code, only when the ranks agree
on the amax."""

from __future__ import annotations

import pytest
import torch

from fp8lab.numerics.formats import E4M3
from fp8lab.training.sharding import all_gather_fp8, all_gather_table, example_weight


def test_agreeing_ranks_send_the_unsharded_codes_with_one_scale():
    w = example_weight(64, 32)
    r = all_gather_fp8(w, 4, agree=True)
    expected = float(w.abs().max()) / E4M3.max_value  # per tensor: scale = amax / 448
    assert r.ranks == 4 and r.agree
    assert len(r.scales) == 4 and all(s == pytest.approx(expected, rel=1e-6) for s in r.scales)
    assert r.same_codes
    assert r.error < 0.1


def test_ranks_with_their_own_amax_send_other_codes_and_read_them_wrongly_with_one_scale():
    w = example_weight(64, 32)
    own = all_gather_fp8(w, 8, agree=False)
    agreed = all_gather_fp8(w, 8, agree=True)
    shard_amax = [float(s.abs().max()) / E4M3.max_value for s in w.chunk(8)]
    assert list(own.scales) == pytest.approx(shard_amax, rel=1e-6)
    assert not own.same_codes
    assert own.error > 10 * agreed.error  # rank 0's scale read over shards 8x larger
    one = all_gather_fp8(w, 1, agree=False)  # one rank: nothing to agree on
    assert one.same_codes and one.error == agreed.error


def test_the_example_weight_is_seeded_and_its_last_eighth_is_largest():
    w = example_weight(64, 16, seed=3)
    assert torch.equal(w, example_weight(64, 16, seed=3))
    assert float(w[56:].abs().max()) > float(w[:56].abs().max())


def test_ranks_must_divide_the_rows():
    with pytest.raises(ValueError, match="divide"):
        all_gather_fp8(torch.ones(6, 4), 4, agree=True)
    with pytest.raises(ValueError):
        all_gather_fp8(torch.ones(6, 4), 0, agree=True)


def test_the_table_counts_distinct_scales():
    t = all_gather_table(example_weight(64, 16), ranks=(1, 4))
    assert list(t["ranks"]) == [1, 1, 4, 4]
    assert list(t["distinct scales"]) == [1, 1, 1, 4]
    assert list(t["codes as one process casts them"]) == [True, True, True, False]
