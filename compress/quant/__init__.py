"""The ``quant`` codec (bits-bounded group quantization, no error bound) and the group
quantizer it shares with gradient communication (``groups``); kernels in ``kernels/``."""

from .codec import QuantCodec

__all__ = ["QuantCodec"]
