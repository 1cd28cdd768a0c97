"""bfloat16 in the container: ``bytes(compress_tensor(t))`` for a bfloat16 tensor is a
stream (header dtype "bfloat16") that ``tp.compress`` writes byte for byte from the same
tensor or from a numpy array of ``ml_dtypes.bfloat16``, and that ``tp.decompress``,
``ContainerReader`` and ``decompress_tensor`` read back with the same bits."""

from __future__ import annotations

import math

import ml_dtypes
import numpy as np
import pytest
import tensorpress as tp
import torch
from hypothesis import given
from tensorpress.compress import compress_tensor, decompress_tensor
from tensorpress.files import decompress_file
from tensorpress.formats import ContainerReader, FormatError, tensor_from_stream, tensor_to_stream
from test_block import BLOCK_CASES, block_kwargs
from test_bound_properties import FAST, assert_contract

BF16 = ml_dtypes.bfloat16


def _tensor(shape=(300, 7), seed=0) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    t = (torch.randn(*shape, generator=g) * 10).to(torch.bfloat16)
    flat = t.view(-1)
    flat[0], flat[5], flat[9], flat[11] = math.nan, math.inf, -math.inf, -0.0
    return t


def _as_numpy(t: torch.Tensor) -> np.ndarray:
    return t.contiguous().view(torch.int16).numpy().view(BF16)


def _bits(a) -> np.ndarray:
    if isinstance(a, torch.Tensor):
        return a.contiguous().view(torch.int16).numpy().reshape(-1)
    return np.asarray(a, order="C").view(np.int16).reshape(-1)


CODECS = [
    ("block", {"rel": 1e-2}),
    ("block", {"abs": 0.5}),
    ("block", {"pw_rel": 1e-2}),
    ("block", {"abs": 0.0}),
    ("quant", {"bits": 2}),
    ("quant", {"bits": 8, "stochastic": True, "seed": 3}),
]


@pytest.mark.parametrize(("codec", "kw"), CODECS, ids=[f"{c}-{k}" for c, k in CODECS])
def test_tensor_and_array_write_the_same_stream(codec, kw):
    t = _tensor()
    ct = compress_tensor(t, codec, chunk_bytes=1000, **kw)
    blob = tensor_to_stream(ct)
    assert len(ct.lengths) > 1  # several chunks
    assert tp.compress(t, codec=codec, chunk_bytes=1000, **kw) == blob
    assert tp.compress(_as_numpy(t), codec=codec, chunk_bytes=1000, **kw) == blob
    assert tp.info(blob)["dtype"] == "bfloat16"
    assert tp.info(blob)["original_bytes"] == t.numel() * 2

    want = _bits(decompress_tensor(ct))
    y = tp.decompress(blob)
    assert y.dtype == BF16 and y.shape == tuple(t.shape)
    assert np.array_equal(_bits(y), want)
    back = decompress_tensor(tensor_from_stream(blob))
    assert back.dtype == torch.bfloat16 and np.array_equal(_bits(back), want)


def test_rows_decode_alone():
    t = _tensor((300, 7))
    blob = tp.compress(t, codec="block", rel=1e-2, chunk_bytes=500)
    whole = tp.decompress(blob)
    reader = ContainerReader(blob)
    assert reader.dtype == BF16 and reader.header.nchunks > 5
    for key in (slice(33, 97), slice(0, 1), slice(290, 300), slice(None, None, -7), 150, -1):
        assert np.array_equal(_bits(reader[key]), _bits(whole[key]))
    out = np.empty((10, 7), BF16)
    assert reader.read_rows(40, 50, out=out) is out
    assert np.array_equal(_bits(out), _bits(whole[40:50]))


@FAST
@given(case=BLOCK_CASES)
def test_bound_holds_on_every_element(case):
    x = case.array()
    with np.errstate(over="ignore", invalid="ignore"):  # beyond bfloat16's range: +-inf
        x16 = x.astype(BF16)  # the layout (C, F or strided) is kept
    kw = block_kwargs(case, x16.astype(np.float64))
    del kw["workers"]
    blob = tp.compress(x16, **kw)
    y = tp.decompress(blob)
    assert_contract(x16, y, blob)
    layout = "F" if x16.ndim > 1 and x16.flags.f_contiguous and not x16.flags.c_contiguous else "C"
    assert tp.info(blob)["order"] == layout
    assert y.flags.f_contiguous if layout == "F" else y.flags.c_contiguous


def test_codecs_without_a_bfloat16_path_say_what_to_do():
    t = _tensor((20,))
    with pytest.raises(TypeError, match="codec='block'"):
        tp.compress(t, codec="sz", rel=1e-2)
    with pytest.raises(TypeError, match="codec='block'"):
        tp.compress(_as_numpy(t), codec="zstd")


def test_corrupted_bfloat16_stream_raises():
    blob = bytearray(tp.compress(_tensor(), codec="block", rel=1e-2))
    blob[-3] ^= 0x10
    with pytest.raises(FormatError):
        tp.decompress(bytes(blob))
    with pytest.raises(FormatError):
        tensor_from_stream(bytes(blob))


def test_files_take_bfloat16_only_as_raw_bytes(tmp_path):
    t = _tensor((40, 5))
    src = tmp_path / "x.tp"
    src.write_bytes(tp.compress(t, codec="block", abs=0.25))
    for name in ("x.npy", "x.h5"):
        with pytest.raises(ValueError, match="bfloat16"):
            decompress_file(src, tmp_path / name)
        assert not (tmp_path / name).exists()
    decompress_file(src, tmp_path / "x.bin")
    raw = np.fromfile(tmp_path / "x.bin", dtype="<i2")
    assert np.array_equal(raw, _bits(tp.decompress(src.read_bytes())))


def test_ml_dtypes_is_imported_only_for_bfloat16():
    """Its import takes about 0.4 s: ``import tensorpress`` and float streams skip it."""
    import subprocess
    import sys

    code = (
        "import sys, numpy as np, tensorpress as tp\n"
        "y = tp.decompress(tp.compress(np.ones(9, np.float32), rel=1e-2))\n"
        "assert 'ml_dtypes' not in sys.modules, 'ml_dtypes imported for float32'\n"
        "import torch\n"
        "t = torch.ones(9, dtype=torch.bfloat16)\n"
        "y = tp.decompress(tp.compress(t, codec='block', rel=1e-2))\n"
        "assert str(y.dtype) == 'bfloat16' and 'ml_dtypes' in sys.modules\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True, timeout=600)
