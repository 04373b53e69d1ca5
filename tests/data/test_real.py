"""fp8lab.data.real: the shipped text and digits, read without a download; token ids round-trip and the
batches are next-token pairs. scikit-learn's own loader as the oracle: tests/training/test_capstone.py."""

import pytest
import torch

from fp8lab.data.real import VOCAB, CharText, Digits, load_digits, text_corpus


def test_the_vocabulary_is_newline_and_printable_ascii():
    assert len(VOCAB) == 96 and VOCAB[0] == "\n" and VOCAB[1] == " " and VOCAB[-1] == "~"


@pytest.mark.parametrize("source", ["pydoc", "stdlib"])
def test_text_is_translated_into_the_vocabulary(source):
    text, where = text_corpus(source)
    assert len(text) > 100_000 and set(text) <= set(VOCAB)
    assert ("pydoc" in where) == (source == "pydoc")
    with pytest.raises(ValueError, match="unknown source"):
        text_corpus("web")


def test_char_batches_are_windows_and_their_next_tokens():
    t = CharText.load("stdlib", heldout=0.1)
    assert t.split == int(len(t.ids) * 0.9)
    x, y = t.batch(torch.Generator().manual_seed(0), 4, 16)
    assert x.shape == y.shape == (4, 16)
    assert torch.equal(x[:, 1:], y[:, :-1])  # y is x shifted by one
    hx, hy = t.heldout(3, 16)
    for row in range(3):  # held-out windows lie past the split, in the text's own order
        start = int(torch.nonzero(t.ids[t.split:].unfold(0, 16, 1).eq(hx[row]).all(1))[0]) + t.split
        assert start >= t.split and torch.equal(t.ids[start + 1:start + 17], hy[row])
    assert t.decode(x[0]) == "".join(VOCAB[i] for i in x[0].tolist())


@pytest.mark.slow  # reads the 1797 images from their CSV: about 2 s of CPU
def test_digits_split_is_seeded_and_its_sizes_add_up():
    pytest.importorskip("sklearn")
    d = Digits.load(test_fraction=0.2, seed=0)
    assert len(d.test_y) == int(1797 * 0.2) and len(d.train_y) + len(d.test_y) == 1797
    assert d.train_x.shape[1] == 64 and float(d.train_x.max()) <= 1.0 and float(d.train_x.min()) >= 0.0
    assert set(d.train_y.unique().tolist()) == set(range(10))
    order = torch.randperm(1797, generator=torch.Generator().manual_seed(0))  # the split the seed draws
    assert torch.equal(d.test_y, load_labels()[order[:359]])
    xb, yb = d.batch(torch.Generator().manual_seed(0), 5)
    assert xb.shape == (5, 64) and yb.shape == (5,)


def load_labels() -> torch.Tensor:
    return load_digits()[1]
