"""Bytes on disk and on the wire: the container stream, the HDF5 filter and the files'
layouts (see SPEC.md); the jobs over whole files are ``tensorpress.files``.

The names here are what a user calls; the helpers behind them (the stream's
constants and :class:`~tensorpress.formats.stream_header.Header`, byte-range
sources and sinks, the streaming writer, the HDF5 marker) are imported from
their modules: ``stream_header``, ``stream_writer``, ``stream_reader``,
``hdf5``, ``hdf5_filter``, ``reader``.
"""

from .errors import (
    ChecksumError,
    FormatError,
    TruncatedError,
    UnknownCodecError,
    UnsupportedVersionError,
)
from .hdf5_filter import FILTER_ID as HDF5_FILTER_ID  # importing registers the filter
from .reader import CompressedFile, Dataset, open_compressed
from .stream_reader import ContainerReader, decode_array, read_header
from .stream_writer import encode_array

__all__ = [
    "ChecksumError",
    "CompressedFile",
    "ContainerReader",
    "Dataset",
    "FormatError",
    "HDF5_FILTER_ID",
    "TruncatedError",
    "UnknownCodecError",
    "UnsupportedVersionError",
    "decode_array",
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
