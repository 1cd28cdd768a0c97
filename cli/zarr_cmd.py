"""``tensorpress compress SRC DST.zarr``: the compress job to a zarr v3 store, on Dask."""

from __future__ import annotations

import contextlib
import importlib.util
import math
import os
import sys
import time

from .errors import Terminated, UserError
from .output import finite_or_none, size_text


def is_zarr_path(path: str) -> bool:
    """Whether ``path`` names a zarr store: ending in .zarr (or .zarr.partial, an
    unfinished job's), or a directory."""
    name = os.fspath(path).rstrip("/").lower()
    return name.endswith((".zarr", ".zarr.partial")) or os.path.isdir(path)


class ZarrProgress:
    """One tqdm bar for the whole job (input bytes), its postfix the bytes written and
    the running ratio; off with ``quiet`` or off a TTY."""

    def __init__(self, quiet: bool):
        self.disable = True if quiet else None
        self.bar = None
        self.done = 0

    def __call__(self, done_in: int, total_in: int, done_out: int) -> None:
        if self.bar is None:
            from tqdm import tqdm

            self.bar = tqdm(
                total=total_in,
                desc="compress",
                unit="B",
                unit_scale=True,
                unit_divisor=1000,
                file=sys.stderr,
                disable=self.disable,
                leave=False,
                dynamic_ncols=True,
            )
        self.bar.update(done_in - self.done)
        self.done = done_in
        ratio = done_in / done_out if done_out else math.inf
        self.bar.set_postfix_str(f"out {size_text(done_out)}, ratio {ratio:.2f}", refresh=False)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        if self.bar is not None:
            self.bar.close()


def run_compress_zarr(args, codec: str, codec_options: dict, bound, overrides: dict) -> dict:
    """``tensorpress compress SRC DST.zarr``: the job on Dask; the summary document."""
    _require_extras(args.scheduler)
    from ..files.zarr_out import compress_to_zarr

    if args.dtype is not None or args.shape is not None or args.container:
        raise UserError("--dtype, --shape and --container do not apply to a .zarr OUTPUT")
    if args.layout is not None:
        raise UserError("--layout is how an HDF5 OUTPUT stores data; a .zarr OUTPUT has one")
    if not os.path.exists(args.input):
        raise FileNotFoundError(2, "No such file or directory", args.input)
    if os.path.isdir(args.output) and not is_zarr_store(args.output):
        raise UserError(f"{args.output} is a directory but not a zarr store: give a new name")
    kwargs = {} if args.chunk is None else {"chunk_bytes": args.chunk}
    t0 = time.perf_counter()
    with ZarrProgress(args.quiet) as progress, _resumable_note(args.output):
        job = compress_to_zarr(
            args.input,
            args.output,
            bound,
            overrides=overrides or None,
            codec=codec,
            codec_options=codec_options or None,
            shard_bytes=args.shards,
            chunk_samples=args.chunk_samples,
            workers=args.workers,
            scheduler=args.scheduler,
            overwrite=args.force,
            progress=progress,
            **kwargs,
        )
    return _job_doc(args, job, time.perf_counter() - t0)


def _require_extras(scheduler: str | None) -> None:
    """Refuse, saying what to install, where zarr or Dask is missing."""
    needed = ("zarr", "dask") + (() if scheduler == "inline" else ("distributed",))
    missing = [name for name in needed if importlib.util.find_spec(name) is None]
    if missing:
        raise UserError(
            f"a .zarr OUTPUT needs {', '.join(missing)}: pip install 'tensorpress[zarr]'"
        )


def _job_doc(args, job, seconds: float) -> dict:
    """The summary document of a compress job to zarr (as ``compress --json`` prints),
    its ``reports`` (DatasetReport) still to be made ``datasets``."""
    original = sum(int(r.original_bytes) for r in job.reports)
    stored = sum(int(r.stored_bytes) for r in job.reports)
    return {
        "command": "compress",
        "input": args.input,
        "output": args.output,
        "input_bytes": _tree_bytes(args.input),
        "output_bytes": _tree_bytes(args.output),
        "original_bytes": original,
        "stored_bytes": stored,
        "ratio": finite_or_none(original / stored if stored else None),
        "seconds": seconds,
        "mb_per_s": finite_or_none(original / 1e6 / seconds if seconds > 0 else None),
        "workers": job.workers,
        "chunks": job.chunks,
        "chunks_written": job.written,
        "chunks_skipped": job.skipped,
        "reports": job.reports,
    }


def _tree_bytes(path: str) -> int:
    """Bytes of a file, or of every file under a directory (a zarr store)."""
    if not os.path.isdir(path):
        return os.path.getsize(path)
    return sum(os.path.getsize(os.path.join(d, f)) for d, _, fs in os.walk(path) for f in fs)


@contextlib.contextmanager
def _resumable_note(output: str):
    """On an interrupt, say that the verified chunks are kept for a rerun (the command
    then says that no OUTPUT was written)."""
    from ..files.zarr_commit import count_marked, partial_path

    try:
        yield
    except (KeyboardInterrupt, Terminated):
        partial = partial_path(os.path.abspath(output))
        if os.path.isdir(partial):
            print(
                f"tensorpress: {partial} keeps {count_marked(partial)} verified chunk(s): "
                "run the same command again to finish",
                file=sys.stderr,
            )
        raise


def is_zarr_store(path: str) -> bool:
    return any(os.path.exists(os.path.join(path, n)) for n in ("zarr.json", ".zgroup", ".zarray"))


def resumed_line(doc: dict) -> str | None:
    """What a resumed job says after its table, None for a fresh one."""
    if not doc.get("chunks_skipped"):
        return None
    return (
        f"resumed: {doc['chunks_skipped']} of {doc['chunks']} chunks were verified by an "
        "earlier run and kept"
    )
