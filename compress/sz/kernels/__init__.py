"""numba kernels of the ``sz`` codec: predictors, the quantizer, Huffman."""

from ...kernels import configure_cache  # noqa: F401  (numba's cache placed before any kernel)
