"""bfloat16 data with missing values (``missing=``): the zarr codecs and their value
ranges do not take bfloat16, and say so in one line with what to pass, for numpy and
torch data alike; the same values cast to float32 keep their missing cells bit for bit."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from tensorpress.formats import zarr_bounds
from tensorpress.formats import zarr_codecs as zc
from tensorpress.formats.stream_reader import bfloat16


def _data():
    t = torch.linspace(-1, 1, 64).to(torch.bfloat16)
    t[3] = -1000
    return t, t.view(torch.int16).numpy().view(bfloat16())


@pytest.mark.parametrize("kind", ["numpy", "torch"])
def test_bfloat16_with_missing_values_says_to_cast(kind):
    t, x = _data()
    data = x if kind == "numpy" else t
    calls = (
        lambda: zarr_bounds.value_range(data, missing=[-1000]),
        lambda: zarr_bounds.resolve_bound(data, rel=1e-2, missing=[-1000]),
        lambda: zc.SZ.for_array(data, rel=1e-2, missing=[-1000]),
        lambda: zc.Block.for_array(data, rel=1e-2, missing=[-1000]),
    )
    for call in calls:
        with pytest.raises(TypeError, match=r"bfloat16 data: .*cast it first"):
            call()
    with pytest.raises(TypeError, match="not bfloat16"):
        zc.Block(abs=1e-2, missing=[-1000]).encode(x)


def test_cast_to_float32_keeps_the_missing_cells():
    _, x = _data()
    y = x.astype(np.float32)
    codec = zc.Block.for_array(y, rel=1e-2, missing=[-1000])
    back = np.asarray(codec.decode(codec.encode(y))).reshape(-1)
    assert back[3] == -1000.0 and back.view(np.uint32)[3] == y.view(np.uint32)[3]
    keep = np.arange(y.size) != 3
    tol = 1e-2 * 2  # rel of the range [-1, 1] of the cells that are not missing
    assert np.all(np.abs(back[keep].astype(np.float64) - y[keep]) <= tol)
