"""Peer compressors behind one small interface, for side-by-side benchmarks.

Each peer has ``name``, ``available`` (its module imports), ``lossy``,
``compress(x, abs_bound) -> bytes`` (every element within ``abs_bound`` of the
input, absolute, in the units of ``x``; a lossless peer ignores the bound) and
``decompress(blob, like) -> ndarray`` (``like`` gives the shape and dtype of the
original). The peers are optional: SZ3 through ``pysz``, ZFP through ``zfpy``
and zstd through ``zstandard``. Arrays a peer cannot take (empty arrays for all
of them, float16 for SZ3 and ZFP, more than 4 dimensions for ZFP) raise a
ValueError instead of reaching the library, some of which crash on them.
"""

from __future__ import annotations

import importlib

import numpy as np

__all__ = ["PEERS", "Peer", "SZ3", "ZFP", "Zstd", "available_peers"]


class Peer:
    """A peer compressor: ``compress(x, abs_bound) -> bytes``, ``decompress(blob, like)``."""

    name: str = ""
    module: str = ""  # the Python module that provides it
    lossy: bool = True
    dtypes: tuple[str, ...] = ("float32", "float64")
    max_ndim: int = 32

    @property
    def available(self) -> bool:
        """Whether the peer's module imports."""
        try:
            importlib.import_module(self.module)
        except ImportError:
            return False
        return True

    def check(self, x: np.ndarray) -> None:
        """Raise ValueError if this peer cannot compress ``x``."""
        if x.size == 0:
            raise ValueError(f"{self.name} cannot compress an empty array")
        if str(x.dtype) not in self.dtypes:
            raise ValueError(f"{self.name} takes {', '.join(self.dtypes)}, not {x.dtype}")
        if x.ndim > self.max_ndim:
            raise ValueError(f"{self.name} takes at most {self.max_ndim} dimensions, not {x.ndim}")

    def compress(self, x: np.ndarray, abs_bound: float) -> bytes:
        """Compress ``x`` so that every element is within ``abs_bound`` (absolute)."""
        x = np.ascontiguousarray(x)
        self.check(x)
        if self.lossy and not (np.isfinite(abs_bound) and abs_bound >= 0):
            raise ValueError(f"{self.name}: the bound must be finite and >= 0, got {abs_bound}")
        return self._compress(x, float(abs_bound))

    def decompress(self, blob: bytes, like) -> np.ndarray:
        """Decompress ``blob`` into an array shaped and typed like ``like``."""
        shape, dtype = tuple(like.shape), np.dtype(like.dtype)
        return np.asarray(self._decompress(blob, shape, dtype)).reshape(shape)

    def _compress(self, x: np.ndarray, abs_bound: float) -> bytes:
        raise NotImplementedError

    def _decompress(self, blob: bytes, shape: tuple, dtype: np.dtype) -> np.ndarray:
        raise NotImplementedError

    def __repr__(self) -> str:
        return f"<peer {self.name} ({self.module}, {'available' if self.available else 'absent'})>"


class SZ3(Peer):
    """SZ3 through ``pysz``: its default algorithm, absolute error bound."""

    name, module = "SZ3", "pysz"

    def _compress(self, x, abs_bound):
        import pysz

        conf = pysz.szConfig()
        # pysz's default mode is ABS 1e-3 whatever else is set: set both explicitly.
        conf.errorBoundMode = pysz.szErrorBoundMode.ABS
        conf.absErrorBound = abs_bound
        blob, _ratio = pysz.sz.compress(x, conf)
        return blob.tobytes()

    def _decompress(self, blob, shape, dtype):
        import pysz

        out, _conf = pysz.sz.decompress(np.frombuffer(blob, np.uint8), dtype, shape)
        return out


class ZFP(Peer):
    """ZFP through ``zfpy``, fixed-accuracy mode (tolerance = the absolute bound).

    ZFP does not keep NaN or Inf: non-finite inputs come back as other numbers.
    """

    name, module, max_ndim = "ZFP", "zfpy", 4

    def _compress(self, x, abs_bound):
        import zfpy

        return zfpy.compress_numpy(x, tolerance=abs_bound)

    def _decompress(self, blob, shape, dtype):
        import zfpy

        return zfpy.decompress_numpy(blob)


class Zstd(Peer):
    """zstd level 3 on the raw bytes: lossless, the bound is ignored."""

    name, module, lossy = "zstd", "zstandard", False
    dtypes = ("float16", "float32", "float64")
    level = 3

    def _compress(self, x, abs_bound):
        import zstandard

        return zstandard.ZstdCompressor(level=self.level).compress(x.tobytes())

    def _decompress(self, blob, shape, dtype):
        import zstandard

        return np.frombuffer(zstandard.ZstdDecompressor().decompress(blob), dtype=dtype)


#: every peer, installed or not, in the order tables list them
PEERS: tuple[Peer, ...] = (SZ3(), ZFP(), Zstd())


def available_peers() -> list[Peer]:
    """The peers whose modules import here."""
    return [p for p in PEERS if p.available]
