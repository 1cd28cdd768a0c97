"""``tensorpress.zarr``: the codecs as zarr 3 serializers, for zarr, xarray and Dask.

>>> import numpy as np, tensorpress as tp, zarr
>>> x = np.linspace(0, 1, 4096, dtype=np.float32).reshape(64, 64) ** 2
>>> a = zarr.create_array(
...     zarr.storage.MemoryStore(), shape=x.shape, chunks=(16, 64), dtype=x.dtype,
...     serializer=tp.zarr.SZ.for_array(x, rel=1e-3), compressors=None)
>>> a[...] = x
>>> bool(np.abs(a[...] - x).max() <= 1e-3 * (x.max() - x.min()))
True

=================  ====================  ================================================
name               zarr 3 codec name     keywords
=================  ====================  ================================================
``SZ``             ``tensorpress.sz``    one of abs/rel/pw_rel/psnr (rel and psnr with
                                         value_range), predictor, alpha, beta, radius, level
``Block``          ``tensorpress.block`` one of abs/rel/pw_rel/psnr (as SZ)
``Quant``          ``tensorpress.quant`` bits, group, stochastic, seed, hadamard
``Zstd``           ``tensorpress.zstd``  level, shuffle (lossless, any numeric dtype)
=================  ====================  ================================================

``SZ.for_array(data, rel=...)`` (or ``psnr=``) resolves the bound against the whole of
``data``: numpy, Dask (one distributed reduction) or xarray; :func:`value_range` and
:func:`resolve_bound` are that resolution by itself. xarray: ``ds.to_zarr(store,
encoding={"t": {"serializer": tp.zarr.SZ(...), "compressors": None}})``. Readers need
no ``import tensorpress``: the names are registered through zarr's entry points.
``NUMCODECS`` maps each name to its numcodecs codec (zarr format 2 ``compressor``).

Nothing here is imported until it is used: ``import tensorpress`` does not load zarr.
"""

import importlib as _importlib

#: public name -> (module of tensorpress.formats, name there)
_NAMES = {
    "SZ": ("zarr_codecs", "SZSerializer"),
    "Block": ("zarr_codecs", "BlockSerializer"),
    "Quant": ("zarr_codecs", "QuantSerializer"),
    "Zstd": ("zarr_codecs", "ZstdSerializer"),
    "NUMCODECS": ("zarr_codecs", "NUMCODECS"),
    "resolve_bound": ("zarr_bounds", "resolve_bound"),
    "value_range": ("zarr_bounds", "value_range"),
}

__all__ = sorted(_NAMES)


def __getattr__(name: str):
    """A public name, imported on first use (PEP 562)."""
    if name not in _NAMES:
        raise AttributeError(f"module 'tensorpress.zarr' has no attribute {name!r}")
    module, attr = _NAMES[name]
    value = getattr(_importlib.import_module(f"{__package__}.{module}"), attr)
    globals()[name] = value  # later lookups find it without this function
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_NAMES))
