"""Where ``sz`` decompression spends its time, per array and bound, beside SZ3's.

For every corpus array and bound (``eb = rel * value range``, as in ``compressors.py``)
this compresses once with ``tp.compress(codec="sz", workers=1)`` and with SZ3 (pysz,
its default algorithm, ABS bound ``eb``), then decodes both ``--repeat`` times,
interleaved, and prints per array: the decode times (ms) of tensorpress and SZ3, SZ3's
time over tensorpress's (the decompress speed ratio, above 1 is faster), the predictor
of the first chunk, and tensorpress's time in its stages: zstd, Huffman tables and
decoding, the code summary, the predictor's reconstruction (``predict``), patches, and
the container around the codec (``outside``). At the end, the speed ratio's geometric
mean per bound.

Times are the process's CPU time (``time.process_time_ns``: every thread's, so a
library's helper threads count too), medians: on a machine shared with other jobs they
move far less than wall-clock times.

    python benchmarks/sz_decode_stages.py
    python benchmarks/sz_decode_stages.py --datasets aero,grf_2d --bounds 1e-4 --repeat 9
"""

from __future__ import annotations

import argparse
import math
import statistics
import time

import numpy as np

try:
    from compressors import _sz3_codecs
    from corpus import NAMES, load_corpus
except ImportError:  # imported as benchmarks.sz_decode_stages
    from benchmarks.compressors import _sz3_codecs
    from benchmarks.corpus import NAMES, load_corpus

STAGES = ("zstd", "huffman tables", "huffman", "summary", "predict", "patches", "deliver")


class StageTimer:
    """Wraps the names ``sz/codec.py`` decodes through, summing each one's CPU time
    (ns) into ``totals``; ``predictor`` is the id of the last chunk's predictor."""

    def __init__(self):
        import tensorpress.compress.sz.codec as sz_codec

        self.totals: dict[str, int] = {}
        self.predictor = -1
        self.module = sz_codec
        self.saved = {}
        wrap = {
            "zstd_decompress": "zstd",
            "code_summary": "summary",
            "decode_with": "predict",
            "read_patches": "patches",
            "deliver": "deliver",
        }
        for name, stage in wrap.items():
            self._wrap(name, stage)
        self._wrap_huffman()
        self._wrap_codec()

    def _timed(self, stage, fn):
        def timed(*args, **kwargs):
            t0 = time.process_time_ns()
            try:
                return fn(*args, **kwargs)
            finally:
                self.totals[stage] = self.totals.get(stage, 0) + time.process_time_ns() - t0

        return timed

    def _wrap(self, name, stage):
        fn = getattr(self.module, name)
        self.saved[name] = fn
        if name == "decode_with":
            inner = fn

            def fn(choice, *args, **kwargs):
                self.predictor = int(choice[0])
                return inner(choice, *args, **kwargs)

        setattr(self.module, name, self._timed(stage, fn))

    def _wrap_huffman(self):
        base = self.module.HuffmanDecoder
        self.saved["HuffmanDecoder"] = base
        timer = self

        class Decoder(base):
            def __init__(self, *args):
                t0 = time.process_time_ns()
                super().__init__(*args)
                timer.add("huffman tables", time.process_time_ns() - t0)

            def finish(self):
                t0 = time.process_time_ns()
                symbols = super().finish()
                timer.add("huffman", time.process_time_ns() - t0)
                return symbols

        self.module.HuffmanDecoder = Decoder

    def _wrap_codec(self):
        cls = self.module.SZCodec
        self.saved["SZCodec.decode"] = cls.decode
        cls.decode = self._timed("codec", cls.decode)

    def add(self, stage, ns):
        self.totals[stage] = self.totals.get(stage, 0) + ns

    def restore(self):
        for name, fn in self.saved.items():
            if name == "SZCodec.decode":
                self.module.SZCodec.decode = fn
            else:
                setattr(self.module, name, fn)


def measure(x, rel, repeat, sz3, timer):
    """One array at one bound: ``(tp ms, sz3 ms, stage ms, predictor id)``."""
    import tensorpress as tp

    eb = rel * float(np.float64(x.max()) - np.float64(x.min()))
    blob = tp.compress(x, abs=eb, codec="sz", workers=1)
    sblob = sz3.encode(x, rel, eb)
    tp.decompress(blob, workers=1)
    sz3.decode(sblob, x.shape, x.dtype)
    tp_ns, sz3_ns, stages = [], [], []
    for _ in range(repeat):  # interleaved: both see the same machine
        timer.totals.clear()
        t0 = time.process_time_ns()
        tp.decompress(blob, workers=1)
        tp_ns.append(time.process_time_ns() - t0)
        stages.append(dict(timer.totals))
        t0 = time.process_time_ns()
        sz3.decode(sblob, x.shape, x.dtype)
        sz3_ns.append(time.process_time_ns() - t0)
    med = {k: statistics.median(s.get(k, 0) for s in stages) / 1e6 for k in stages[0]}
    tp_ms = statistics.median(tp_ns) / 1e6
    med["outside"] = tp_ms - med.pop("codec", 0.0)
    return tp_ms, statistics.median(sz3_ns) / 1e6, med, timer.predictor


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--datasets", default=",".join(NAMES), help="comma-separated corpus arrays")
    ap.add_argument("--bounds", default="1e-2,1e-3,1e-4", help="value-range-relative bounds")
    ap.add_argument("--repeat", type=int, default=7, help="decodes per codec (median)")
    args = ap.parse_args(argv)
    notes: list[str] = []
    sz3 = next((c for c in _sz3_codecs(notes) if c.name == "sz3"), None)
    if sz3 is None:
        raise SystemExit("pysz (SZ3) is not installed: nothing to compare with")
    corpus = load_corpus()
    names = args.datasets.split(",")
    bounds = [float(b) for b in args.bounds.split(",")]
    timer = StageTimer()
    speeds: dict[float, list[float]] = {b: [] for b in bounds}
    try:
        for name in names:
            for rel in bounds:
                tp_ms, sz3_ms, med, pred = measure(corpus[name], rel, args.repeat, sz3, timer)
                speeds[rel].append(sz3_ms / tp_ms)
                cells = " ".join(f"{k}={med.get(k, 0.0):.2f}" for k in (*STAGES, "outside"))
                print(
                    f"{name:18s} {rel:<6g} pred {pred:2d}  tp {tp_ms:8.2f} ms  sz3 {sz3_ms:8.2f} ms"
                    f"  speed {sz3_ms / tp_ms:5.3f}  | {cells}",
                    flush=True,
                )
    finally:
        timer.restore()
    for rel, s in speeds.items():
        geo = math.exp(sum(math.log(v) for v in s) / len(s))
        print(f"rel {rel:g}: decompress speed tp / sz3, geometric mean over {len(s)}: {geo:.3f}")


if __name__ == "__main__":
    main()
