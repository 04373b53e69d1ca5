"""fp8lab.training.published: the published ratios, placed on the lesson's cliffs (sink values, outlier multipliers)."""

from __future__ import annotations

import math

import pytest
import torch

from fp8lab.data.synthetic import sample
from fp8lab.training.published import (
    PUBLISHED,
    SOURCES,
    Published,
    lesson_fc2_input,
    lesson_median,
    marker_sinks,
    measured_at,
    outlier_multiplier,
    read_published,
    sinks_for,
)


def test_the_data_file_loads_every_source_field_for_field_in_order():
    """sources/published.json read into Published values equal to each source's words, link and ratio."""
    assert PUBLISHED == (
        Published("LLM.int8(): up to 20x", "Dettmers et al. 2022, LLM.int8(), section 1",
                  "https://arxiv.org/abs/2208.07339",
                  "large features with magnitudes up to 20x larger than in other dimensions", 20.0,
                  "the other feature dimensions", "channels"),
        Published("SmoothQuant: ~100x", "Xiao et al. 2023, SmoothQuant, section 3", "https://arxiv.org/abs/2211.10438",
                  "The scale of outliers in activations is ~100\u00d7 larger than most of the activation values.",
                  100.0,
                  "most of the activation values", "channels"),
        Published("massive activations: e.g. 100,000x", "Sun et al. 2024, Massive Activations in Large Language "
                  "Models, abstract", "https://arxiv.org/abs/2402.17762",
                  "very few activations exhibit significantly larger values than others (e.g., 100,000 times larger)",
                  1e5, "the other activations", "tokens"),
    )
    assert all(type(p.ratio) is float for p in PUBLISHED)
    assert read_published(SOURCES / "published.json") == PUBLISHED


def test_a_data_file_with_an_unknown_field_is_refused(tmp_path):
    path = tmp_path / "published.json"
    path.write_text('[{"label": "x", "source": "s", "url": "u", "quote": "q", "ratio": 2.0, "against": "a", '
                    '"placement": "channels", "year": 2024}]', encoding="utf-8")
    with pytest.raises(TypeError, match="year"):
        read_published(path)


def test_the_sources_ratios_and_where_they_measured():
    assert [(p.ratio, p.placement) for p in PUBLISHED] == [(20.0, "channels"), (100.0, "channels"), (1e5, "tokens")]
    assert all(p.url.startswith("https://arxiv.org/abs/") for p in PUBLISHED)


def test_measured_at_places_a_source_on_its_own_cliff_and_on_both():
    int8, _, massive = PUBLISHED
    assert measured_at(int8, None) and measured_at(int8, "both") and measured_at(int8, "channels")
    assert not measured_at(int8, "tokens") and measured_at(massive, "tokens")
    assert set(marker_sinks("tokens")) == {massive.label}
    assert len(marker_sinks("both")) == len(PUBLISHED)


def test_fc2s_input_holds_the_sinks_and_its_median_is_the_ratios_denominator():
    h, idx = lesson_fc2_input(123.0, seed=0)
    assert h.shape == (128, 1024)
    assert torch.all(h[:, idx] == 123.0)
    plain, _ = lesson_fc2_input(0.0, seed=0)
    keep = torch.ones(1024, dtype=torch.bool)
    keep[idx] = False
    assert torch.equal(plain[:, keep], h[:, keep])  # the sinks change only their own channels
    assert lesson_median((0,)) == float(plain[:, keep].abs().median())


@pytest.mark.parametrize("ratio", [20.0, 1e5])
def test_sinks_for_is_the_ratio_times_the_median_to_two_significant_digits(ratio):
    v = sinks_for(ratio)
    exact = ratio * lesson_median()
    assert abs(v - exact) <= 0.05 * exact
    mantissa = v / 10 ** (math.floor(math.log10(v)) - 1)  # two significant digits: an integer 10..99
    assert mantissa == pytest.approx(round(mantissa), abs=1e-9)


@pytest.mark.parametrize("placement", ["channels", "tokens"])
def test_outlier_multiplier_gives_the_ratio_it_promises(placement):
    ratio = 100.0
    m = outlier_multiplier(ratio, shape=(64, 256), placement=placement)
    x, where = sample("normal", (64, 256), m, seed=0, return_outliers=True, placement=placement)
    mask = torch.zeros(64, 256, dtype=torch.bool)
    if placement == "channels":
        mask[:, where] = True
    else:
        mask = where
    others = x[:, ~mask.any(0)].abs().median()
    assert float(x[mask].abs().max() / others) == pytest.approx(ratio, rel=1e-4)
