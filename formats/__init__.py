"""Bytes on disk and on the wire: the container stream and whole files (see SPEC.md).

The names here are what a user calls; the helpers behind them (the stream's
constants and :class:`~tensorpress.formats.stream_header.Header`, byte-range
sources and sinks, the streaming writer, the HDF5 marker) are imported from
their modules: ``stream_header``, ``stream_writer``, ``stream_reader``,
``file_compress``, ``file_decompress``, ``file_output``, ``hdf5``, ``reader``.
"""

from .errors import (
    ChecksumError,
    FormatError,
    TruncatedError,
    UnknownCodecError,
    UnsupportedVersionError,
)
from .file_compress import compress_file
from .file_decompress import decompress_file, describe_file
from .file_output import DatasetReport
from .hdf5_filter import FILTER_ID as HDF5_FILTER_ID  # importing registers the filter
from .reader import CompressedFile, Dataset, open_compressed
from .stream_reader import ContainerReader, decode_array, read_header
from .stream_writer import encode_array

__all__ = [
    "ChecksumError",
    "CompressedFile",
    "ContainerReader",
    "Dataset",
    "DatasetReport",
    "FormatError",
    "HDF5_FILTER_ID",
    "TruncatedError",
    "UnknownCodecError",
    "UnsupportedVersionError",
    "compress_file",
    "decode_array",
    "decompress_file",
    "describe_file",
    "encode_array",
    "open_compressed",
    "read_header",
    "tensor_from_stream",
    "tensor_to_stream",
]

_TENSOR_API = ("tensor_from_stream", "tensor_to_stream")


def __getattr__(name):  # the tensor streams import torch: only on first use
    if name in _TENSOR_API:
        from . import tensor_stream

        return getattr(tensor_stream, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
