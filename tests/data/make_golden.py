"""Write the golden streams of the current format version (run once per version).

    python tests/data/make_golden.py

Each stream is written to tests/data/v<version>/NAME.tp, and manifest.json
records the dtype, shape and SHA-256 of the decoded array. Streams of a
released version are never regenerated: the tests decode them forever.
"""

import hashlib
import json
import pathlib

import numpy as np
import tensorpress as tp
from tensorpress.formats import FORMAT_VERSION


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


def digest(a: np.ndarray) -> str:
    return hashlib.sha256(np.ascontiguousarray(a).tobytes()).hexdigest()


def main():
    out = pathlib.Path(__file__).parent / f"v{FORMAT_VERSION}"
    out.mkdir(exist_ok=True)
    manifest = {}
    for name, x, kw in cases():
        blob = tp.compress(x, **kw)
        (out / f"{name}.tp").write_bytes(blob)
        y = tp.decompress(blob)
        manifest[name] = {
            "dtype": str(y.dtype),
            "shape": list(y.shape),
            "order": "F" if y.flags.f_contiguous and not y.flags.c_contiguous else "C",
            "sha256": digest(y),
        }
    (out / "manifest.json").write_text(json.dumps(manifest, indent=1, sort_keys=True) + "\n")
    print(f"wrote {len(manifest)} streams to {out}")


if __name__ == "__main__":
    main()
