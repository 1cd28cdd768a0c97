"""Bytes on disk and on the wire: the v1 container and whole files (see SPEC.md)."""

from .container import (
    DEFAULT_CHUNK_BYTES,
    FORMAT_VERSION,
    MAGIC,
    BufferSource,
    ContainerReader,
    FileSink,
    FileSource,
    Header,
    StreamWriter,
    decode_array,
    encode_array,
    encode_chunks,
    parse_header,
    read_header,
    write_stream,
)
from .errors import (
    ChecksumError,
    FormatError,
    TruncatedError,
    UnknownCodecError,
    UnsupportedVersionError,
)
from .files import DatasetReport, compress_file, decompress_file, describe_file
from .hdf5 import MARKER, MARKER_VERSION
from .reader import CompressedFile, Dataset, open_compressed, open_source

__all__ = [
    "DEFAULT_CHUNK_BYTES",
    "FORMAT_VERSION",
    "MAGIC",
    "MARKER",
    "MARKER_VERSION",
    "BufferSource",
    "ChecksumError",
    "CompressedFile",
    "ContainerReader",
    "Dataset",
    "DatasetReport",
    "FileSink",
    "FileSource",
    "FormatError",
    "Header",
    "StreamWriter",
    "TruncatedError",
    "UnknownCodecError",
    "UnsupportedVersionError",
    "compress_file",
    "decode_array",
    "decompress_file",
    "describe_file",
    "encode_array",
    "encode_chunks",
    "open_compressed",
    "open_source",
    "parse_header",
    "read_header",
    "tensor_from_stream",
    "tensor_to_stream",
    "write_stream",
]

_TENSOR_API = ("tensor_from_stream", "tensor_to_stream")


def __getattr__(name):  # the tensor streams import torch: only on first use
    if name in _TENSOR_API:
        from . import tensor_stream

        return getattr(tensor_stream, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
