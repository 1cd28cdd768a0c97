"""numba kernels: the hot loops of the codecs, apart from orchestration."""
