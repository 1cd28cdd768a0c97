"""numba kernels: the hot loops of the codecs, apart from orchestration."""

from ..._util.numba_cache import configure_cache

configure_cache()  # before any cached kernel is defined: numba places each one then
