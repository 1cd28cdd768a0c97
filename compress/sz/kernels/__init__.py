"""numba kernels of the ``sz`` codec: predictors, the quantizer, Huffman."""

from ...._util.numba_cache import configure_cache

configure_cache()  # before any cached kernel is defined: numba places each one then
