"""HDF5-aware shuffled-index data loading."""

from .buffer import BeladyBuffer, coalesce, next_uses, simulate
from .dataloader import DataLoader
from .h5dataset import H5Dataset
from .plan import ShufflePlan

__all__ = [
    "BeladyBuffer",
    "DataLoader",
    "H5Dataset",
    "ShufflePlan",
    "coalesce",
    "next_uses",
    "simulate",
]
