"""HDF5-aware shuffled-index data loading."""

from .buffer import BeladyBuffer, coalesce, next_uses, simulate
from .h5dataset import H5Dataset
from .plan import ShufflePlan

__all__ = ["BeladyBuffer", "H5Dataset", "ShufflePlan", "coalesce", "next_uses", "simulate"]
