"""Compressing an HDF5 (netCDF-4) file or a zarr store into a zarr v3 store, on Dask.

The job, in order: describe the input (groups, attributes, dimension names); plan each
variable (chunks aligned to the input's, lossy or lossless); resolve ``rel`` bounds on
the whole variable (one distributed min/max over valid cells) and PSNR targets (the
same search as ``tp.compress``, each trial compressing the whole variable on the
workers: zarr_psnr.py); create the arrays in
``DST.partial``; then one task per output chunk or shard, which writes, reads back,
checks every element and marks it; commit when every chunk is marked (zarr_commit.py).
"""

from __future__ import annotations

import json
import math
import os
import secrets
import time
from dataclasses import dataclass, field

import numpy as np

from ..compress.bounds import ErrorBound
from ..formats.missing import MAX_MARKERS
from ..formats.stream_writer import DEFAULT_CHUNK_BYTES
from .compress import ALL_MISSING
from .dask_engine import task_runner
from .output import DatasetReport
from .plan import Plan, PsnrTarget
from .zarr_commit import commit, hide_root, marked, record_plan, start
from .zarr_plan import VarPlan, plan_variable
from .zarr_psnr import search_psnr
from .zarr_source import describe, name_dimensions, source_kind
from .zarr_task import JobIncomplete, combine_ranges, range_task, write_task

__all__ = ["BOUND_ATTR", "JobIncomplete", "ZarrJob", "compress_to_zarr"]

#: attribute of a compressed variable: its bound as given and as resolved (JSON text)
BOUND_ATTR = "tensorpress_bound"


@dataclass
class ZarrJob:
    """What a compress job to zarr did: one report per variable; chunk tasks in all,
    written by this run and skipped (verified by an earlier run); workers (processes)."""

    reports: list = field(default_factory=list)
    chunks: int = 0
    written: int = 0
    skipped: int = 0
    workers: int = 1
    seconds: float = 0.0


def compress_to_zarr(
    src,
    dst,
    bound,
    *,
    overrides=None,
    codec="sz",
    codec_options=None,
    chunk_bytes=DEFAULT_CHUNK_BYTES,
    shard_bytes=None,
    chunk_samples=None,
    workers=None,
    scheduler=None,
    overwrite=False,
    progress=None,
) -> ZarrJob:
    """Compress input ``src`` (HDF5, netCDF-4 or zarr) into the zarr v3 store ``dst``.

    ``bound``/``overrides``/``codec``/``codec_options`` as :func:`compress_file` takes
    them; ``chunk_bytes``: input bytes per output chunk, about (whole input chunks);
    ``shard_bytes``: bytes per shard (None: unsharded); ``chunk_samples``: each
    compressed variable's chunks hold this many samples (rows along its first axis,
    whole along the others: a shuffled DataLoader reads each chunk once per epoch);
    ``workers``: processes of a local Dask cluster; ``scheduler``: an existing one (tcp
    address or scheduler file) or "inline" (this process); ``progress(done_in,
    total_in, done_out)`` (bytes) after each chunk. A rerun after a failure resumes from
    ``dst + ".partial"``.
    """
    t0 = time.perf_counter()
    src, dst = os.path.abspath(os.fspath(src)), os.path.abspath(os.fspath(dst)).rstrip("/")
    plan = Plan(
        codec,
        codec_options,
        bound,
        overrides,
        chunk_bytes=chunk_bytes,
        chunk_samples=chunk_samples,
    )
    if plan.codec.lossy and not plan.codec.bounded:
        raise ValueError(
            f"codec {plan.codec.name} has no error bound to check each chunk against: "
            "use sz, block or zstd for a zarr output"
        )
    kind = source_kind(src)
    groups, variables = describe(src)
    name_dimensions(variables)
    plan.check_names([v.path for v in variables])
    vplans = [plan_variable(v, plan, shard_bytes) for v in variables]
    settings = _settings(src, plan, shard_bytes)
    partial, recorded = start(dst, settings, overwrite)
    with task_runner(workers, scheduler) as runner:
        if recorded is None:
            recorded = _setup(runner, src, kind, partial, groups, vplans, plan)
        job = _run_chunks(runner, src, kind, partial, vplans, recorded, progress)
    root = {"tensorpress": {"source": os.path.basename(src), "codec": plan.codec.name}}
    commit(partial, dst, root, overwrite)
    job.seconds = time.perf_counter() - t0
    return job


def _settings(src: str, plan: Plan, shard_bytes) -> dict:
    """What a rerun must repeat to resume (JSON): the input as it was, codec, bounds."""
    st = os.stat(src)

    def text(b):
        return None if b is None else repr(b)

    return {
        "source": src,
        "source_mtime_ns": st.st_mtime_ns,
        "codec": plan.codec.get_config(),
        "bound": text(plan.default),
        "overrides": {k: text(v) for k, v in sorted(plan.overrides.items())},
        "chunk_bytes": plan.chunk_bytes,
        "shard_bytes": shard_bytes,
        "chunk_samples": plan.chunk_samples,
    }


def _setup(runner, src, kind, partial, groups, vplans: list, plan: Plan) -> dict:
    """Resolve the bounds, create the groups and arrays in ``partial``, record the plan."""
    bounds = _resolve_bounds(runner, src, kind, vplans, plan)
    import zarr

    for path, attrs in groups.items():
        zarr.create_group(store=partial, path=path, attributes=attrs)
    recorded = {"job": secrets.token_hex(6), "variables": {}}
    for vp in vplans:
        bound, span, target, codec = bounds.get(vp.var.path, (None, None, None, plan.codec))
        bound = _create_array(partial, vp, codec, bound, span, target)
        recorded["variables"][vp.var.path] = {
            "chunks": list(vp.chunks),
            "shards": None if vp.shards is None else list(vp.shards),
            "bound": _bound_record(bound, target),
            "codec": codec.get_config() if vp.lossy else None,
            "note": vp.note,
        }
    hide_root(partial)
    record_plan(partial, recorded)
    return recorded


def _resolve_bounds(runner, src, kind, vplans: list, plan: Plan) -> dict:
    """{path: (resolved ErrorBound, the (lo, hi) a rel bound was resolved on or None, the
    PSNR target record or None, the codec to write with)} of the lossy variables: rel
    and PSNR on the whole variable's valid cells (one min/max task per region, reduced
    here; then, for a PSNR target, the search of zarr_psnr.py over every region, which
    may keep another path of the codec)."""
    specs = [
        _spec(src, kind, vp, r)
        for vp in vplans
        if vp.lossy and plan.codec.bounded and _needs_range(vp)
        for r in vp.regions()
    ]
    found: dict = {}
    for spec, result in zip(specs, _gather(runner, range_task, specs, "tp-range"), strict=True):
        found.setdefault(spec["path"], []).append(result)
    out = {}
    for vp in vplans:
        if not vp.lossy or not plan.codec.bounded:
            continue
        results = found.get(vp.var.path, [])
        if max((r["missing"] for r in results), default=0) > MAX_MARKERS:
            vp.lossy, vp.bound = False, None
            vp.note = f"lossless: over {MAX_MARKERS} distinct values outside its valid range"
            continue
        span = combine_ranges([r["range"] for r in results])
        if isinstance(vp.bound, PsnrTarget):
            out[vp.var.path] = _psnr_bound(runner, src, kind, vp, plan, span)
        elif vp.bound.mode == "rel":
            out[vp.var.path] = (vp.bound.resolve_range(*span), span, None, plan.codec)
        else:
            out[vp.var.path] = (vp.bound.resolve_range(0.0, 0.0), None, None, plan.codec)
    return out


def _needs_range(vp: VarPlan) -> bool:
    """Whether a lossy variable's regions are read before writing: for the value range
    of a rel bound or PSNR target, or to count the distinct values outside a valid range
    (each takes a marker in a chunk's stream: formats/missing.py)."""
    spec = vp.var.missing
    valid = spec is not None and (spec.lo is not None or spec.hi is not None)
    return valid or isinstance(vp.bound, PsnrTarget) or vp.bound.mode == "rel"


def _gather(runner, fn, specs: list, name: str) -> list:
    """The results of ``fn`` over ``specs`` (in their order); JobIncomplete, before
    anything is written, when a task fails."""
    results = {}
    for spec, result in runner.run(fn, specs, name):
        if isinstance(result, Exception):
            raise JobIncomplete(
                f"{spec['path']} could not be read or measured ({type(result).__name__}: "
                f"{result}); nothing was written: rerun the command"
            ) from result
        results[id(spec)] = result
    return [results[id(s)] for s in specs]


def _psnr_bound(runner, src, kind, vp: VarPlan, plan: Plan, span: tuple) -> tuple:
    """(abs ErrorBound, None, target record, codec kept) reaching the variable's PSNR
    target over the whole variable, each trial compressed on the workers (zarr_psnr.py);
    the codec's other paths are searched too and the fewest bytes kept."""

    def layout(codec, bound: ErrorBound) -> dict:
        serializer, _ = _serializer(codec, bound, None, vp)
        return {
            "chunks": vp.chunks,
            "shards": vp.shards,
            "fill": _fill(vp),
            "serializer": serializer.to_dict(),
        }

    specs = [_spec(src, kind, vp, r) for r in vp.regions()]
    bound, target, codec = search_psnr(
        lambda fn, s, name: _gather(runner, fn, s, name),
        specs,
        span[1] - span[0],
        vp.bound.psnr,
        plan.codec,
        layout,
    )
    return bound.resolve_range(0.0, 0.0), None, target, codec


def _bound_record(bound: ErrorBound | None, target: dict | None) -> dict | None:
    """A bound as the job records it: its dict, with the PSNR ``target`` record."""
    if bound is None:
        return None
    return bound.to_dict() if target is None else {**bound.to_dict(), "target": target}


def _missing_values(vp: VarPlan) -> list:
    return [] if vp.var.missing is None else [float(v) for v in vp.var.missing.values]


def _fill(vp: VarPlan) -> float | None:
    """The fill value of a variable's array: its first missing value, else NaN for a
    lossy one (padding left out of every range), else None (zarr's default)."""
    values = _missing_values(vp)
    if values:
        return values[0]
    return np.nan if vp.lossy else None


def _spec(src: str, kind: str, vp: VarPlan, region: tuple) -> dict:
    return {
        "src": src,
        "kind": kind,
        "path": vp.var.path,
        "region": region,
        "index": vp.index_of(region),
        "missing": vp.var.missing,
    }


def _create_array(partial: str, vp: VarPlan, codec, bound, span, target=None) -> ErrorBound | None:
    """The zarr v3 array of ``vp`` in ``partial``: ``codec`` (the plan's, or the path a
    PSNR search kept) as serializer for a lossy (or lossless tensorpress) variable, its
    metadata recording the bound as given, the value range a rel bound was resolved on
    and the resolved abs (and a PSNR ``target`` record); zarr's default codecs for the
    others. Returns the bound the chunks are held to."""
    import zarr

    var = vp.var
    attrs = dict(var.attrs)
    kwargs = {}
    if vp.lossy:
        serializer, bound = _serializer(codec, bound, span, vp)
        if bound is not None:
            attrs[BOUND_ATTR] = json.dumps(_bound_record(bound, target))
        kwargs = {"serializer": serializer, "compressors": None}
    zarr.create_array(
        store=partial,
        name=var.path,
        shape=var.shape,
        chunks=vp.chunks or "auto",
        shards=vp.shards,
        dtype=str if var.dtype == "str" else np.dtype(var.dtype),
        fill_value=_fill(vp),
        dimension_names=var.dims or None,
        attributes=attrs,
        overwrite=True,
        **kwargs,
    )
    return bound


def _serializer(codec, bound, span, vp: VarPlan) -> tuple:
    """(``codec``'s zarr serializer for variable ``vp``, its config naming the path a
    PSNR search kept (e.g. its predictor); its bound with the tolerance the serializer
    resolved): a rel bound with the whole variable's ``span`` (lo, hi), other bounds as
    resolved; missing values kept bit for bit; a CF valid range kept (cells outside it
    exact, decoded values clamped into it)."""
    from ..formats.zarr_codecs import SERIALIZERS

    params = {k: v for k, v in codec.get_config().items() if k != "id"}
    missing = _missing_values(vp)
    if missing:
        params["missing"] = missing
    spec = vp.var.missing
    if codec.lossy and spec is not None and (spec.lo is not None or spec.hi is not None):
        params["valid_range"] = [spec.lo, spec.hi]
    if bound is not None and span is not None:
        params.update(rel=bound.value, value_range=list(span))
    elif bound is not None:
        params[bound.resolved_mode] = bound.tolerance
    serializer = SERIALIZERS[f"tensorpress.{codec.name}"](**params)
    resolved = serializer.to_dict()["configuration"].get("resolved_abs")
    if resolved is not None:  # the one the chunks are encoded with
        bound = ErrorBound(bound.mode, bound.value, float(resolved))
    return serializer, bound


def _run_chunks(runner, src, kind, partial, vplans: list, recorded: dict, progress) -> ZarrJob:
    """Write every chunk (or shard) not yet marked; reports from the markers."""
    job = ZarrJob(workers=runner.workers)
    todo, total_in, done_in, done_out = [], 0, 0, 0
    for vp in vplans:
        entry = recorded["variables"][vp.var.path]
        vp.chunks, vp.shards = tuple(entry["chunks"]), entry["shards"] and tuple(entry["shards"])
        vp.lossy, vp.note = entry["codec"] is not None, entry.get("note", vp.note)
        bound = entry["bound"]
        for region in vp.regions():
            spec = _spec(src, kind, vp, region)
            job.chunks += 1
            if marked(partial, vp.var.path, spec["index"]) is not None:
                job.skipped += 1
                continue
            spec.update(partial=partial, job=recorded["job"])
            spec.update(tolerance=bound and bound["tolerance"], mode=bound and bound["mode"])
            if spec["mode"] == "rel":
                spec["mode"] = "abs"
            todo.append(spec)
            total_in += _region_bytes(vp, region)
    failed = []
    for spec, result in runner.run(write_task, todo, "tp-write"):
        if isinstance(result, Exception):
            failed.append((spec, result))
            continue
        job.written += 1
        done_in, done_out = done_in + result["in"], done_out + result["out"]
        if progress is not None:
            progress(done_in, total_in, done_out)
    if failed:
        spec, exc = failed[0]
        raise JobIncomplete(
            f"{len(failed)} of {len(todo)} chunk task(s) failed (first: {spec['path']} "
            f"{'.'.join(map(str, spec['index']))}: {type(exc).__name__}: {exc}); "
            f"{job.chunks - len(failed)} of {job.chunks} chunks are verified in {partial}: "
            "rerun the same command to finish (verified chunks are kept)"
        )
    job.reports = [_report(partial, vp, recorded) for vp in vplans]
    return job


def _region_bytes(vp: VarPlan, region: tuple) -> int:
    itemsize = 1 if vp.var.dtype == "str" else np.dtype(vp.var.dtype).itemsize
    return math.prod(b - a for a, b in region) * itemsize


def _report(partial: str, vp: VarPlan, recorded: dict) -> DatasetReport:
    """A variable's report from its markers (bytes in and out, the largest error)."""
    stats = [marked(partial, vp.var.path, vp.index_of(r)) or {} for r in vp.regions()]
    bound = recorded["variables"][vp.var.path]["bound"]
    var = vp.var
    # as the HDF5 path says it (files/compress.py); chunks marked without a count (by an
    # earlier version) say nothing
    counts = [s.get("numbers") for s in stats]
    empty = bool(var.shape) and bool(counts) and all(c == 0 for c in counts)
    note = vp.note if not empty else f"{vp.note}; {ALL_MISSING}" if vp.note else ALL_MISSING
    return DatasetReport(
        var.path,
        vp.lossy,
        var.shape,
        "str" if var.dtype == "str" else np.dtype(var.dtype).name,
        recorded["variables"][vp.var.path].get("codec"),
        bound,
        var.nbytes if var.dtype != "str" else sum(s.get("in", 0) for s in stats),
        sum(s.get("out", 0) for s in stats),
        0.0,
        note,
    )
