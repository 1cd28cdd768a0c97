"""What ``H5Dataset`` and ``ZarrDataset`` share: a first axis of samples (with optional
labels of their own shape), indexing one sample, and the range checks of their reads.

A subclass sets ``_shape``, ``_dtype``, ``_label_shape``, ``_label_dtype`` (the labels'
full shape and dtype, or None), ``transform`` and ``label_key``, and implements
``_sample(i)`` (sample ``i`` as an array) and ``labels_range``.
"""

from __future__ import annotations

from typing import Any

import numpy as np
from torch.utils.data import Dataset


class SampleDataset(Dataset):
    """A torch map-style dataset of the samples along an array's first axis."""

    _shape: tuple[int, ...]
    _dtype: np.dtype
    _label_shape: tuple[int, ...] | None
    _label_dtype: np.dtype | None

    def __len__(self) -> int:
        """Number of samples."""
        return self._shape[0]

    @property
    def sample_shape(self) -> tuple[int, ...]:
        """Shape of one sample (the array's shape without the first axis)."""
        return self._shape[1:]

    @property
    def dtype(self) -> np.dtype:
        return self._dtype

    @property
    def label_shape(self) -> tuple[int, ...] | None:
        """Shape of one label (None without ``label_key``)."""
        return None if self._label_shape is None else self._label_shape[1:]

    @property
    def label_dtype(self) -> np.dtype | None:
        return self._label_dtype

    def __getitem__(self, index: int) -> Any:
        """Sample ``index`` (negative counts from the end), ``(x, y)`` with labels."""
        if isinstance(index, (bool, np.bool_)) or not isinstance(index, (int, np.integer)):
            raise TypeError(f"sample index must be an integer, got {type(index).__name__}")
        n = len(self)
        i = int(index) + n if index < 0 else int(index)
        if not 0 <= i < n:
            raise IndexError(f"sample index {index} out of range for {n} samples")
        x = self._sample(i)
        if self.transform is not None:
            x = self.transform(x)
        if self.label_key is None:
            return x
        return x, self.labels_range(i, i + 1)[0, ...]

    def _check_range(self, start: int, stop: int) -> None:
        n = len(self)
        if not 0 <= start <= n or not 0 <= stop <= n:
            raise IndexError(f"range {start}..{stop} outside [0, {n}]")
        if stop < start:
            raise ValueError(f"range stop {stop} < start {start}")
