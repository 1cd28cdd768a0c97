"""Kernels of the ``quant`` codec: numba on the CPU, torch ops on any device."""

from ...kernels import configure_cache  # noqa: F401  (numba's cache placed before any kernel)
