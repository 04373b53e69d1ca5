"""fp8lab.figures.png: the PNG decodes to the pixels it was given, and keeping unchanged bands changes no byte."""

import io

import numpy as np
import pytest
from PIL import Image

from fp8lab.figures import png
from fp8lab.figures.png import encode_png


def test_encode_png_gives_rgb_that_pil_decodes_to_the_same_pixels():
    rgba = np.random.default_rng(0).integers(0, 256, (7, 5, 4), dtype=np.uint8)
    rgba[..., 3] = 255
    decoded = Image.open(io.BytesIO(encode_png(rgba)))
    assert decoded.mode == "RGB" and decoded.size == (5, 7)
    assert np.array_equal(np.asarray(decoded), rgba[..., :3])
    with pytest.raises(ValueError, match="uint8"):
        encode_png(rgba[..., :3])


def test_encode_png_keeps_unchanged_bands_and_gives_the_bytes_of_a_cold_encoding(monkeypatch):
    """An image whose rows partly equal the last one's: the PNG decodes to its pixels, and its bytes are
    those of the same image encoded with nothing kept (a band's bytes depend on that band alone)."""
    rng = np.random.default_rng(1)
    rows = 3 * png.PNG_BAND_ROWS + 5  # a short last band
    first = np.full((rows, 9, 4), 255, np.uint8)
    first[:, :, :3] = rng.integers(0, 4, (rows, 9, 3), dtype=np.uint8)  # compressible, as a panel is
    second = first.copy()
    second[png.PNG_BAND_ROWS + 2, 4, 1] ^= 1  # one pixel in the second band
    second[-1, 0, 0] ^= 1  # one in the short last band
    monkeypatch.setattr(png, "_png_kept", {})
    png.encode_png(first)
    kept = png.encode_png(second)
    deflated, deflate = [], png._deflate_band
    monkeypatch.setattr(png, "_deflate_band", lambda band, level: deflated.append(len(band)) or deflate(band, level))
    back = png.encode_png(first)
    assert deflated == [png.PNG_BAND_ROWS, 5], deflated  # the two changed bands only
    monkeypatch.setattr(png, "_png_kept", {})
    cold = png.encode_png(second)
    assert kept == cold
    for image, data in ((second, kept), (first, back)):
        decoded = Image.open(io.BytesIO(data))
        assert decoded.mode == "RGB" and np.array_equal(np.asarray(decoded), image[..., :3])
