"""Test data shared by several test files: smooth fields like simulation output."""

from __future__ import annotations

import numpy as np


def smooth(shape, dtype, seed):
    """A random walk along every axis (a smooth field with a red spectrum), as ``dtype``."""
    x = np.random.default_rng(seed).standard_normal(shape)
    for ax in range(len(shape)):
        x = np.cumsum(x, axis=ax)
    return x.astype(dtype)
