"""Kernels of the ``block`` codec: numba on the CPU, numba.cuda and torch on the GPU."""

from ...._util.numba_cache import configure_cache

configure_cache()  # before any cached kernel is defined: numba places each one then
