"""fp8lab.nn: FP8 training layers, the public face of fp8lab.training.layers.

FP8Linear (an nn.Linear whose three GEMMs run in FP8), convert(model, recipe), layer_gemms
(the three GEMMs' operands, exactly as FP8Linear builds them), Monitor. Notebook 06 trains
with them; notebook 08 converts a model of your own.
"""

from fp8lab.training.layers import *  # noqa: F403
from fp8lab.training.layers import __all__  # noqa: F401
