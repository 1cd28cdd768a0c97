"""Compressed tensors as container streams and back.

``tensor_to_stream(ct)`` is, byte for byte, the stream ``tensorpress.compress``
writes for the same values; ``tensor_from_stream(blob)`` gives back a
:class:`~tensorpress.compress.CompressedTensor` whose payload can be decoded on
any device by :func:`~tensorpress.compress.decompress_tensor`.
"""

from __future__ import annotations

from .._util.optional_torch import import_torch
from ..compress.registry import get_codec
from ..compress.tensor import CompressedTensor, bytes_tensor
from .stream_header import stream_dtype
from .stream_reader import verified_payloads
from .stream_writer import write_stream

torch = import_torch("tensorpress.formats.tensor_stream (tensor_to_stream, tensor_from_stream)")

#: how the container names the dtypes a tensor stream can hold
_STREAM_DTYPES = {
    torch.float16: "<f2",
    torch.bfloat16: "bfloat16",
    torch.float32: "<f4",
    torch.float64: "<f8",
}
_FROM_STREAM = {name: dtype for dtype, name in _STREAM_DTYPES.items()}


def tensor_to_stream(ct: CompressedTensor, order: str = "C") -> bytes:
    """The container stream of ``ct``; ``order`` ("C" or "F") is the layout a reader
    hands back (the values are in C order either way)."""
    if order not in ("C", "F"):
        raise ValueError(f"order must be 'C' or 'F', got {order!r}")
    return write_stream(
        _STREAM_DTYPES[ct.dtype],
        ct.shape,
        order,
        ct.codec.stream_config(),
        ct.bound,
        ct.chunk_rows,
        _split(ct.payload.cpu().numpy(), ct.lengths),  # views: copied once, into the stream
    )


def tensor_from_stream(blob, device=None) -> CompressedTensor:
    """The compressed tensor a stream holds, its payload on ``device`` (default: CPU).

    The stream's checksums are verified; its codec must have a torch path and its
    layout must be C order.
    """
    h, payload = verified_payloads(blob)
    if h.order != "C":
        raise ValueError("only C-order streams decode into tensors")
    codec = get_codec(h.codec)
    if not codec.has_tensor_path or codec.stages:
        raise ValueError(
            f"streams of codec {codec.stream_config()} decode with tensorpress.decompress"
        )
    name = stream_dtype(h.dtype)
    if name not in _FROM_STREAM:
        raise TypeError(f"cannot decode a {name} stream into a tensor")
    data = bytes_tensor(payload, device)
    return CompressedTensor(
        data, tuple(h.lengths), tuple(h.shape), _FROM_STREAM[name], codec, h.bound, h.chunk_rows
    )


def _split(blob, lengths) -> list:
    """Views of the consecutive pieces of ``lengths`` bytes of the bytes-like ``blob``."""
    mv = memoryview(blob).cast("B")
    out, pos = [], 0
    for n in lengths:
        out.append(mv[pos : pos + n])
        pos += n
    return out
