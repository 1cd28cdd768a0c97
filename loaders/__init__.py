"""HDF5-aware shuffled-index data loading."""

from .h5dataset import H5Dataset
from .plan import ShufflePlan

__all__ = ["H5Dataset", "ShufflePlan"]
