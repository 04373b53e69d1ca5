"""torch_defaults: torch's default dtype and device set for a block, as a notebook that called
torch.set_default_dtype or set_default_device has them (the tests of what fp8lab makes under other defaults)."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

import torch

# the settings those tests run: float64 (a reference computation), the half types (by mistake), "meta" (sizing a model)
OTHER_DEFAULTS = [(torch.float64, "cpu"), (torch.float16, "cpu"), (torch.bfloat16, "cpu"), (torch.float32, "meta")]


@contextlib.contextmanager
def torch_defaults(dtype: torch.dtype, device: str) -> Iterator[None]:
    """torch.set_default_dtype(dtype) and a default device inside the block; the dtype restored after (the device
    is torch.device's own context, which restores itself)."""
    old = torch.get_default_dtype()
    torch.set_default_dtype(dtype)
    try:
        with torch.device(device):
            yield
    finally:
        torch.set_default_dtype(old)
