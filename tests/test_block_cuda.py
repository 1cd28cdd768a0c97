"""The ``block`` codec's numba.cuda encoder writes the bytes of the torch and numba paths.

No GPU is needed: the kernels run in numba's CUDA simulator, which must be
switched on before numba is imported, hence a subprocess.
"""

from __future__ import annotations

import os
import subprocess
import sys

SCRIPT = r"""
import math, sys
import numpy as np
import torch
from tensorpress.compress import compress_tensor
from tensorpress.compress.block import _chunk_elems, encode_values, steps_for, _PREC
from tensorpress.compress.kernels import block_cuda
from tensorpress.compress.kernels.rounding import PREC_BFLOAT16

assert block_cuda.SIM


def data(n, seed):
    g = np.random.default_rng(seed)
    parts = [
        g.standard_normal(150) * 10,                         # smooth-ish noise
        np.zeros(70),                                        # zero blocks
        np.full(64, -0.0),                                   # negative zeros
        np.full(80, 3.25),                                   # constant
        np.maximum(g.standard_normal(200), 0.0),             # ReLU-like sparse
        np.linspace(-1.0, 1.0, 130),                         # ramp
        np.where(g.random(90) < 0.1, 1e30, 1e-3),            # huge values: raw blocks
        np.array([np.nan, np.inf, -np.inf, 0.0, -0.0, 1e-40, 5e-8, 65519.0, 65521.0]),
        g.standard_normal(100) * 1e4,
        np.round(g.standard_normal(100) * 50),               # integers: ties
        g.standard_normal(100) * 1e-6,
    ]
    x = np.concatenate(parts)
    return np.resize(x, n)


TORCH = {"float64": torch.float64, "float32": torch.float32, "float16": torch.float16,
         "bfloat16": torch.bfloat16}
fails = 0
cases = 0
for dname, n, rows in [("float32", 1393, 17), ("float64", 1393, 23), ("float16", 1393, 19),
                       ("bfloat16", 1393, 19), ("float32", 259, 11)]:
    for mode, val in [("abs", 1e-3), ("abs", 0.0), ("rel", 1e-2), ("pw_rel", 1e-2),
                      ("abs", 0.5)]:
        for seed in (cases,):
            x = data(n, seed).reshape(-1, 7)
            t = torch.from_numpy(x).to(TORCH[dname])
            itemsize = t.element_size()
            ct = compress_tensor(t, codec="block", chunk_bytes=rows * 7 * itemsize,
                                 **{mode: val})
            b = ct.bound
            step, inv = steps_for(b.tolerance)
            pw = b.resolved_mode == "pw_rel"
            ce = _chunk_elems(tuple(t.shape), ct.chunk_rows)
            out, lengths = block_cuda.encode(t, ce, pw, b.tolerance, step, inv)
            got = bytes(out.numpy())
            want = bytes(ct.payload.numpy())
            cases += 1
            tag = f"{dname} n={n} rows={rows} {mode}={val} seed={seed}"
            if list(lengths) != list(ct.lengths) or got != want:
                fails += 1
                print("MISMATCH vs block_torch", tag, lengths[:4], list(ct.lengths)[:4])
                continue
            # the numba CPU kernels (what tensorpress.compress writes), chunk by chunk
            flat, pos = t.reshape(-1), 0
            for i, length in enumerate(lengths):
                chunk = flat[i * ce : (i + 1) * ce]
                if dname == "bfloat16":
                    xv, prec = chunk.float().numpy(), PREC_BFLOAT16
                    rawb = chunk.view(torch.int16).numpy().view(np.uint8)
                else:
                    xv = chunk.numpy()
                    rawb = xv.view(np.uint8)
                    prec = _PREC[dname]
                    xv = xv if itemsize >= 4 else xv.astype(np.float32)
                if got[pos : pos + length] != encode_values(xv, rawb, prec, b):
                    fails += 1
                    print("MISMATCH vs numba", tag, "chunk", i)
                pos += length
            assert pos == len(got) and len(lengths) > 1
# the 16-bit roundings (integer operations on float32 bits) against torch's casts
g = np.random.default_rng(7)
bits = np.concatenate([
    g.integers(0, 2**32, 20000, dtype=np.uint64).astype(np.uint32),
    g.integers(0x33000000, 0x38900000, 20000, dtype=np.uint64).astype(np.uint32),  # f16 subnormals
    np.array([0x477FEFFF, 0x477FF000, 0x477FF001, 0x7F7F7FFF, 0x7F7F8000, 0x7F800000,
              0x7FC00000, 0x00000000, 0x00800000, 0x007FFFFF, 0x00008000, 0x00018000,
              0x33000000, 0x33000001, 0x33C00000], dtype=np.uint32),
])
bits = np.concatenate([bits, bits | np.uint32(0x80000000)])
f32 = torch.from_numpy(bits.view(np.float32).copy())
for rnd, dt in [(block_cuda._round_f16, torch.float16), (block_cuda._round_bf16, torch.bfloat16)]:
    want = f32.to(dt).to(torch.float64).numpy()
    got = np.array([rnd(float(v)) for v in f32.numpy()])
    same = (got.view(np.int64) == want.view(np.int64)) | (np.isnan(got) & np.isnan(want))
    if not same.all():
        fails += 1
        print("ROUNDING", dt, bits[~same][:5])
empty, lengths = block_cuda.encode(torch.zeros(0), 64, False, 0.1, 0.2, 5.0)
assert empty.numel() == 0 and lengths == []
print(f"cases={cases} fails={fails}")
sys.exit(1 if fails else 0)
"""


def test_cuda_kernels_write_the_torch_and_numba_bytes():
    env = {**os.environ, "NUMBA_ENABLE_CUDASIM": "1"}
    res = subprocess.run(
        [sys.executable, "-c", SCRIPT], env=env, capture_output=True, text=True, timeout=300
    )
    assert res.returncode == 0, res.stdout[-4000:] + res.stderr[-4000:]
    assert "fails=0" in res.stdout
