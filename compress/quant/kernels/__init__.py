"""Kernels of the ``quant`` codec: numba on the CPU, torch ops on any device."""

from ...._util.numba_cache import configure_cache

configure_cache()  # before any cached kernel is defined: numba places each one then
