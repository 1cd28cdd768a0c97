"""Write the golden files of the current format version (run once per version).

    python tests/data/make_golden.py          # container streams
    python tests/data/make_golden.py hdf5     # the compressed HDF5 file

Each new stream is written to tests/data/v<version>/NAME.tp (existing ones are
kept), and manifest.json records the dtype, shape and SHA-256 of the decoded array. The compressed
HDF5 file is tests/data/v<version>/hdf5_mixed.h5, described per dataset in
manifest_hdf5.json; it is written when the HDF5 layout's version changes (still
1: tests/data/v1/hdf5_mixed.h5; its tests expect the marker's version to be the
directory's). Files of a released version are never regenerated: the tests
decode them forever.

Exception: the ``block_*`` streams of v1 were written in ``block``'s first chunk
layout (mode 0), which was dropped; they were written again in the current one
(delete them and run this script: their decoded values, and so the manifest, are
unchanged). tests/data/block_first_layout_f32.tp keeps the first layout's
``block_f32_mixed`` to check that such a stream is refused with a clear error.
"""

import hashlib
import json
import pathlib
import sys
import tempfile

import ml_dtypes
import numpy as np
import tensorpress as tp
from tensorpress.formats.stream_header import FORMAT_VERSION


def _smooth(shape, dtype, seed):
    rng = np.random.default_rng(seed)
    x = rng.standard_normal(shape)
    for ax in range(len(shape)):
        x = np.cumsum(x, axis=ax)
    return x.astype(dtype)


def cases():
    specials = _smooth((40, 33), np.float32, 3)
    specials[3, 4], specials[10, 0], specials[20, 32] = np.nan, np.inf, -np.inf
    signed = _smooth((25, 20), np.float64, 5)
    signed[0, :3] = [0.0, -0.0, 1e-300]
    yield "sz_f32_2d_rel", _smooth((64, 48), np.float32, 0), {"rel": 1e-3}
    yield "sz_f64_3d_abs", _smooth((12, 10, 9), np.float64, 1), {"abs": 1e-2}
    yield "sz_f16_1d_rel", _smooth((500,), np.float16, 2), {"rel": 1e-2}
    yield "sz_f32_specials", specials, {"abs": 0.05}
    yield "sz_f64_pw_rel", signed, {"pw_rel": 1e-3}
    yield (
        "sz_f32_4d_lorenzo",
        _smooth((3, 4, 5, 6), np.float32, 4),
        {"rel": 1e-2, "predictor": "lorenzo"},
    )
    yield (
        "sz_f32_cubic_chunks",
        _smooth((30, 40), np.float32, 6),
        {"rel": 1e-4, "predictor": "cubic", "chunk_bytes": 1000},
    )
    yield "sz_f32_constant_lossless", np.full((10, 10), 2.5, np.float32), {"rel": 1e-3}
    yield "sz_f32_empty", np.zeros((0, 5), np.float32), {"abs": 1.0}
    yield "sz_f64_scalar", np.array(3.14159), {"abs": 1e-3}
    yield "zstd_i32", np.arange(-500, 500, dtype=np.int32).reshape(10, 100), {"codec": "zstd"}
    yield "zstd_f32_fortran", np.asfortranarray(_smooth((7, 9), np.float32, 7)), {"codec": "zstd"}
    kernels = np.random.default_rng(8).standard_normal((16, 8, 3, 3)).astype(np.float32)
    kernels += np.linspace(0, 1, 9, dtype=np.float32).reshape(3, 3)
    yield "sz_f32_kernels_as_1d", kernels, {"rel": 1e-3}  # sz flag bit 1
    yield "block_f32_mixed", _block_mix(np.float32, 9), {"codec": "block", "rel": 1e-2}
    yield "block_f64_pw_rel", _block_mix(np.float64, 10), {"codec": "block", "pw_rel": 1e-3}
    yield "block_f16_abs", _block_mix(np.float16, 11), {"codec": "block", "abs": 0.01}
    # block-aligned, with sparse blocks of every index kind
    yield "block2_f32_mixed", _block_mix2(np.float32, 12), {"codec": "block", "rel": 1e-2}
    yield "block2_f64_pw_rel", _block_mix2(np.float64, 13), {"codec": "block", "pw_rel": 1e-3}
    yield "block2_f16_abs", _block_mix2(np.float16, 14), {"codec": "block", "abs": 0.01}
    # bfloat16 (the "bfloat16" header dtype), written through the codecs' torch paths
    bf16 = _block_mix2(ml_dtypes.bfloat16, 15)
    yield "block2_bf16_rel", bf16, {"codec": "block", "rel": 1e-2}
    yield "quant_bf16_4bit", bf16, {"codec": "quant", "bits": 4}
    # int8: chunks of codes and a raw chunk (a NaN and values past 127 steps)
    mixed = np.random.default_rng(16).uniform(-1.0, 1.0, (12, 50)).astype(np.float32)
    mixed[8, 3], mixed[9, 0] = np.nan, 40.0
    yield "int8_f32_abs", mixed, {"codec": "int8", "abs": 0.01, "chunk_bytes": 800}
    wave = np.sin(np.linspace(0.0, 6.0, 600)).reshape(30, 20)
    yield "int8_f64_rel", wave, {"codec": "int8", "rel": 1e-2}
    # a bytes-to-bytes stage after the codec
    rows = np.maximum(np.random.default_rng(18).standard_normal((4, 64)), 0.0)
    stages = [{"id": "zstd", "level": 3, "checksum": True}]
    yield (
        "block_zstd_f32",
        np.tile(rows, (16, 1)).astype(np.float32),
        {
            "codec": "block",
            "abs": 1e-3,
            "stages": stages,
        },
    )
    # block's entropy mode: chunks in mode 3 (zstd over the packed blocks), 2 and 1 (raw)
    yield (
        "block_entropy_f32",
        _entropy_mix(np.float32, 19),
        {
            "codec": {"id": "block", "entropy": "zstd"},
            "rel": 1e-2,
            "chunk_bytes": 2048,
        },
    )
    # a PSNR target: the header records it beside the bound it chose
    yield "sz_f32_psnr", _smooth((48, 40), np.float32, 20), {"psnr": 60.0}
    # sz's multi-dimensional interpolation (predictors 4, 5) and constant prediction (6)
    yield (
        "sz_f32_md_cubic_3d",
        _smooth((20, 18, 17), np.float32, 21),
        {"rel": 1e-3, "predictor": "md-cubic"},
    )
    yield (
        "sz_f64_md_linear_2d",
        _smooth((33, 30), np.float64, 22),
        {"abs": 1e-2, "predictor": "md-linear", "alpha": 1.5, "beta": 4.0},
    )
    noise = np.random.default_rng(23).standard_normal((40, 50)).astype(np.float16)
    noise[5, 7] = np.nan  # a patch; values past 3.1 are outliers (radius 32)
    yield "sz_f16_constant", noise, {"abs": 0.05, "predictor": "constant", "radius": 32}
    # sz flag bit 2: unrelated channels coded as 2-d (all dimensions but the last merged)
    channels = np.stack([_smooth((24, 24), np.float32, 30 + c) * (c + 1) for c in range(12)])
    yield "sz_f32_channels_2d", channels.reshape(3, 4, 24, 24), {"rel": 1e-3}
    # sz's block-wise Lorenzo or linear regression (predictor 7): steps between blocks
    steps = np.repeat(np.repeat(np.random.default_rng(31).uniform(-4, 4, (3, 4, 5)), 6, 0), 6, 1)
    ramps = _smooth((18, 24, 30), np.float64, 32) * 0.05 + np.repeat(steps, 6, 2)
    yield "sz_f32_regression_3d", ramps.astype(np.float32), {"rel": 1e-3, "predictor": "regression"}
    yield "sz_f64_regression_pw_rel", ramps[4], {"pw_rel": 1e-2, "predictor": "regression"}
    # sz's interpolation with each level's dimensions in the reverse order (predictors 8, 9)
    yield (
        "sz_f32_linear_rev_3d",
        _smooth((14, 19, 23), np.float32, 33),
        {"rel": 1e-3, "predictor": "linear-rev", "alpha": 1.125, "beta": 2.0},
    )
    yield (
        "sz_f64_cubic_rev_2d",
        _smooth((37, 29), np.float64, 34),
        {"abs": 1e-2, "predictor": "cubic-rev"},
    )
    # sz's lossless coding of lattice indices (predictor 10): whole numbers from 236 under
    # a bound below 1, a NaN patch, outliers (radius 16); and halves in float16
    dem = np.rint(_smooth((31, 45), np.float64, 35) * 4 + 236.0)
    dem[3, 4] = np.nan
    yield "sz_f32_lattice_2d", dem.astype(np.float32), {"abs": 0.4, "radius": 16}
    halves = np.rint(_smooth((6, 7, 50), np.float64, 36)) * 0.5
    yield "sz_f16_lattice_3d", halves.astype(np.float16), {"abs": 0.2, "predictor": "lattice"}
    # sz's fitted causal prediction (predictor 11): a smooth volume with a grid-scale
    # ripple, a NaN patch and outliers (radius 16); float64 under pw_rel (log domain)
    ripple = _smooth((9, 20, 24), np.float64, 37) * (1 + 0.2 * (-1.0) ** np.arange(24))
    ripple[2, 3, 4] = np.nan
    yield (
        "sz_f32_fitted_3d",
        ripple.astype(np.float32),
        {"rel": 1e-3, "predictor": "fitted", "radius": 16},
    )
    yield (
        "sz_f64_fitted_pw_rel",
        _smooth((30, 40), np.float64, 38) + 3.0,
        {"pw_rel": 1e-3, "predictor": "fitted"},
    )
    # sz's row-match prediction (predictor 12): rows drawn from a few token rows plus a
    # small position term, with a NaN and outliers (radius 16); float64 under pw_rel
    tokens = _tokens((3, 10, 256), 39)
    tokens[1, 4, 7] = np.nan
    yield (
        "sz_f32_match_rows",
        tokens.astype(np.float32),
        {"rel": 1e-3, "predictor": "match", "radius": 16},
    )
    yield "sz_f64_match_pw_rel", _tokens((24, 300), 40), {"pw_rel": 1e-3, "predictor": "match"}
    # sz's pivot prediction (predictor 13): rows in a space of dimensions of decaying
    # scale (two levels), with a NaN and outliers (radius 16); float64 under pw_rel (one
    # level, in log2|x|)
    low = _low_rank((2, 64, 96), 41, rank=40, decay=0.8)
    low[1, 7, 50] = np.nan
    yield (
        "sz_f32_pivot_rows",
        low.astype(np.float32),
        {"rel": 1e-4, "predictor": "pivot", "radius": 16},
    )
    signs = np.where(np.arange(64) % 7 == 0, -1.0, 1.0)
    yield (
        "sz_f64_pivot_pw_rel",
        signs * 2.0 ** _low_rank((80, 64), 42),
        {"pw_rel": 1e-4, "predictor": "pivot"},
    )
    wave = _smooth((20, 24, 28), np.float32, 43)
    wave[2, 3, 4] = np.nan
    wave[5, 6, 7] = 1e30  # past the largest bin: a fix
    yield "sz_f32_wavelet_3d", wave, {"abs": 0.01, "predictor": "wavelet", "radius": 64}
    yield (
        "sz_f16_wavelet_2d",
        _smooth((37, 41), np.float16, 44),
        {"rel": 1e-3, "predictor": "wavelet"},
    )
    yield (
        "sz_f64_wavelet_pw_rel",
        signs[:40] * 2.0 ** _smooth((30, 40), np.float64, 45) / 50,
        {"pw_rel": 1e-3, "predictor": "wavelet"},
    )
    cdf = _smooth((20, 24, 28), np.float32, 46)
    cdf[2, 3, 4] = np.nan
    cdf[5, 6, 7] = 40.0  # a spike: corrections around it
    yield "sz_f32_cdf97_3d", cdf, {"abs": 0.01, "predictor": "cdf97", "radius": 64}
    yield "sz_f16_cdf97_2d", _smooth((37, 41), np.float16, 47), {"rel": 1e-3, "predictor": "cdf97"}
    yield (
        "sz_f64_cdf97_pw_rel",
        signs[:40] * 2.0 ** _smooth((30, 40), np.float64, 48) / 50,
        {"pw_rel": 1e-3, "predictor": "cdf97"},
    )
    planes = _smooth((12, 14, 16), np.float32, 61)
    planes[1, 2, 3] = np.nan
    planes[4, 5, 6] = 3 * float(np.max(planes))  # a spike: corrections around it
    yield "sz_f32_cdf97_planes_3d", planes, {"rel": 1e-3, "predictor": "cdf97"}
    cube = _smooth((3, 5, 12, 16), np.float64, 62)
    yield "sz_f64_cdf97_planes_4d", cube, {"rel": 1e-4, "predictor": "cdf97"}
    fixes = _smooth((16, 18, 20), np.float32, 63)
    fixes[2, 3, 4] = np.inf
    fixes[5, 6, 7] = -2 * float(np.max(np.abs(fixes)))
    yield "sz_f32_cdf97_fixes_3d", fixes, {"rel": 1e-3, "predictor": "cdf97"}
    yield (
        "sz_f16_cdf97_fixes_2d",
        _smooth((30, 31), np.float16, 67),
        {"rel": 1e-3, "predictor": "cdf97"},
    )


def _tokens(shape, seed, vocab=5):
    """Rows (the last dimension) each one of ``vocab`` random rows plus a small term."""
    rng = np.random.default_rng(seed)
    rows = int(np.prod(shape[:-1]))
    table = rng.standard_normal((vocab, shape[-1]))
    x = table[rng.integers(0, vocab, rows)] + 0.01 * rng.standard_normal((rows, shape[-1]))
    return x.reshape(shape)


def _low_rank(shape, seed, rank=3, decay=1.0):
    """Rows (the last dimension) in a ``rank``-dimensional space, the scale of its k-th
    dimension ``decay**k``, plus a small term."""
    rng = np.random.default_rng(seed)
    rows = int(np.prod(shape[:-1]))
    coords = rng.standard_normal((rows, rank)) * decay ** np.arange(rank)
    x = coords @ rng.standard_normal((rank, shape[-1]))
    return (x + 1e-3 * rng.standard_normal((rows, shape[-1]))).reshape(shape)


def _entropy_mix(dtype, seed):
    """Rows of GELU outputs (where zstd over the packed blocks pays), of uniform noise
    (where it does not) and of NaN (a raw chunk)."""
    rng = np.random.default_rng(seed)
    g = rng.standard_normal((24, 64))
    gelu = 0.5 * g * (1 + np.tanh(0.7978845608 * (g + 0.044715 * g**3)))
    noise = rng.uniform(-2.0, 4.0, (8, 64))
    gaps = np.full((8, 64), np.nan)
    return np.concatenate([gelu[:16], noise, gaps, gelu[16:]]).astype(dtype)


def _block_mix(dtype, seed):
    """Every kind of ``block`` block: dense, sparse (ranks and masks), differences,
    signed and unsigned codes, all-zero, constant and raw blocks, blocks not aligned
    to the input's parts, a partial last block."""
    rng = np.random.default_rng(seed)
    parts = [
        np.full(64, np.nan),  # not codable, all equal: stored as one value
        np.cumsum(rng.standard_normal(200)) * 0.05,  # smooth: differences
        rng.standard_normal(130),  # noise: signed codes
        np.abs(rng.standard_normal(64)),  # unsigned codes
        np.zeros(128),  # all-zero blocks
        np.where(rng.random(64) < 0.1, 2.0, 0.0),  # a few non-zeros: ranks
        np.maximum(rng.standard_normal(192), 0.0),  # ReLU-like: mask
        np.where(rng.random(64) < 0.05, np.nan, 1.0),  # NaN: raw
        [np.inf, -np.inf, -0.0, 0.0, 1e-40],
        np.linspace(-3.0, 3.0, 37),  # partial last block
    ]
    return np.concatenate(parts).astype(dtype)


def _block_mix2(dtype, seed):
    """:func:`_block_mix`, block-aligned: sparse blocks whose positions
    are ranked (up to 14 non-zero codes, in either half or both) or masked, and a sparse
    partial last block."""
    rng = np.random.default_rng(seed)

    def sparse(n, p, value=2.0):
        return np.where(rng.random(n) < p, value, 0.0)

    parts = [
        np.full(64, np.nan),  # not codable, all equal: stored as one value
        np.cumsum(rng.standard_normal(192)) * 0.05,  # smooth: differences
        rng.standard_normal(128),  # noise: signed codes
        np.abs(rng.standard_normal(64)),  # unsigned codes
        np.zeros(128),  # all-zero blocks
        sparse(128, 0.08),  # a few non-zeros: ranks
        sparse(192, 0.18, -3.0),  # about 11: ranks of both halves
        np.concatenate([np.zeros(32), sparse(32, 0.3)]),  # the second half only
        np.concatenate([sparse(32, 0.3), np.zeros(32)]),  # the first half only
        sparse(128, 0.3),  # about 19: masks
        np.maximum(rng.standard_normal(192), 0.0),  # ReLU-like: masks
        np.where(rng.random(64) < 0.05, np.nan, 1.0),  # NaN: raw
        np.resize([np.inf, -np.inf, -0.0, 0.0, 1e-40], 64),
        sparse(50, 0.2),  # a sparse partial last block
    ]
    return np.concatenate(parts).astype(dtype)


def digest(a: np.ndarray) -> str:
    return hashlib.sha256(np.ascontiguousarray(a).tobytes()).hexdigest()


def main():
    out = pathlib.Path(__file__).parent / f"v{FORMAT_VERSION}"
    out.mkdir(exist_ok=True)
    listed = out / "manifest.json"
    manifest = json.loads(listed.read_text()) if listed.exists() else {}
    for name, x, kw in cases():
        if (out / f"{name}.tp").exists():  # written once, decoded forever
            continue
        blob = tp.compress(x, **kw)
        (out / f"{name}.tp").write_bytes(blob)
        y = tp.decompress(blob)
        manifest[name] = {
            "dtype": str(y.dtype),
            "shape": list(y.shape),
            "order": "F" if y.flags.f_contiguous and not y.flags.c_contiguous else "C",
            "sha256": digest(y),
        }
    listed.write_text(json.dumps(manifest, indent=1, sort_keys=True) + "\n")
    print(f"{len(manifest)} streams listed in {listed}")


def write_hdf5_source(path):
    """The HDF5 file whose compressed form is the golden file."""
    import h5py

    with h5py.File(path, "w") as f:
        f.attrs["title"] = "golden"
        x = f.create_dataset("coords/x", data=np.linspace(0.0, 1.0, 30))
        x.make_scale("x")
        g = f.create_group("run1")
        g.attrs["step"] = np.int32(3)
        t = g.create_dataset("temperature", data=_smooth((30, 20, 10), np.float32, 10))
        t.attrs["units"] = "K"
        t.dims[0].attach_scale(x)
        t.dims[0].label = "x"
        g.create_dataset("pressure", data=_smooth((30, 7), np.float64, 11), fillvalue=-1.0)
        g.create_dataset("wind", data=_smooth((5, 4, 3, 2), np.float16, 12))
        f.create_dataset("counts", data=np.arange(30, dtype=np.int16))
        f.create_dataset("scalar", data=np.float32(1.5))


def main_hdf5():
    from tensorpress.files import compress_file
    from tensorpress.formats import open_compressed as open_file

    out = pathlib.Path(__file__).parent / f"v{FORMAT_VERSION}"
    dst = out / "hdf5_mixed.h5"
    if dst.exists():
        sys.exit(f"{dst} exists: golden files are never regenerated")
    with tempfile.TemporaryDirectory() as tmp:
        src = pathlib.Path(tmp) / "source.h5"
        write_hdf5_source(src)
        compress_file(
            src,
            dst,
            {"rel": 1e-3},
            overrides={"pressure": {"pw_rel": 1e-3}, "wind": {"abs": 0.05}},
            chunk_bytes=2000,
            workers=1,
        )
    manifest = {}
    with open_file(dst) as f:
        for name, ds in f.items():
            y = ds.read()
            manifest[name] = {
                "compressed": ds.compressed,
                "dtype": y.dtype.str,
                "shape": list(y.shape),
                "sha256": digest(y),
            }
    path = out / "manifest_hdf5.json"
    path.write_text(json.dumps({"hdf5_mixed": manifest}, indent=1, sort_keys=True) + "\n")
    print(f"wrote {dst} with {len(manifest)} datasets")


if __name__ == "__main__":
    main_hdf5() if sys.argv[1:] == ["hdf5"] else main()
