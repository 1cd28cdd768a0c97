"""Bytes on disk and on the wire: the v1 container (see SPEC.md)."""

from ..compress.registry import STREAM_IO
from .container import (
    DEFAULT_CHUNK_BYTES,
    FORMAT_VERSION,
    MAGIC,
    ContainerReader,
    Header,
    decode_array,
    encode_array,
    read_header,
    verified_payloads,
    write_stream,
)
from .errors import (
    ChecksumError,
    FormatError,
    TruncatedError,
    UnknownCodecError,
    UnsupportedVersionError,
)

__all__ = [
    "DEFAULT_CHUNK_BYTES",
    "FORMAT_VERSION",
    "MAGIC",
    "ChecksumError",
    "ContainerReader",
    "FormatError",
    "Header",
    "TruncatedError",
    "UnknownCodecError",
    "UnsupportedVersionError",
    "decode_array",
    "encode_array",
    "read_header",
]


def _read_for_tensors(blob) -> dict:
    h, payload = verified_payloads(blob)
    if h.order != "C":
        raise ValueError("only C-order streams decode into tensors")
    return {
        "dtype": h.dtype.newbyteorder("<").str,
        "shape": h.shape,
        "codec_config": h.codec,
        "bound": h.bound,
        "chunk_rows": h.chunk_rows,
        "lengths": h.lengths,
        "payload": payload,
    }


STREAM_IO.update(write=write_stream, read=_read_for_tensors)
