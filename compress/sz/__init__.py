"""The ``sz`` codec: prediction, linear quantization with outliers, Huffman and zstd.

One module per predictor with its side information (``lorenzo``, ``interpolation``,
``constant``, ``regression``, ``lattice``, ``fitted``, ``match``, ``pivot``; their ids in
``ids``), the choice among them (``choice``), the steps that dispatch to a chosen
predictor (``steps``), the codec that frames it all (``codec``); the hot loops in
``kernels/``, every predictor coding its values through ``kernels/quantizer.py``.
"""

from .codec import FLAG_FLAT, FLAG_LOG, FLAG_ROWS, SZCodec

__all__ = ["FLAG_FLAT", "FLAG_LOG", "FLAG_ROWS", "SZCodec"]
