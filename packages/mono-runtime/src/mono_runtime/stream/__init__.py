"""The weight-streaming engine: how every mono kernel reads weights at decode.

At S <= 16 rows a decoder layer is a weight stream: each weight byte is read once and the
arithmetic is tiny. The engine puts the weights on the wide (M) side of every dot and the
<= 16 token rows on the narrow side, walks K in fixed-count loops Triton software-pipelines,
and decodes MXFP4 and FP8 with a few integer instructions per value. `layout` holds the
packed weight layouts (pure torch, CPU-testable); `triton` the device helpers; `gemv` a
standalone GEMV on the engine, which `mono bench gemv` times against cuBLAS.
"""

from .layout import (
    BF16,
    FP8_B128,
    MXFP4_K32,
    MXFP4_ROT,
    StreamFormat,
    pack_mxfp4_rot,
    unpack_mxfp4_rot,
)

__all__ = [
    "BF16",
    "FP8_B128",
    "MXFP4_K32",
    "MXFP4_ROT",
    "StreamFormat",
    "pack_mxfp4_rot",
    "unpack_mxfp4_rot",
]
