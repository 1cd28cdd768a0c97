"""Arrays to container streams and back: what ``tp.compress``, ``tp.decompress`` and
``tp.info`` do.

An array (numpy, torch, or array-like) is checked, its bound resolved by its codec
(``compress/``) and written as one container stream (SPEC.md); a ``psnr=`` target searches
abs bounds (``compress/quality.py``); bfloat16 values take the codec's torch path, as
``tensor_stream`` writes them.
"""

from __future__ import annotations

import math
import os
import types

import numpy as np

from ..compress import ErrorBound, available_codecs, get_codec
from ..compress.quality import search_bound
from .errors import FormatError
from .stream_header import is_bfloat16, parse_header
from .stream_reader import (
    BufferSource,
    ContainerReader,
    FileSource,
    check_length,
    read_payload,
    stream_codec,
)
from .stream_writer import encode_array
from .workers import resolve_workers

__all__ = ["CallablePackage", "compress", "decompress", "info"]


def compress(
    x,
    *,
    abs=None,
    rel=None,
    pw_rel=None,
    psnr=None,
    codec="sz",
    chunk_bytes=None,
    workers=None,
    **codec_params,
) -> bytes:
    """Compress an array into a self-describing, checksummed stream.

    ``x``: a numpy array, a torch tensor, or what ``np.asarray`` turns into a numeric
    array (a list of numbers, a memoryview, an ``array.array``, a scalar).

    Give exactly one bound for a lossy codec: ``abs`` (absolute), ``rel``
    (times the range max - min of the finite values) or ``pw_rel`` (times
    |x| per element). ``codec`` is a registered name, a config dict or a
    Codec; extra keywords are the codec's parameters. ``psnr`` (dB over the finite
    value range) instead of a bound picks the loosest absolute bound found to reach it
    (``compress/quality.py``); the stream records the target and the PSNR reached.
    ``chunk_bytes`` is the target input bytes per chunk; ``workers`` the threads (None:
    all cores).
    bfloat16 data (a torch tensor, or a numpy array of ``ml_dtypes.bfloat16``) is
    compressed by the codec's torch path, as ``tensor_to_stream(compress_tensor(t, ...))``.
    """
    bf16 = _bfloat16_tensor(x)
    if bf16 is not None and psnr is not None:
        raise TypeError("psnr= takes float16/32/64 data; convert bfloat16 to float32 first")
    if bf16 is not None:
        return _compress_bfloat16(*bf16, abs, rel, pw_rel, codec, chunk_bytes, codec_params)
    arr, order = _as_array(x)
    workers = resolve_workers(workers)
    if psnr is None:
        codec = get_codec(codec, abs=abs, rel=rel, pw_rel=pw_rel, **codec_params)
    else:
        codec = _psnr_codec(codec, psnr, (abs, rel, pw_rel), codec_params)
    if str(arr.dtype) not in codec.dtypes:
        if arr.dtype.kind in "biu" and codec.lossy:
            raise TypeError(
                f"{arr.dtype} data cannot be compressed with an error bound: integer and bool "
                "arrays need a lossless codec, e.g. tp.compress(x, codec='zstd')"
            )
        raise TypeError(
            f"codec {codec.name!r} does not accept dtype {arr.dtype}; it takes "
            f"{', '.join(codec.dtypes)}"
        )
    chunk_bytes = codec.default_chunk_bytes if chunk_bytes is None else chunk_bytes
    if psnr is not None:
        return _compress_psnr(arr, codec, float(psnr), order, workers, chunk_bytes)
    return encode_array(
        arr,
        codec,
        codec.resolve_bound(arr, workers),
        order=order,
        workers=workers,
        chunk_bytes=chunk_bytes,
    )


def _psnr_codec(codec, psnr, bounds, codec_params):
    """The codec a ``psnr=`` target searches bounds for: bounded, taking abs bounds."""
    if any(b is not None for b in bounds):
        raise ValueError("give either psnr=... or one error bound (abs, rel, pw_rel), not both")
    if isinstance(psnr, bool) or not isinstance(psnr, (int, float)) or not math.isfinite(psnr):
        raise ValueError(f"psnr must be a finite number of dB, got {psnr!r}")
    codec = get_codec(codec, **codec_params)
    if not (codec.bounded and "abs" in codec.bound_modes):
        raise ValueError(f"codec {codec.name!r} takes no abs error bound, so no psnr= target")
    return codec


def _compress_psnr(arr, codec, target, order, workers, chunk_bytes) -> bytes:
    """The stream under the loosest abs bound found to reach ``target`` dB (see
    ``compress/quality.py``), recording the target and the PSNR reached; the codec's
    :meth:`~Codec.psnr_alternatives` are searched too and the fewest bytes kept."""
    blob = _psnr_stream(arr, codec, target, order, workers, chunk_bytes)
    for alt in codec.psnr_alternatives(8.0 * len(blob) / max(arr.size, 1)):
        other = _psnr_stream(arr, alt, target, order, workers, chunk_bytes)
        blob = other if len(other) < len(blob) else blob
    return blob


def _psnr_stream(arr, codec, target, order, workers, chunk_bytes) -> bytes:
    def trial(bound):
        c = codec.with_bound(ErrorBound("abs", bound))
        blob = encode_array(arr, c, c.resolve_bound(arr), workers=workers, chunk_bytes=chunk_bytes)
        return c, ContainerReader(blob, workers=workers).read()

    best = search_bound(arr, target, trial)
    reached = best.psnr if math.isfinite(best.psnr) else None  # None: no error at all
    return encode_array(
        arr,
        best.result,
        best.result.resolve_bound(arr),
        order=order,
        workers=workers,
        chunk_bytes=chunk_bytes,
        target={"psnr": target, "psnr_reached": reached},
    )


def decompress(blob, *, workers=None) -> np.ndarray:
    """Decompress a stream from :func:`compress`: same dtype, shape and layout."""
    return ContainerReader(_as_buffer(blob), workers=workers).read()


def info(blob) -> dict:
    """What a stream holds: codec, config, dtype, shape, bound, sizes, format version.

    ``blob`` is a stream (bytes-like) or the path of a file holding one (read in pieces).
    Everything but the decoding is checked first (FormatError otherwise), as ``checked``
    says: the header's fields, the header's, the index's and every chunk's checksum, and
    that the stream ends after its last chunk.
    """
    source = FileSource(blob) if isinstance(blob, (str, os.PathLike)) else None
    try:
        return _info(source or BufferSource(_as_buffer(blob)))
    finally:
        if source is not None:
            source.close()


def _info(source) -> dict:
    h = parse_header(source)
    known = h.codec["id"] in available_codecs()
    codec = stream_codec(h) if known else None
    check_length(source, h)
    out = {
        "format_version": h.version,
        "codec": h.codec["id"],
        "config": h.codec,
        "dtype": str(h.dtype),
        "shape": h.shape,
        "order": h.order,
        "bound": None if h.bound is None else h.bound.to_dict(),
        "chunks": h.nchunks,
        "chunk_rows": h.chunk_rows,
        "original_bytes": h.original_bytes,
        "compressed_bytes": h.compressed_bytes,
        "ratio": h.original_bytes / h.compressed_bytes,
        "writer": h.writer,
        **({"target": h.target} if h.target is not None else {}),
        "checked": "header, index and chunk checksums, header fields, stream length",
    }
    errors = []
    for i in range(h.nchunks):
        payload = read_payload(source, h, i)
        if codec is not None and codec.reports_max_error:
            try:
                errors.append(
                    codec.payload_max_error(codec.unstage(payload, h.chunk_shape(i), h.dtype))
                )
            except ValueError as exc:
                raise FormatError(f"chunk {i} cannot be read: {exc}") from None
    if codec is not None and codec.reports_max_error:
        out["max_error"] = max(errors, default=0.0)
    return out


def _bfloat16_tensor(x):
    """(a CPU torch bfloat16 tensor, the memory layout 'C' or 'F') when ``x`` holds
    bfloat16 values (a tensor, or a numpy array of ``ml_dtypes.bfloat16``), else None."""
    if type(x).__module__.startswith("torch"):  # torch is imported only for its tensors
        import torch

        if isinstance(x, torch.Tensor) and x.dtype == torch.bfloat16:
            return x.detach().cpu(), "C"
    if isinstance(x, np.ndarray) and is_bfloat16(x.dtype):
        from .._util.optional_torch import import_torch

        torch = import_torch("compressing bfloat16 values")
        bits = np.asarray(x, order="C").view(np.int16)  # 0-d stays 0-d
        return torch.from_numpy(bits).view(torch.bfloat16), _layout(x)
    return None


def _compress_bfloat16(t, order, abs, rel, pw_rel, codec, chunk_bytes, codec_params) -> bytes:
    """bfloat16 values through the codec's torch path, as ``tensor_to_stream`` writes them."""
    from ..compress.tensor import compress_tensor
    from .tensor_stream import tensor_to_stream

    codec = get_codec(codec, abs=abs, rel=rel, pw_rel=pw_rel, **codec_params)
    if not codec.has_tensor_path:
        raise TypeError(
            f"codec {codec.name!r} does not take bfloat16 values: use codec='block' or "
            "codec='quant', or convert to float32 first"
        )
    ct = compress_tensor(t, codec, chunk_bytes=chunk_bytes)
    return tensor_to_stream(ct, order)


def _as_array(x) -> tuple[np.ndarray, str]:
    """(native-endian numpy array, 'C' or 'F' memory layout) from numpy/torch/array-like."""
    if type(x).__module__.startswith("torch"):
        import torch

        if isinstance(x, torch.Tensor):
            x = x.detach().cpu().numpy()
    arr = np.asarray(x)
    if arr.dtype.kind == "c" or arr.dtype.kind not in "biuf":
        raise TypeError(f"cannot compress an array of dtype {arr.dtype}; give a numeric array")
    if not arr.dtype.isnative:
        arr = arr.astype(arr.dtype.newbyteorder("="))
    return arr, _layout(arr)


def _layout(arr: np.ndarray) -> str:
    """'F' for an array laid out in Fortran order only, else 'C'."""
    return "F" if arr.ndim > 1 and arr.flags.f_contiguous and not arr.flags.c_contiguous else "C"


def _as_buffer(blob):
    if isinstance(blob, np.ndarray):
        return np.ascontiguousarray(blob).view(np.uint8).reshape(-1)
    if isinstance(blob, (bytes, bytearray, memoryview)):
        return blob
    raise TypeError(f"expected a bytes-like compressed stream, got {type(blob).__name__}")


class CallablePackage(types.ModuleType):
    """The class the package root gives the ``tensorpress.compress`` package: called, it
    compresses an array (``tp.compress(x, rel=1e-3)``), as :func:`compress` does."""

    def __call__(self, x, **kwargs) -> bytes:
        return compress(x, **kwargs)
