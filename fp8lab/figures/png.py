"""PNG: the panels' pixels, encoded without PIL's conversions.

Public: encode_png (an RGB PNG whose unchanged bands of rows keep their compressed bytes from the last image of
that size), PNG_BAND_ROWS. A slider moves part of a panel: the bands of rows it did not touch are not compressed
again.
"""

from __future__ import annotations

import struct
import threading
import zlib

import numpy as np

__all__ = ["PNG_BAND_ROWS", "encode_png"]

PNG_BAND_ROWS = 16  # rows per deflate segment: a band whose rows did not change keeps its compressed bytes
_LOCK = threading.Lock()
_png_kept: dict[tuple[int, int, int], tuple[np.ndarray, list[bytes]]] = {}  # (h, w, level) -> (rows, segments)


def _png_rows(rgba: np.ndarray) -> np.ndarray:
    """(height, 1 + 3 * width) uint8: each row's filter byte (0, "none") and its RGB bytes."""
    height, width = rgba.shape[:2]
    rows = np.empty((height, 1 + 3 * width), np.uint8)
    rows[:, 0] = 0
    rgb = rows[:, 1:].reshape(height, width, 3)
    for channel in range(3):  # one channel at a time: a few times quicker than copying rgba[..., :3] whole
        rgb[..., channel] = rgba[..., channel]
    return rows


def _deflate_band(band: np.ndarray, level: int) -> bytes:
    """A band of rows as a raw deflate segment ending on a byte boundary (a sync flush, not the last
    block): a fresh compressor per band, so its bytes depend on this band alone."""
    compressor = zlib.compressobj(level, zlib.DEFLATED, -15)
    return compressor.compress(band) + compressor.flush(zlib.Z_SYNC_FLUSH)


def encode_png(rgba: np.ndarray, level: int = 1) -> bytes:
    """An RGB PNG of an opaque (height, width, 4) uint8 image (alpha dropped), rows unfiltered, zlib
    level `level`. The image data is one zlib stream made of PNG_BAND_ROWS-row deflate segments, each
    compressed on its own; a band whose bytes equal those of the last image of this size and level
    reuses its segment (a slider moves part of a panel: the rest is not compressed again). Its bytes
    depend on the pixels only, not on the images before it; PIL decodes it to the same pixels
    (tests/figures/test_png.py)."""
    if rgba.ndim != 3 or rgba.shape[2] != 4 or rgba.dtype != np.uint8:
        raise ValueError(f"encode_png takes a (height, width, 4) uint8 array, got {rgba.shape} {rgba.dtype}")
    height, width = rgba.shape[:2]
    rows = _png_rows(rgba)
    kept_rows, kept_segments = _png_kept.get((height, width, level), (None, None))
    segments = []
    for i, start in enumerate(range(0, height, PNG_BAND_ROWS)):
        band = rows[start:start + PNG_BAND_ROWS]
        if kept_rows is not None and np.array_equal(band, kept_rows[start:start + PNG_BAND_ROWS]):
            segments.append(kept_segments[i])
        else:
            segments.append(_deflate_band(band, level))
    with _LOCK:
        if len(_png_kept) >= 16:
            _png_kept.clear()
        _png_kept[height, width, level] = (rows, segments)
    # zlib's header (deflate, 32 KiB window), the segments, an empty last block, the Adler-32 of all rows
    stream = b"\x78\x01" + b"".join(segments) + b"\x03\x00" + struct.pack(">I", zlib.adler32(rows))

    def chunk(kind: bytes, payload: bytes) -> bytes:
        return struct.pack(">I", len(payload)) + kind + payload + struct.pack(">I", zlib.crc32(kind + payload))

    header = struct.pack(">IIBBBBB", width, height, 8, 2, 0, 0, 0)  # 8-bit RGB, no interlace
    return b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", header) + chunk(b"IDAT", stream) + chunk(b"IEND", b"")
