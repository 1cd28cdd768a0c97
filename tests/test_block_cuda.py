"""The ``block`` codec's numba.cuda encoder writes the bytes of the torch and numba paths;
its decoder returns the bits of ``block_torch.decode`` and rejects what it rejects.

No GPU is needed: the kernels run in numba's CUDA simulator, which must be
switched on before numba is imported, hence a subprocess.
"""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

SCRIPT = r"""
import math, sys
import numpy as np
import torch
from tensorpress.compress import compress_tensor
from tensorpress.compress.block.codec import PREC_BY_DTYPE, elements_per_chunk
from tensorpress.compress.block.codec import encode_values, steps_for
from tensorpress.compress.block.kernels import cuda as block_cuda, torch_codec as block_torch
from tensorpress.compress.block.kernels.cuda_device import round_bf16, round_f16
from tensorpress.compress.block.kernels.layout import MODE_BLOCKS
from tensorpress.compress.kernels.rounding import PREC_BFLOAT16

# in the simulator (the test) on CPU tensors; on a GPU, without NUMBA_ENABLE_CUDASIM,
# the same checks run the compiled kernels on CUDA tensors against the CPU paths
DEV = "cpu" if block_cuda.SIM else "cuda"


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
        np.full(64, -0.97) * np.finfo(np.float64).max,  # near the largest value
    ]
    x = np.concatenate(parts)
    return np.resize(x, n)


TORCH = {"float64": torch.float64, "float32": torch.float32, "float16": torch.float16,
         "bfloat16": torch.bfloat16}
fails = 0
cases = 0
rejected = 0
for dname, n, rows in [("float32", 1393, 17), ("float64", 1393, 23), ("float16", 1393, 19),
                       ("bfloat16", 1393, 19), ("float32", 259, 11),
                       ("float64", 2597, 50)]:  # blocks of several CUDA blocks' tiles
    for mode, val in [("abs", 1e-3), ("abs", 0.0), ("rel", 1e-2), ("pw_rel", 1e-2),
                      ("abs", 0.5), ("pw_rel", 10.0)]:
        for seed in (cases,):
            x = data(n, seed).reshape(-1, 7)
            t = torch.from_numpy(x).to(TORCH[dname])
            itemsize = t.element_size()
            ct = compress_tensor(t, codec="block", chunk_bytes=rows * 7 * itemsize,
                                 **{mode: val})
            b = ct.bound
            step, inv = steps_for(b.tolerance)
            pw = b.resolved_mode == "pw_rel"
            ce = elements_per_chunk(tuple(t.shape), ct.chunk_rows)
            out, lengths = block_cuda.encode(t.to(DEV), ce, pw, b.tolerance, step, inv)
            got = bytes(out.cpu().numpy())
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
                    prec = PREC_BY_DTYPE[np.dtype(dname)]
                    xv = xv if itemsize >= 4 else xv.astype(np.float32)
                if got[pos : pos + length] != encode_values(xv, rawb, prec, b):
                    fails += 1
                    print("MISMATCH vs numba", tag, "chunk", i)
                pos += length
            assert pos == len(got) and len(lengths) > 1
            # the decoder: the bits of block_torch.decode, the same payloads rejected
            dargs = (t.numel(), ce, t.dtype, pw, step)
            want_v = block_torch.decode(ct.payload, list(ct.lengths), *dargs)
            got_v = block_cuda.decode(out, lengths, *dargs).cpu()
            if not torch.equal(got_v.view(torch.uint8), want_v.view(torch.uint8)):
                fails += 1
                print("DECODE MISMATCH", tag)
            starts = np.cumsum([0] + list(lengths))
            bad_inputs = []
            for i in (0, len(lengths) - 1):  # a chunk one byte short
                short = list(lengths)
                short[i] -= 1
                cut = torch.cat([out[: starts[i + 1] - 1], out[starts[i + 1] :]])
                bad_inputs.append(("truncated", cut, short))
            for i in range(len(lengths)):  # a block width flipped: sizes disagree
                if got[starts[i]] == MODE_BLOCKS:
                    flip = out.clone()
                    flip[starts[i] + 1] ^= 0x10
                    bad_inputs.append(("header", flip, lengths))
            rng = np.random.default_rng(cases)
            for _ in range(6):  # random byte flips: both reject, or both decode alike
                flip = out.clone()
                flip[int(rng.integers(len(got)))] ^= int(rng.integers(1, 256))
                bad_inputs.append(("random", flip, lengths))
            for kind, bad_payload, bad_lengths in bad_inputs:
                res = []
                for dec, dev in ((block_torch.decode, "cpu"), (block_cuda.decode, DEV)):
                    try:
                        v = dec(bad_payload.to(dev), bad_lengths, *dargs)
                        res.append(v.cpu().view(torch.uint8))
                    except ValueError:
                        res.append(None)
                rejected += res[0] is None
                if kind != "random" and (res[0] is not None or res[1] is not None):
                    fails += 1
                    print("NOT REJECTED", kind, tag, [r is None for r in res])
                elif (res[0] is None) != (res[1] is None) or (
                    res[0] is not None and not torch.equal(res[0], res[1])
                ):
                    fails += 1
                    print("CORRUPT DECODE DIFFERS", kind, tag, [r is None for r in res])
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
rounders = [(round_f16, torch.float16), (round_bf16, torch.bfloat16)]
for rnd, dt in rounders if block_cuda.SIM else []:  # device functions: simulator only
    want = f32.to(dt).to(torch.float64).numpy()
    got = np.array([rnd(float(v)) for v in f32.numpy()])
    same = (got.view(np.int64) == want.view(np.int64)) | (np.isnan(got) & np.isnan(want))
    if not same.all():
        fails += 1
        print("ROUNDING", dt, bits[~same][:5])
empty, lengths = block_cuda.encode(torch.zeros(0, device=DEV), 64, False, 0.1, 0.2, 5.0)
assert empty.numel() == 0 and lengths == []
nothing = torch.zeros(0, dtype=torch.uint8, device=DEV)
empty = block_cuda.decode(nothing, [], 0, 64, torch.float32, False, 0.2)
assert empty.numel() == 0 and empty.dtype == torch.float32
for bad_lengths in ([], [5, 5], [0]):
    try:
        block_cuda.decode(torch.zeros(10, dtype=torch.uint8, device=DEV), bad_lengths, 50, 64,
                          torch.float32, False, 0.2)
    except ValueError:
        rejected += 1
    else:
        fails += 1
        print("NOT REJECTED lengths", bad_lengths)
# hand-made sparse blocks (one block of n values, direct codes of w bits): count byte and
# index (kernels/positions.py: two halves' ranks, or a mask) after the codes
from tensorpress.compress.block.kernels import positions as ps


def sparse_block(n, positions, w=3, code=None, index=None):
    # payload of one sparse block with codes 1, 2, 3, ... at positions; code and index
    # ((value, bits) pairs) replace what the encoder would write
    k = len(positions)
    a = sum(p >= 32 for p in positions)
    if code is None:
        code = ps.count_code(k, a)
    if index is None:
        if k <= ps.RANK_MAX:
            lo = [p for p in positions if p < 32]
            hi = [p - 32 for p in positions if p >= 32]
            rank = lambda ps_: sum(math.comb(p, j + 1) for j, p in enumerate(ps_))
            index = [(rank(lo), int(ps.HALF_BITS[min(n, 32), len(lo)])),
                     (rank(hi), int(ps.HALF_BITS[max(n - 32, 0), len(hi)]))]
        else:
            index = [(sum(1 << p for p in positions), n)]
    fields = [((j % (2**w - 1)) + 1, w) for j in range(k)] + index
    acc = sum(v << sum(b for _, b in fields[:i]) for i, (v, _) in enumerate(fields))
    nbytes = (sum(b for _, b in fields) + 7) // 8
    return [2, w | 64, code] + list(acc.to_bytes(nbytes, "little"))


step = steps_for(0.25)[0]
crafted = [
    (50, sparse_block(50, [5, 9]), False),
    (50, sparse_block(50, [5, 49]), False),  # one in each half, the last value
    (50, sparse_block(50, [0, 31, 32, 33, 40, 49]), False),
    (50, sparse_block(50, list(range(0, 50, 2))), False),  # 25 codes: a mask
    (64, sparse_block(64, list(range(1, 64, 3))), False),  # 21 codes: a 64-bit mask
    (50, sparse_block(50, [5, 9], index=[(496, 9), (0, 0)]), True),  # rank C(32, 2)
    (50, sparse_block(50, [5, 49], index=[(5, 5), (18, 5)]), True),  # rank C(18, 1)
    (40, sparse_block(40, [1, 2], code=ps.count_code(10, 9), index=[(0, 8)]), True),
    (50, sparse_block(50, [5, 9], code=255), True),  # no such count byte
    (50, sparse_block(50, [5, 9], code=ps.MASK_BASE + 60), True),  # 60 codes in 50
    (50, sparse_block(50, list(range(0, 50, 2)), index=[((1 << 24) - 1, 50)]), True),
]
for n_vals, blob, reject in crafted:
    res = []
    for dec, dev in ((block_torch.decode, "cpu"), (block_cuda.decode, DEV)):
        try:
            pl = torch.tensor(blob, dtype=torch.uint8, device=dev)
            res.append(dec(pl, [len(blob)], n_vals, n_vals, torch.float32, False, step).cpu())
        except ValueError:
            res.append(None)
    want = None
    if not reject:  # what the numba kernels make of it
        from tensorpress.compress import ErrorBound
        from tensorpress.compress.block.codec import BlockCodec
        bound = ErrorBound("abs", 0.25).resolve(None)  # step = steps_for(0.25)[0]
        want = torch.from_numpy(BlockCodec().decode(bytes(blob), (n_vals,), np.float32, bound))
    if (res[0] is None) != reject or (res[1] is None) != reject or (
        not reject and not (torch.equal(res[0].view(torch.uint8), want.view(torch.uint8))
                            and torch.equal(res[1].view(torch.uint8), want.view(torch.uint8)))
    ):
        fails += 1
        print("CRAFTED", n_vals, blob[:12], [r is None for r in res])
assert rejected > 3 * cases, rejected
print(f"cases={cases} fails={fails} rejected={rejected}")
sys.exit(1 if fails else 0)
"""


@pytest.mark.slow  # the simulator runs every CUDA thread as a Python thread
def test_cuda_kernels_write_the_torch_and_numba_bytes_and_decode_them():
    env = {**os.environ, "NUMBA_ENABLE_CUDASIM": "1"}
    res = subprocess.run(
        [sys.executable, "-c", SCRIPT], env=env, capture_output=True, text=True, timeout=300
    )
    assert res.returncode == 0, res.stdout[-4000:] + res.stderr[-4000:]
    assert "fails=0" in res.stdout
