"""PSNR targets of a compress job to zarr, resolved over the whole variable on the
workers, as ``tp.compress`` resolves them over the whole array.

Each trial bound is one task per region of the variable: the worker compresses its
region through the variable's own zarr chunking, fill value and serializer (in memory),
decodes it and returns the squared error and count of its finite, valid cells and the
bytes of its chunks; the sums give the PSNR of the whole variable over its finite value
range (the distributed min/max of ``rel``) and its stored bytes. The chunks a trial
encodes are the ones the job then writes, so the PSNR a search reaches is the written
variable's. The search is ``compress/quality.py``'s, over the codec's paths as
``tp.compress`` searches them (psnr_paths.py).
"""

from __future__ import annotations

import math

import numpy as np

from ..compress.bounds import ErrorBound
from ..compress.quality import Trial, search_span
from .psnr_paths import search_paths
from .zarr_source import read_region


def psnr_of(span: float, sse: float, count: int) -> float:
    """PSNR in dB of errors summing to ``sse`` (squared, over ``count`` cells) on data
    of value range ``span``: inf when exact, as ``compress.quality.psnr`` gives it."""
    if count == 0 or sse == 0.0:
        return math.inf
    if not (span > 0 and math.isfinite(sse)):
        return -math.inf
    return 20.0 * math.log10(span) - 10.0 * math.log10(sse / count)


def roundtrip(block: np.ndarray, array: dict) -> tuple[np.ndarray, int]:
    """(``block`` written to and read back from an in-memory zarr array laid out as
    ``array`` says (``chunks``, ``shards``, ``fill``, ``serializer``: its zarr dict), the
    bytes of its chunks (or shards) there)."""
    import zarr

    from ..formats.zarr_codecs import SERIALIZERS

    codec = array["serializer"]
    stored: dict = {}  # key -> Buffer: "zarr.json" and the chunks' "c/..."
    out = zarr.create_array(
        store=zarr.storage.MemoryStore(stored),
        shape=block.shape,
        chunks=tuple(array["chunks"]),
        shards=None if array["shards"] is None else tuple(array["shards"]),
        dtype=block.dtype,
        fill_value=array["fill"],
        serializer=SERIALIZERS[codec["name"]].from_dict(codec),
        compressors=None,
    )
    out[...] = block
    nbytes = sum(len(v) for k, v in stored.items() if k.split("/")[0] == "c")
    return np.asarray(out[...]), nbytes


def psnr_task(spec: dict) -> tuple[float, int, int]:
    """(sum of squared errors, count) over the finite, valid cells of the spec's region
    compressed as ``spec["array"]`` lays it out, and the bytes its chunks take."""
    block = read_region(spec["src"], spec["kind"], spec["path"], spec["region"])
    back, nbytes = roundtrip(block, spec["array"])
    valid = np.isfinite(block)
    if spec.get("missing") is not None:
        valid &= ~spec["missing"].mask(block)
    diff = np.subtract(block[valid], back[valid], dtype=np.float64)
    return float(np.dot(diff, diff)), int(diff.size), nbytes


def search_psnr(gather, specs: list, span: float, target: float, codec, layout) -> tuple:
    """(the abs ErrorBound found for ``target`` dB, the target record, the codec kept) of
    one variable: ``specs`` its regions' task specs, ``span`` its finite value range,
    ``codec`` the codec as given, ``layout(c, bound)`` the ``array`` dict of a trial of
    codec ``c`` under an abs ``bound``, ``gather(fn, specs, name)`` the results of tasks
    (raising when one fails). Each path ``codec`` offers at the rate its search reached
    is searched too, and the fewest bytes kept (the record's ``path`` says which)."""

    def search(candidate) -> Trial:
        def measure(bound: float) -> Trial:
            array = layout(candidate, ErrorBound("abs", bound).resolve_range(0.0, 0.0))
            results = gather(psnr_task, [{**s, "array": array} for s in specs], "tp-psnr")
            sse = math.fsum(r[0] for r in results)
            count, nbytes = sum(r[1] for r in results), sum(r[2] for r in results)
            return Trial(bound, psnr_of(span, sse, count), nbytes)

        return search_span(span, target, measure)

    values = sum(math.prod(b - a for a, b in s["region"]) for s in specs)
    codec, best, path = search_paths(codec, values, search)
    reached = best.psnr if math.isfinite(best.psnr) else None
    return ErrorBound("abs", best.bound), {"psnr": target, "psnr_reached": reached, **path}, codec
