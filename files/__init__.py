"""Whole-file jobs: compress, decompress, describe and convert files (HDF5, netCDF-4,
.npy, .npz, raw), the jobs the command line runs, above ``formats/`` (the bytes).

The names here are what a user calls; the helpers behind them live in their modules:
``compress`` (the compress job), ``plan`` (what each dataset becomes), ``decompress``,
``convert`` (between the filter and stream layouts), ``output`` (reports, atomic
output files, the storage record), ``zarr_out`` (an HDF5, netCDF-4 or zarr input into a
zarr v3 store, on Dask).
"""

from .compress import compress_file
from .convert import convert_file
from .decompress import decompress_file, describe_file
from .output import DatasetReport
from .zarr_out import compress_to_zarr

__all__ = [
    "DatasetReport",
    "compress_file",
    "compress_to_zarr",
    "convert_file",
    "decompress_file",
    "describe_file",
]
