"""numcodecs' own generic codec checks (numcodecs.tests.common) on tensorpress's codecs.

Which check applies to which codec:

- ``tensorpress.zstd`` is a lossless byte codec, as numcodecs' compressors are: every
  check, exactly, on numcodecs' kinds of test arrays (integers, floats, bool, F order).
- ``tensorpress.sz`` and ``tensorpress.block`` are typed float codecs: an untyped buffer
  (``bytes``) has no dtype to compress, so ``check_encode_decode`` (which encodes
  ``bytes``) and ``check_err_decode_object_buffer`` (which encodes int64) do not apply;
  the rest do, ``check_encode_decode_array`` exactly with ``abs=0`` (lossless) and
  ``check_backwards_compatibility`` within the check's ``precision`` (decimal places).
- ``tensorpress.quant`` (bits-bounded): config, repr, object buffers and golden chunks.

The golden chunks of ``check_backwards_compatibility`` are in tests/data/numcodecs/,
written once by the release that introduced them; they must keep decoding.
"""

from __future__ import annotations

import pathlib

import numpy as np
import pytest
from numcodecs.tests import common
from tensorpress.formats.zarr_codecs import SZ, Block, Quant, Zstd

GOLDEN = pathlib.Path(__file__).parent / "data" / "numcodecs"


def _arrays() -> list[np.ndarray]:
    """numcodecs' kinds of test arrays (as in its test_zstd.py), small."""
    rng = np.random.default_rng(42)
    return [
        np.arange(500, dtype="i4"),
        np.linspace(1000, 1001, 500, dtype="f8"),
        rng.normal(loc=1000, scale=1, size=(50, 10)),
        np.asfortranarray(rng.normal(loc=1000, scale=1, size=(8, 8, 8))),
        rng.integers(0, 2, size=500).astype(bool),
        rng.integers(0, 200, size=500).astype("u1"),
        rng.integers(-(2**40), 2**40, size=(20, 25), dtype="i8"),
        rng.normal(size=(20, 25)).astype("f4"),
        np.asfortranarray(rng.normal(size=(20, 25)).astype("f2")),
    ]


ARRAYS = _arrays()
FLOAT_ARRAYS = [a for a in ARRAYS if a.dtype.kind == "f"]


def _ids(arrays):
    return [f"{a.dtype}{list(a.shape)}{'F' if not a.flags.c_contiguous else ''}" for a in arrays]


# -- tensorpress.zstd: every check, exactly ---------------------------------------------


@pytest.mark.parametrize("arr", ARRAYS, ids=_ids(ARRAYS))
@pytest.mark.parametrize("codec", [Zstd(), Zstd(level=1, shuffle=False)], ids=repr)
def test_zstd_encode_decode(codec, arr):
    """Any buffer in (arrays, bytes, bytearray, array.array), any buffer of the right size
    out (an array of another dtype included: it gets the bytes)."""
    common.check_encode_decode(arr, codec)
    common.check_encode_decode_array(arr, codec)


def test_zstd_object_buffers_are_type_errors():
    common.check_err_decode_object_buffer(Zstd())
    common.check_err_encode_object_buffer(Zstd())


def test_zstd_out_of_another_size_is_still_refused():
    enc = Zstd().encode(np.arange(10, dtype="i8"))
    with pytest.raises(ValueError, match="out is float32 of shape"):
        Zstd().decode(enc, out=np.empty(10, dtype="f4"))  # 40 bytes for 80


# -- the lossy codecs -----------------------------------------------------------------


@pytest.mark.parametrize("arr", FLOAT_ARRAYS, ids=_ids(FLOAT_ARRAYS))
@pytest.mark.parametrize("codec", [SZ(abs=0.0), Block(abs=0.0)], ids=repr)
def test_lossy_codecs_at_bound_zero_round_trip_exactly(codec, arr):
    common.check_encode_decode_array(arr, codec)


@pytest.mark.parametrize("codec", [SZ(abs=1e-3), Block(rel=1e-2), Quant()], ids=repr)
def test_lossy_codecs_refuse_object_arrays_and_object_outs(codec):
    common.check_err_encode_object_buffer(codec)
    enc = codec.encode(np.linspace(0, 1, 10))
    with pytest.raises(TypeError, match="object"):
        codec.decode(enc, out=np.empty(10, dtype=object))


def test_lossy_codecs_refuse_an_out_of_another_dtype():
    """A lossy stream holds floats: an int64 out of the same size is refused, not filled
    with the floats' bits (numcodecs' compressors would reinterpret)."""
    enc = SZ(abs=1e-3).encode(np.linspace(0, 1, 10))
    with pytest.raises(ValueError, match="out is int64"):
        SZ(abs=1e-3).decode(enc, out=np.empty(10, dtype="i8"))


# -- every codec: config and repr ----------------------------------------------------------

CONFIGURED = [
    Zstd(),
    Zstd(level=9, shuffle=False),
    SZ(abs=1e-3),
    SZ(pw_rel=1e-2, predictor="lorenzo", level=5),
    SZ(rel=1e-4, value_range=(-2.5, 7.0)),
    SZ(psnr=60.0, value_range=(0.0, 1.0)),
    Block(rel=1e-3),
    Block(psnr=40, value_range=(-1, 1)),
    Quant(bits=8, group=64),
]


@pytest.mark.parametrize("codec", CONFIGURED, ids=repr)
def test_config(codec):
    common.check_config(codec)


#: each statement is the codec's repr: eval(repr) builds an equal codec
REPRS = [
    "Zstd(level=3, shuffle=True)",
    "SZ(abs=0.001, predictor='auto', alpha=None, beta=None, radius=32768, level=None)",
    "SZ(rel=0.001, value_range=[0.0, 2.0], resolved_abs=0.002, predictor='auto', "
    "alpha=None, beta=None, radius=32768, level=None)",
    "Block(pw_rel=0.01)",
    "Block(psnr=20.0, value_range=[0.0, 10.0], resolved_abs=1.0)",
    "Quant(bits=4, group=128, stochastic=False, seed=0, hadamard=False)",
]


@pytest.mark.parametrize("stmt", REPRS)
def test_repr(stmt, monkeypatch):
    # check_repr evaluates in its own module, which holds numcodecs' names: add ours
    for cls in (SZ, Block, Quant, Zstd):
        monkeypatch.setattr(common, cls.__name__, cls, raising=False)
    common.check_repr(stmt)


# -- golden chunks ---------------------------------------------------------------------------

#: codec id -> (codecs, the decimal places each must match to, None: exactly)
GOLDEN_CODECS = {
    "tensorpress.zstd": ([Zstd(), Zstd(level=1, shuffle=False)], [None, None]),
    "tensorpress.sz": ([SZ(abs=1e-3), SZ(abs=0.0)], [3, None]),
    "tensorpress.block": ([Block(abs=1e-3), Block(abs=0.0)], [3, None]),
    "tensorpress.quant": ([Quant(bits=8, group=64)], [1]),
}


@pytest.mark.parametrize("codec_id", GOLDEN_CODECS)
def test_backwards_compatibility(codec_id, monkeypatch):
    codecs, precision = GOLDEN_CODECS[codec_id]
    arrays = ARRAYS if codec_id == "tensorpress.zstd" else FLOAT_ARRAYS
    stored = GOLDEN / "fixture" / codec_id
    # the check writes what is missing: insist it is all there, so it only reads
    want = [stored / f"array.{i:02d}.npy" for i in range(len(arrays))] + [
        stored / f"codec.{j:02d}" / f"encoded.{i:02d}.dat"
        for j in range(len(codecs))
        for i in range(len(arrays))
    ]
    missing = [str(p.relative_to(GOLDEN)) for p in want if not p.is_file()]
    assert not missing, f"golden chunks missing (write them with the release): {missing[:3]}"
    monkeypatch.chdir(GOLDEN)
    common.check_backwards_compatibility(codec_id, arrays, codecs, precision=precision)
