"""HDF5- and zarr-aware shuffled-index data loading: torch's roles (a dataset, a
sampler, a loader) with an order known in advance. See docs/loaders.md."""

from .._util.optional_torch import torch as _torch  # noqa: F401  (install advice)
from .buffer import BeladyBuffer, simulate
from .chunked import ChunkedDataset
from .dataloader import DataLoader
from .file_identity import FileChangedError
from .h5dataset import H5Dataset
from .plan import ShufflePlan
from .zarr_dataset import ZarrDataset

__all__ = [
    "BeladyBuffer",
    "ChunkedDataset",
    "DataLoader",
    "FileChangedError",
    "H5Dataset",
    "ShufflePlan",
    "ZarrDataset",
    "simulate",
]
