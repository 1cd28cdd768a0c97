"""``psnr=`` with ``sz``'s CDF 9/7 path as an alternative to ``auto``, against ``auto``
alone and SZ3, on the smooth fields.

For each array and PSNR target (dB over the value range) this prints the bits per value
``tp.compress(x, codec="sz", psnr=...)`` writes, the path it kept, the same search with
``auto`` alone (``PSNR_CDF97_RATES`` emptied), and SZ3's bits at the abs bound that
reaches the target (a bisection on the bound, as ours); and the process CPU seconds of
our two searches.

    python benchmarks/psnr_paths.py
    python benchmarks/psnr_paths.py --datasets climate_t2m --targets 50,60
"""

from __future__ import annotations

import argparse
import time

import numpy as np
import tensorpress as tp
from tensorpress.compress.quality import search_bound
from tensorpress.compress.sz import codec as sz_codec

try:
    from corpus import load_corpus
except ImportError:  # imported as benchmarks.psnr_paths
    from benchmarks.corpus import load_corpus

SMOOTH = "grayscott_u,kolmogorov_grf,climate_t2m,grf_2d"


def _ours(x, target: float, alone: bool) -> tuple[bytes, float]:
    saved = sz_codec.PSNR_CDF97_RATES
    if alone:
        sz_codec.PSNR_CDF97_RATES = (1.0, 0.0)  # an empty range: auto alone
    try:
        t0 = time.process_time()
        blob = tp.compress(x, codec="sz", psnr=target)
        return blob, time.process_time() - t0
    finally:
        sz_codec.PSNR_CDF97_RATES = saved


def _sz3_bits(x, target: float) -> float | None:
    """SZ3's bits per value at the loosest abs bound found to reach ``target`` dB."""
    try:
        import pysz
    except ImportError:
        return None
    x = np.ascontiguousarray(x)

    def trial(bound):
        conf = pysz.szConfig(x.shape)
        conf.errorBoundMode = pysz.szErrorBoundMode.ABS  # the default ignores the rel field
        conf.absErrorBound = max(bound, 1e-30)
        blob, _ = pysz.sz.compress(x, conf)
        y, _ = pysz.sz.decompress(blob, x.dtype, x.shape)
        return len(blob), y

    return 8.0 * search_bound(x, target, trial).result / x.size


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--datasets", default=SMOOTH, help="comma-separated corpus arrays")
    p.add_argument("--targets", default="40,50,60,70", help="comma-separated PSNR targets")
    args = p.parse_args()
    corpus = load_corpus([d.strip() for d in args.datasets.split(",") if d.strip()])
    print("| array | dB | bits/value, psnr= | kept | auto alone | gain | SZ3 | CPU s / alone |")
    print("|---|--:|--:|---|--:|--:|--:|--:|")
    for name, x in corpus.items():
        for target in (float(t) for t in args.targets.split(",")):
            blob, cpu = _ours(x, target, alone=False)
            alone, cpu_alone = _ours(x, target, alone=True)
            kept = tp.info(blob)["config"]["predictor"]
            sz3 = _sz3_bits(x, target)
            print(
                f"| {name} | {target:g} | {8 * len(blob) / x.size:.3f} | {kept} | "
                f"{8 * len(alone) / x.size:.3f} | {len(alone) / len(blob):.3f}x | "
                f"{'-' if sz3 is None else f'{sz3:.3f}'} | {cpu / cpu_alone:.2f} |",
                flush=True,
            )


if __name__ == "__main__":
    main()
