"""Real data that ships with Python and its packages: text for a character model, images of digits.

Public: text_corpus, CharText (encode / batches), load_digits, Digits (train / test split, batches).
Nothing is downloaded: the text is Python's own documentation (pydoc_data.topics, the text
`help()` shows; the standard library's sources where a distribution strips it), the images are
scikit-learn's bundled copy of the UCI handwritten digits (1797 images, 8x8, 16 grey levels),
read from the file scikit-learn installs. Notebook 08 trains on both.
"""

from __future__ import annotations

import gzip
import importlib.util
import sysconfig
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from fp8lab.extras import require

__all__ = ["VOCAB", "CharText", "Digits", "load_digits", "text_corpus"]

# newline and the 95 printable ASCII characters: a fixed vocabulary of 96 tokens
VOCAB: str = "\n" + "".join(chr(c) for c in range(32, 127))
_TRANSLATE = str.maketrans({"‘": "'", "’": "'", "“": '"', "”": '"', "–": "-", "—": "-", "…": "...", "\t": "    "})
# fallback text: a fixed list of standard-library modules (their source ships with every Python)
_STDLIB_FILES = ("textwrap.py", "string.py", "difflib.py", "argparse.py", "dataclasses.py", "fractions.py",
                 "statistics.py", "shlex.py")


def text_corpus(source: str = "auto") -> tuple[str, str]:
    """(text, where it came from): Python's documentation topics, or the standard library's sources.

    source: "pydoc" (pydoc_data.topics: the text behind help('if'), ~465k characters), "stdlib"
    (the source of a fixed list of standard-library modules), or "auto" (pydoc, else stdlib).
    Characters outside VOCAB are translated (typographic quotes and dashes) or become '?'.
    """
    if source not in ("auto", "pydoc", "stdlib"):
        raise ValueError(f"unknown source {source!r}; valid: auto, pydoc, stdlib")
    text = where = None
    if source in ("auto", "pydoc"):
        try:
            from pydoc_data.topics import topics
        except ImportError:
            if source == "pydoc":
                raise
        else:
            text = "".join(topics[k] for k in sorted(topics))
            where = "pydoc_data.topics (Python's help() text)"
    if text is None:
        root = Path(sysconfig.get_paths()["stdlib"])
        parts = [(root / name).read_text(encoding="utf-8") for name in _STDLIB_FILES if (root / name).exists()]
        if not parts:
            raise FileNotFoundError(f"no standard-library sources found under {root}")
        text = "".join(parts)
        where = f"the standard library's sources ({', '.join(_STDLIB_FILES)})"
    text = text.translate(_TRANSLATE)
    allowed = set(VOCAB)
    return "".join(ch if ch in allowed else "?" for ch in text), where


@dataclass
class CharText:
    """A text as token ids (VOCAB), split into a training part and a held-out tail.

    batch(g, size, seq) -> (tokens[size, seq], next tokens[size, seq]) from random windows of
    the training part; heldout(size, seq) the same from fixed windows of the held-out part.
    """

    ids: torch.Tensor
    split: int
    source: str

    @classmethod
    def load(cls, source: str = "auto", heldout: float = 0.1) -> CharText:
        text, where = text_corpus(source)
        index = {ch: i for i, ch in enumerate(VOCAB)}
        ids = torch.tensor([index[ch] for ch in text], dtype=torch.long)
        return cls(ids, int(len(ids) * (1 - heldout)), where)

    @property
    def vocab(self) -> int:
        return len(VOCAB)

    def decode(self, ids: torch.Tensor) -> str:
        return "".join(VOCAB[i] for i in ids.tolist())

    def _windows(self, starts: torch.Tensor, seq: int) -> tuple[torch.Tensor, torch.Tensor]:
        idx = starts[:, None] + torch.arange(seq + 1, device=starts.device)  # (B, seq + 1)
        chunk = self.ids[idx]
        return chunk[:, :-1], chunk[:, 1:]

    def batch(self, g: torch.Generator, size: int, seq: int) -> tuple[torch.Tensor, torch.Tensor]:
        starts = torch.randint(0, self.split - seq - 1, (size,), generator=g, device="cpu")
        return self._windows(starts, seq)

    def heldout(self, size: int, seq: int) -> tuple[torch.Tensor, torch.Tensor]:
        last = len(self.ids) - seq - 1
        starts = torch.linspace(self.split, last, size, dtype=torch.float32, device="cpu").long()
        return self._windows(starts, seq)


def _digits_file() -> Path:
    require("data", "loading the handwritten digits")
    spec = importlib.util.find_spec("sklearn")  # locates the package without importing it
    return Path(spec.submodule_search_locations[0]) / "datasets" / "data" / "digits.csv.gz"


def load_digits() -> tuple[torch.Tensor, torch.Tensor]:
    """scikit-learn's bundled digits: images[1797, 64] (float32, grey levels 0..16) and labels[1797] (0..9).

    Read straight from the CSV that scikit-learn installs (what sklearn.datasets.load_digits
    reads; tests/test_realdata.py checks they are equal), without importing scikit-learn."""
    with gzip.open(_digits_file(), "rt") as f:
        data = np.loadtxt(f, delimiter=",", dtype=np.float32)  # (1797, 65): 64 pixels, then the label
    return torch.from_numpy(data[:, :-1].copy()), torch.from_numpy(data[:, -1].astype(np.int64))


@dataclass
class Digits:
    """The digits split once (seeded) into train and test; pixels scaled to [0, 1].

    batch(g, size) -> (images[size, 64], labels[size]) drawn from the training part."""

    train_x: torch.Tensor
    train_y: torch.Tensor
    test_x: torch.Tensor
    test_y: torch.Tensor

    @classmethod
    def load(cls, test_fraction: float = 0.2, seed: int = 0) -> Digits:
        x, y = load_digits()
        order = torch.randperm(len(y), generator=torch.Generator().manual_seed(seed))
        n_test = int(len(y) * test_fraction)
        test, train = order[:n_test], order[n_test:]
        x = x / 16.0
        return cls(x[train], y[train], x[test], y[test])

    def batch(self, g: torch.Generator, size: int) -> tuple[torch.Tensor, torch.Tensor]:
        i = torch.randint(0, len(self.train_y), (size,), generator=g)
        return self.train_x[i], self.train_y[i]
