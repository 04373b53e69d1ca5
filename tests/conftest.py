import os

import pytest
import torch
from hypothesis import HealthCheck, settings

settings.register_profile(
    "fp8lab", deadline=None, max_examples=60, suppress_health_check=[HealthCheck.too_slow], derandomize=True
)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "fp8lab"))

torch.set_num_threads(min(2, torch.get_num_threads()))


def has_fp8_gpu() -> bool:
    return torch.cuda.is_available() and torch.cuda.get_device_capability() >= (8, 9)


gpu = pytest.mark.skipif(not has_fp8_gpu(), reason="needs a CUDA GPU with compute capability >= 8.9")
