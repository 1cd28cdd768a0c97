"""tensorpress codecs for numcodecs and zarr (format 2 and 3), and so for Dask over zarr.

numcodecs codecs (a zarr format 2 ``compressor``, or any numcodecs user):

=====================  ==========  ===========================================
codec id               class       config
=====================  ==========  ===========================================
``tensorpress.sz``     ``SZ``      one of abs/rel/pw_rel/psnr (+ value_range)
                                   + predictor, alpha, beta, radius, level
``tensorpress.block``  ``Block``   one of abs/rel/pw_rel/psnr (+ value_range)
``tensorpress.quant``  ``Quant``   bits, group, stochastic, seed, hadamard
                                   (bits-bounded: no error bound)
``tensorpress.zstd``   ``Zstd``    level, shuffle (lossless, any numeric dtype)
=====================  ==========  ===========================================

They are registered through the ``numcodecs.codecs`` entry point, so
``numcodecs.get_codec({"id": "tensorpress.sz", "abs": 1e-3})`` works without
importing tensorpress first. zarr format 3 array-to-bytes codecs (the
``serializer=`` of ``zarr.create_array``) with the same names and configs are
``SZSerializer``, ``BlockSerializer``, ``QuantSerializer`` and
``ZstdSerializer``, registered through the ``zarr.codecs`` entry point; users
reach them as ``tensorpress.zarr.SZ`` etc. (formats/zarr_api.py). Their specs:
docs/zarr/<name>/.

Every encoded chunk is a whole tensorpress container stream (dtype, shape,
codec config, resolved bound and per-chunk checksums inside): decoding needs
nothing else, ``tensorpress.info`` reads a chunk file, and a corrupted chunk
raises ``ChecksumError`` instead of returning wrong numbers.

Bounds: zarr compresses chunk by chunk, so a plain ``rel`` is relative to each
chunk's own value range (max - min of its finite values). For one bound over the
whole array, as ``tp.compress`` and the CLI mean it, give the array's range:
``SZ(rel=1e-3, value_range=(lo, hi))``, or let ``SZ.for_array(x, rel=1e-3)`` read it
(numpy, Dask: one distributed reduction, xarray); ``psnr=`` (dB) takes a range too.
The config then records the bound as given, ``value_range`` and ``resolved_abs``,
the absolute bound every chunk is held to (formats/zarr_bounds.py). ``abs`` means
the same in every chunk by itself.
A CF valid range, ``valid_range=[lo, hi]`` (``None``: open on that side), makes the
cells outside it missing (kept bit for bit, left out of ranges) and clamps the decoded
values of the others into it, so that no value crosses it and reads as missing.
zarr pads an edge chunk to full size with the array's fill value. The format 3
serializers leave values equal to the fill value out of a per-chunk range, so padding
never loosens a ``rel`` bound; a numcodecs codec sees only the padded chunk,
so with zarr format 2 use ``abs`` or ``value_range`` (or a NaN fill value) for edge
chunks.
Writing part of a chunk decodes and re-encodes the whole chunk, so its errors
can add up: write whole chunks (``dask.array.to_zarr`` with the array's
chunks does).

Each chunk is compressed on the calling thread; zarr and Dask run chunks in
parallel.
"""

from __future__ import annotations

import asyncio
import math
from typing import ClassVar

import numpy as np

try:
    from numcodecs.abc import Codec as _Numcodec
    from numcodecs.compat import ensure_contiguous_ndarray_like, ensure_ndarray_like, ndarray_copy
    from numcodecs.registry import register_codec as _register_numcodec
except ImportError as exc:  # pragma: no cover - exercised in a subprocess test
    raise ImportError(
        "tensorpress's numcodecs/zarr codecs need numcodecs (and zarr for zarr arrays): "
        'pip install "tensorpress[zarr]"'
    ) from exc

try:
    from zarr.abc.codec import ArrayBytesCodec as _ArrayBytesCodec
    from zarr.core.common import parse_named_configuration as _parse_named_configuration
    from zarr.registry import register_codec as _register_zarr_codec
except ImportError:  # numcodecs without zarr: only the numcodecs codecs exist
    _ArrayBytesCodec = None

from ..compress.bounds import MODES, ErrorBound
from ..compress.registry import get_codec
from .missing import MissingSpec, scan
from .stream_reader import ContainerReader
from .stream_writer import encode_array
from .zarr_bounds import (
    bound_setup,
    cf_missing,
    clamp_bounds,
    missing_values,
    one_bound,
    valid_pair,
)
from .zarr_bounds import value_range as value_range_of

__all__ = ["SZ", "Block", "Quant", "Zstd", "NUMCODECS"]


class _TensorpressNumcodec(_Numcodec):
    """A numcodecs codec around one tensorpress codec; chunks are container streams.

    Error-bounded codecs take exactly one of ``abs``, ``rel`` (times the
    chunk's value range) or ``pw_rel`` (times |x| per element); the other
    keywords are the tensorpress codec's own parameters.
    """

    codec_id: ClassVar[str] = ""
    #: name of the codec in tensorpress's registry
    codec_name: ClassVar[str] = ""

    #: whether ``decode(buf, out=)`` fills an ``out`` of another dtype with the chunk's
    #: bytes, as numcodecs' compressors do (a lossless byte codec); the lossy codecs
    #: refuse, rather than hand back floats relabelled as something else
    reinterprets_out: ClassVar[bool] = False

    def __init__(
        self,
        *,
        abs=None,  # noqa: A002
        rel=None,
        pw_rel=None,
        psnr=None,
        value_range=None,
        resolved_abs=None,
        missing=None,
        valid_range=None,
        **params,
    ):
        try:
            self._missing = missing_values(missing)
            self._valid = valid_pair(valid_range)
            kwargs, self._fixed, self._range_config = bound_setup(
                abs, rel, pw_rel, psnr, value_range, resolved_abs
            )
            self._codec = get_codec(self.codec_name, **kwargs, **params)
            self._bound = self._codec.require_bound() if self._codec.bounded else None
            if self._valid is not None and not self._codec.lossy:
                raise ValueError("valid_range is for lossy codecs: this one keeps every value")
        except ValueError as exc:
            raise ValueError(f"invalid config for {self.codec_id!r}: {exc}") from None

    @classmethod
    def for_array(cls, data, *, rel=None, psnr=None, missing=None, **params):
        """This codec with ``rel`` or ``psnr`` (dB) resolved against the whole of ``data``
        (numpy, Dask or xarray: ``zarr_bounds.value_range``), so every chunk holds the
        same absolute bound. ``missing`` (a number or a list) marks missing cells: left
        out of the range and kept bit for bit; for an xarray DataArray it defaults to
        its CF ``_FillValue`` and ``missing_value`` (``zarr_bounds.cf_missing``)."""
        mode, value = one_bound(rel=rel, psnr=psnr)
        values = missing_values(cf_missing(data) if missing is None else missing)
        lo_hi = value_range_of(data, values or None)
        return cls(**{mode: value}, value_range=lo_hi, missing=list(values) or None, **params)

    @property
    def dtypes(self) -> tuple[str, ...]:
        """Names of the dtypes this codec compresses."""
        return self._codec.dtypes

    def get_config(self) -> dict:
        """JSON-serialisable config: ``id``, the bound (if any; with ``value_range`` and
        the ``resolved_abs`` it gave, for a whole-array bound), the codec's parameters
        and its ``stages`` (if any): the codec's whole config under this codec's id."""
        config = {"id": self.codec_id}
        if self._range_config is not None:  # the bound as given, the range, what it meant
            config.update(self._range_config)
        elif self._bound is not None:
            config[self._bound.mode] = self._bound.value
        if self._missing:
            config["missing"] = list(self._missing)
        if self._valid is not None:
            config["valid_range"] = list(self._valid)
        config.update(
            (k, v) for k, v in self._codec.get_config().items() if k != "id" and k not in MODES
        )
        return config

    @classmethod
    def from_config(cls, config: dict):
        config = dict(config)
        codec_id = config.pop("id", cls.codec_id)
        if codec_id != cls.codec_id:
            raise ValueError(f"config names codec {codec_id!r}, not {cls.codec_id!r}")
        try:
            return cls(**config)
        except TypeError as exc:
            raise ValueError(f"invalid config for {cls.codec_id!r}: {exc}") from None

    def check_dtype(self, dtype) -> np.dtype:
        """``dtype`` as a numpy dtype, or TypeError naming the dtypes this codec accepts."""
        dtype = np.dtype(dtype)
        if dtype.name not in self._codec.dtypes:
            hint = (
                "; integer and bool data need the lossless codec 'tensorpress.zstd'"
                if self._codec.lossy and dtype.kind in "biu"
                else ""
            )
            raise TypeError(
                f"codec {self.codec_id!r} compresses {', '.join(self._codec.dtypes)} arrays, "
                f"not {dtype}{hint}"
            )
        return dtype

    def encode(self, buf) -> bytes:
        """A container stream (bytes) holding the chunk array ``buf``."""
        return self.encode_chunk(buf)

    def encode_chunk(self, buf, fill_value=None) -> bytes:
        """:meth:`encode` of a zarr chunk whose array has ``fill_value``. The values of the
        config's ``missing`` and a finite nonzero ``fill_value`` come back bit for bit
        and stay out of the value range (formats/missing.py); a fill of 0 is left out of
        a per-chunk ``rel`` range but stays within the bound only (zarr's default fill
        of 0 cannot be told from a chosen one)."""
        arr = np.asarray(ensure_ndarray_like(buf))
        self.check_dtype(arr.dtype)
        if not arr.dtype.isnative:  # decode returns native order: refuse rather than relabel
            native = arr.dtype.newbyteorder("=").str
            raise ValueError(
                f"codec {self.codec_id!r} takes arrays in native byte order, got {arr.dtype.str}: "
                f"convert with .astype({native!r}) (with zarr format 2, create the array with "
                f"dtype {native!r})"
            )
        order = (
            "F" if arr.ndim > 1 and arr.flags.f_contiguous and not arr.flags.c_contiguous else "C"
        )
        markers = self._missing
        if fill_value is not None and np.isfinite(fill_value) and fill_value != 0:
            markers += (fill_value,)
        missing = _fill_markers(arr, markers, self._valid) if markers or self._valid else None
        if missing:  # markers are NaNs with payloads: ranges skip them, codecs keep them
            arr = missing.substitute(np.ascontiguousarray(arr))
        bound = self._resolve(arr, fill_value)
        return encode_array(
            arr,
            self._codec,
            bound,
            chunk_bytes=self._codec.default_chunk_bytes,
            workers=1,
            order=order,
            missing=missing,
        )

    def _resolve(self, arr: np.ndarray, fill_value) -> ErrorBound | None:
        """The bound resolved for this chunk (None for codecs without one)."""
        if self._bound is None or self._fixed is not None:
            return self._fixed
        if self._bound.mode == "rel" and fill_value is not None and np.isfinite(fill_value):
            arr = arr[arr != fill_value]  # zarr's padding of edge chunks
        return self._bound.resolve(arr)

    def decode(self, buf, out=None) -> np.ndarray:
        """The array a container stream holds (dtype and shape from the stream), or ``out``
        filled with it.

        ``out`` is an array of the stream's dtype and shape, a 1-d one of its dtype and
        size, or untyped memory (``bytearray``, a byte ``memoryview``) of its size in
        bytes (for :class:`Zstd`, any numeric array of its size in bytes, which gets
        the chunk's bytes); anything else raises ValueError (TypeError for an object
        array) rather than reinterpreting the values,
        from the stream's header, before anything is decoded (a stream declaring more
        values than ``out`` holds is never inflated). Without ``out`` the only limit on
        what a chunk declares is the machine's memory: callers that know the chunk's
        shape check it first (:meth:`decode_expecting`).
        """
        reader = self.reader(buf)
        if out is None:
            return reader.read()
        h = reader.header
        dst = ensure_ndarray_like(out)
        if dst.dtype.hasobject:  # numcodecs' compressors raise TypeError here too
            raise TypeError(f"cannot decode into an {dst.dtype} array: give a numeric out")
        same = dst.shape == tuple(h.shape) and dst.dtype == h.dtype
        untyped = not isinstance(out, np.ndarray) and dst.dtype == np.uint8 and dst.ndim == 1
        untyped = untyped or self.reinterprets_out
        flat = dst.dtype == h.dtype and dst.shape == (math.prod(h.shape),)
        if not (same or flat or (untyped and dst.nbytes == h.original_bytes)):
            raise ValueError(
                f"chunk holds a {h.dtype} array of shape {tuple(h.shape)}; out is {dst.dtype} "
                f"of shape {dst.shape}"
            )
        arr = reader.read()
        if same:
            np.copyto(dst, arr)  # element by element, whatever the two memory orders
            return dst
        return ndarray_copy(arr, dst)  # a flat buffer gets the chunk's memory order

    def decode_expecting(self, buf, shape: tuple, dtype) -> np.ndarray:
        """:meth:`decode` of a chunk that must hold ``shape`` values of ``dtype``: a stream
        that declares anything else raises ValueError from its header, before decoding."""
        reader = self.reader(buf)
        h = reader.header
        if tuple(h.shape) != tuple(shape) or h.dtype != np.dtype(dtype):
            raise ValueError(
                f"chunk holds a {h.dtype} array of shape {tuple(h.shape)} "
                f"({h.original_bytes} bytes); the array needs {np.dtype(dtype)} chunks of "
                f"shape {tuple(shape)}: refused before decoding"
            )
        return reader.read()

    def reader(self, buf) -> ContainerReader:
        """A reader of the chunk stream ``buf`` that decodes as this codec does: with a
        ``valid_range``, it clamps the decoded values that are not missing into it (the
        originals lie inside it, so clamping never adds error, and no value crosses it to
        read as missing). For callers that decode chunks themselves (row by row)."""
        stream = ensure_contiguous_ndarray_like(buf).reshape(-1).view(np.uint8)
        reader = ContainerReader(stream, workers=1)
        if self._valid is not None and reader.header.dtype.kind == "f":
            reader.clamp = clamp_bounds(self._valid, reader.header.dtype)
        return reader

    def __repr__(self) -> str:
        params = ", ".join(f"{k}={v!r}" for k, v in self.get_config().items() if k != "id")
        return f"{type(self).__name__}({params})"


def _fill_markers(arr: np.ndarray, values: tuple, valid: tuple | None = None):
    """The ``MissingMap`` of the cells of chunk ``arr`` equal to one of ``values`` or
    outside ``valid`` (lo, hi) (empty when there are none), or None for an array that is
    not float16/32/64."""
    if arr.dtype.kind != "f" or arr.dtype.itemsize not in (2, 4, 8):
        return None
    lo, hi = valid or (None, None)
    spec = MissingSpec(arr.dtype, tuple(arr.dtype.type(v) for v in values), lo, hi)
    return scan(np.ascontiguousarray(arr).reshape(-1), arr.size, spec)


class SZ(_TensorpressNumcodec):
    """``tensorpress.sz``: prediction, quantization, Huffman and zstd (float16/32/64)."""

    codec_id = "tensorpress.sz"
    codec_name = "sz"


class Block(_TensorpressNumcodec):
    """``tensorpress.block``: fast fixed-length codes per block of 64 values (float16/32/64)."""

    codec_id = "tensorpress.block"
    codec_name = "block"


class Quant(_TensorpressNumcodec):
    """``tensorpress.quant``: ``bits`` per value plus a min and scale per ``group`` values.

    Bits-bounded (no error bound); ``tensorpress.info`` of a chunk reports its max error.
    """

    codec_id = "tensorpress.quant"
    codec_name = "quant"


class Zstd(_TensorpressNumcodec):
    """``tensorpress.zstd``: lossless byte shuffle and zstd, any numeric or bool dtype."""

    codec_id = "tensorpress.zstd"
    codec_name = "zstd"
    reinterprets_out = True


#: codec id -> numcodecs class
NUMCODECS: dict[str, type[_TensorpressNumcodec]] = {c.codec_id: c for c in (SZ, Block, Quant, Zstd)}
for _cls in NUMCODECS.values():
    _register_numcodec(_cls)


if _ArrayBytesCodec is not None:

    class _Serializer(_ArrayBytesCodec):
        """A zarr format 3 array-to-bytes codec: each chunk becomes a container stream.

        Takes the same keywords as the numcodecs codec of the same name.
        """

        is_fixed_size = False
        numcodec: ClassVar[type[_TensorpressNumcodec]]

        def __init__(self, **config):
            object.__setattr__(self, "_numcodec", self.numcodec(**config))

        @classmethod
        def from_dict(cls, data: dict):
            _, config = _parse_named_configuration(
                data, cls.numcodec.codec_id, require_configuration=False
            )
            return cls(**(config or {}))

        def to_dict(self) -> dict:
            config = self._numcodec.get_config()
            del config["id"]
            return {"name": self.numcodec.codec_id, "configuration": config}

        @classmethod
        def for_array(cls, data, *, rel=None, psnr=None, missing=None, **params):
            """This serializer with ``rel`` or ``psnr`` resolved against the whole of
            ``data`` (see the numcodecs codec's ``for_array``)."""
            codec = cls.numcodec.for_array(data, rel=rel, psnr=psnr, missing=missing, **params)
            return cls(**{k: v for k, v in codec.get_config().items() if k != "id"})

        def reader(self, buf) -> ContainerReader:
            """A reader of the chunk stream ``buf`` that decodes as this serializer does
            (see the numcodecs codec's ``reader``)."""
            return self._numcodec.reader(buf)

        def validate(self, *, shape, dtype, chunk_grid) -> None:
            self._numcodec.check_dtype(dtype.to_native_dtype())

        def compute_encoded_size(self, input_byte_length: int, chunk_spec) -> int:
            raise NotImplementedError("tensorpress chunks have a data-dependent size")

        def _encode_sync(self, chunk_array, chunk_spec):
            blob = self._numcodec.encode_chunk(
                chunk_array.as_numpy_array(), fill_value=chunk_spec.fill_value
            )
            return chunk_spec.prototype.buffer.from_bytes(blob)

        def _decode_sync(self, chunk_bytes, chunk_spec):
            want = chunk_spec.dtype.to_native_dtype()
            arr = self._numcodec.decode_expecting(
                chunk_bytes.as_numpy_array(), tuple(chunk_spec.shape), want
            )
            return chunk_spec.prototype.nd_buffer.from_numpy_array(arr)

        async def _encode_single(self, chunk_array, chunk_spec):
            return await asyncio.to_thread(self._encode_sync, chunk_array, chunk_spec)

        async def _decode_single(self, chunk_bytes, chunk_spec):
            return await asyncio.to_thread(self._decode_sync, chunk_bytes, chunk_spec)

        def __eq__(self, other) -> bool:
            return type(other) is type(self) and other.to_dict() == self.to_dict()

        def __hash__(self) -> int:
            return hash((type(self), repr(self)))

        def __repr__(self) -> str:
            params = ", ".join(f"{k}={v!r}" for k, v in self.to_dict()["configuration"].items())
            return f"{type(self).__name__}({params})"

    class SZSerializer(_Serializer):
        """zarr 3 serializer ``tensorpress.sz`` (see :class:`SZ`)."""

        numcodec = SZ

    class BlockSerializer(_Serializer):
        """zarr 3 serializer ``tensorpress.block`` (see :class:`Block`)."""

        numcodec = Block

    class QuantSerializer(_Serializer):
        """zarr 3 serializer ``tensorpress.quant`` (see :class:`Quant`)."""

        numcodec = Quant

    class ZstdSerializer(_Serializer):
        """zarr 3 serializer ``tensorpress.zstd`` (see :class:`Zstd`)."""

        numcodec = Zstd

    #: codec name -> zarr 3 serializer class
    SERIALIZERS: dict[str, type[_Serializer]] = {
        c.numcodec.codec_id: c
        for c in (SZSerializer, BlockSerializer, QuantSerializer, ZstdSerializer)
    }
    for _name, _cls in SERIALIZERS.items():
        _register_zarr_codec(_name, _cls)
    __all__ += [
        "SERIALIZERS",
        "BlockSerializer",
        "QuantSerializer",
        "SZSerializer",
        "ZstdSerializer",
    ]
