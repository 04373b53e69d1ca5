"""fp8lab.nn: FP8 training layers and conversion, the public face of fp8lab.training's layers.

FP8Linear (an nn.Linear whose three GEMMs run in FP8), convert(model, recipe) and its report
(conversion_report), unwrap, layer_gemms (the three GEMMs' operands, exactly as FP8Linear builds
them), Monitor, end_step (delayed scaling's step, for optimizers outside torch.optim, or a step your loop
skips). Notebook 06 trains with them; notebook 08 converts a model of your own.
"""

from fp8lab.training.attention import FP8MultiheadAttention
from fp8lab.training.convert import (
    ConversionReport,
    ConversionWarning,
    conversion_report,
    convert,
    find_sites,
    fp8_layers,
    unwrap,
)
from fp8lab.training.delayed import end_step
from fp8lab.training.layers import (
    IDENTITY,
    AmaxReducer,
    FP8Linear,
    layer_gemms,
    scale_spans_tokens,
    tokens_per_scale,
)
from fp8lab.training.monitor import Monitor

__all__ = [
    "IDENTITY",
    "AmaxReducer",
    "ConversionReport",
    "ConversionWarning",
    "FP8Linear",
    "FP8MultiheadAttention",
    "Monitor",
    "conversion_report",
    "convert",
    "end_step",
    "find_sites",
    "fp8_layers",
    "layer_gemms",
    "scale_spans_tokens",
    "tokens_per_scale",
    "unwrap",
]
