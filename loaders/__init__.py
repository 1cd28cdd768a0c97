"""HDF5-aware shuffled-index data loading."""

from .plan import ShufflePlan

__all__ = ["ShufflePlan"]
