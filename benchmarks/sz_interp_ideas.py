"""QoZ's and HPEZ's ideas for ``sz``'s interpolation, measured one by one.

For each array and bound (``rel`` of the value range) this prints:

  level-wise   ``auto``'s ratio with its level-wise bounds (each interpolation's
               ``choice.LEVEL_TUNINGS``) over ``auto`` with every level at the bound
               itself (alpha = beta = 1), and over ``auto`` with the multi-dimensional
               cubic sampled tightened only (its set before the untightened was added)
  anchor grid  the share of the interpolation's code bits (order-0 entropy of the codes)
               spent on the points of stride 32 and more, the points an anchor grid of
               stride 32 would store instead; storing them losslessly costs 32 bits each
               (float32), so the grid can save at most the share less that cost
  per block    the order-0 code bits with the best predictor per block (32^3 or 64^2)
               among Lorenzo, linear, cubic (both dimension orders) and the
               multi-dimensional cubic (both tunings), over those of the best single one:
               an upper bound on what choosing per block (HPEZ) saves, before the side
               information and the changed neighbours

    python benchmarks/sz_interp_ideas.py
    python benchmarks/sz_interp_ideas.py --datasets grf_2d --bounds 1e-3
"""

from __future__ import annotations

import argparse
import sys

import numpy as np
import tensorpress as tp
from tensorpress.compress.kernels.rounding import prec_of
from tensorpress.compress.sz import choice
from tensorpress.compress.sz.ids import (
    CUBIC,
    CUBIC_REV,
    LINE_INTERP,
    LINEAR,
    LINEAR_REV,
    LORENZO,
    MD_CUBIC,
)
from tensorpress.compress.sz.interpolation import eb_levels
from tensorpress.compress.sz.kernels.interp_md import md_decode
from tensorpress.compress.sz.kernels.interpolation import interp_decode, interp_num_levels
from tensorpress.compress.sz.steps import encode_with, fold_shape

try:
    from corpus import load_corpus
except ImportError:  # imported as benchmarks.sz_interp_ideas
    from benchmarks.corpus import load_corpus

SMOOTH = "grayscott_u,grayscott_v,kolmogorov_grf,smooth_2d,turbulence_u,climate_t2m,grf_2d"
RADIUS = 32768
#: the candidates of the per-block bound: (predictor id, alpha, beta)
PER_BLOCK = (
    (LORENZO, 1.0, 1.0),
    (LINEAR, 1.0, 1.0),
    (CUBIC, 1.0, 1.0),
    (LINEAR_REV, 1.0, 1.0),
    (CUBIC_REV, 1.0, 1.0),
    (MD_CUBIC, 1.0, 1.0),
    (MD_CUBIC, 1.25, 2.0),
)
#: the anchor grid's stride (QoZ's default in 3-d)
ANCHOR_STRIDE = 32


def auto_ratio(x: np.ndarray, eb: float, tunings: dict | None = None) -> float:
    """``auto``'s compression ratio of ``x`` at ``abs=eb`` (one thread), with
    ``choice.LEVEL_TUNINGS`` replaced by ``tunings`` while it runs, if given."""
    saved = dict(choice.LEVEL_TUNINGS)
    try:
        if tunings is not None:
            choice.LEVEL_TUNINGS.update(tunings)
        return x.nbytes / len(tp.compress(x, codec="sz", abs=eb, workers=1))
    finally:
        choice.LEVEL_TUNINGS.update(saved)


def level_wise(x: np.ndarray, eb: float) -> tuple[float, float]:
    """``auto``'s ratio over its ratio untightened, and over the earlier cubic set."""
    ratio = auto_ratio(x, eb)
    untightened = auto_ratio(x, eb, {k: ((1.0, 1.0),) for k in choice.LEVEL_TUNINGS})
    earlier = auto_ratio(x, eb, {MD_CUBIC: ((1.25, 2.0),)})
    return ratio / untightened, ratio / earlier


def traversal(pred: int, shape3: tuple) -> np.ndarray:
    """The position in the code stream of each element (C order) under interpolation
    ``pred``: decoding all-outlier codes puts outlier ``i`` where code ``i`` goes."""
    n = int(np.prod(shape3))
    out = np.zeros(shape3, np.float64)
    codes, order = np.zeros(n, np.uint16), np.arange(n, dtype=np.float64)
    levels = eb_levels(shape3, 1.0, 1.0, 1.0)
    if pred == MD_CUBIC:
        md_decode(codes, order, levels, RADIUS, 0, True, out)
    else:
        cubic = pred in (CUBIC, CUBIC_REV)
        interp_decode(codes, order, levels, RADIUS, 0, cubic, out, LINE_INTERP[pred])
    return out.reshape(-1).astype(np.int64)


def entropy_bits(codes: np.ndarray) -> np.ndarray:
    """Each code's order-0 entropy in bits, under the histogram of all of them."""
    counts = np.bincount(codes.astype(np.int64))
    return -np.log2(counts[codes.astype(np.int64)] / codes.size)


def stride_of(shape3: tuple) -> np.ndarray:
    """Per element (C order), the largest power of two dividing all its coordinates
    along the dimensions longer than 1 (capped at 2**interp_num_levels)."""
    cap = 1 << interp_num_levels(shape3)
    stride = np.full(int(np.prod(shape3)), cap, np.int64)
    for d, coord in enumerate(np.indices(shape3).reshape(3, -1)):
        if shape3[d] > 1:
            low = np.where(coord == 0, cap, coord & -coord)
            stride = np.minimum(stride, low)
    return stride


def block_ids(shape3: tuple, side: int) -> np.ndarray:
    """Per element (C order), the index of its block of ``side`` per dimension."""
    nb = tuple(-(-n // side) for n in shape3)
    coords = np.indices(shape3).reshape(3, -1) // side
    return np.ravel_multi_index(tuple(coords), nb)


def code_bits_per_element(x: np.ndarray, eb: float, cand: tuple) -> np.ndarray:
    """Each element's code bits (C order) under predictor ``cand``, outliers as 32 bits
    more, so blocks sum comparably."""
    values = x.reshape(-1)
    codes, _ = encode_with(cand, values, x.shape, eb, prec_of(x.dtype), RADIUS)
    bits = entropy_bits(codes) + 32.0 * (codes == 0)
    if cand[0] == LORENZO:  # C order already
        return bits
    return bits[traversal(cand[0], fold_shape(x.shape, 3))]


def anchors_and_blocks(x: np.ndarray, eb: float) -> tuple[float, float, float]:
    """(share of the best interpolation's bits at strides >= ANCHOR_STRIDE, the lossless
    anchors' bits as a share of the same total, per-block bound)."""
    shape3 = fold_shape(x.shape, 3)
    side = 32 if sum(n > 1 for n in shape3) == 3 else 64
    blocks = block_ids(shape3, side)
    per_cand = [code_bits_per_element(x, eb, c) for c in PER_BLOCK]
    sums = np.array([np.bincount(blocks, weights=b) for b in per_cand])
    totals = sums.sum(axis=1)
    per_block = sums.min(axis=0).sum() / totals.min()
    interps = [i for i, c in enumerate(PER_BLOCK) if c[0] != LORENZO]
    best = min(interps, key=lambda i: totals[i])
    coarse = stride_of(shape3) >= ANCHOR_STRIDE
    share = per_cand[best][coarse].sum() / totals[best]
    anchors = 8.0 * x.dtype.itemsize * np.count_nonzero(coarse) / totals[best]
    return share, anchors, per_block


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--datasets", default=SMOOTH, help="comma-separated corpus arrays")
    p.add_argument("--bounds", default="1e-3,1e-4", help="comma-separated rel bounds")
    args = p.parse_args()
    corpus = load_corpus([d.strip() for d in args.datasets.split(",") if d.strip()])
    print("| array | rel | level-wise: / untightened | / earlier cubic set | "
          "anchor grid: bits at stride >= 32 | its lossless cost | per block: bound |")  # fmt: skip
    print("|---|---|---|---|---|---|---|")
    for name, x in corpus.items():
        for rel in (float(b) for b in args.bounds.split(",")):
            eb = rel * (float(x.max()) - float(x.min()))
            tight, earlier = level_wise(x, eb)
            share, anchors, per_block = anchors_and_blocks(x, eb)
            print(
                f"| {name} | {rel:g} | {tight:.3f} | {earlier:.3f} | {100 * share:.2f}% | "
                f"{100 * anchors:.2f}% | {per_block:.3f} |",
                flush=True,
            )
    sys.stdout.flush()


if __name__ == "__main__":
    main()
