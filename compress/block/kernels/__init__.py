"""Kernels of the ``block`` codec: numba on the CPU, numba.cuda and torch on the GPU."""

from ...kernels import configure_cache  # noqa: F401  (numba's cache placed before any kernel)
