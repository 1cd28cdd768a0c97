"""Bytes on disk and on the wire: the v1 container (see SPEC.md)."""

from .container import (
    DEFAULT_CHUNK_BYTES,
    FORMAT_VERSION,
    MAGIC,
    ContainerReader,
    Header,
    decode_array,
    encode_array,
    read_header,
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
