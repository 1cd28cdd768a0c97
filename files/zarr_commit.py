"""How a zarr output is committed: the job writes ``DST.partial``, each chunk is marked
only once its worker has read it back and checked every element, and the store is
renamed to ``DST`` only when every chunk is marked.

``DST.partial`` holds the zarr store being written (its root ``zarr.json`` set aside as
``.zarr.json.pending``, so that zarr and xarray find no group there), the job record
(``.tensorpress-job.json``: the settings a rerun must repeat and the plan it resumes),
and one marker file per verified chunk (``.tensorpress-done/<variable>/<i.j.k>``, JSON:
bytes in and out, the largest error). A rerun of the same command resumes: the markers
say which chunks need no work. A store is finished when its name is ``DST``.
"""

from __future__ import annotations

import contextlib
import json
import os
import secrets
import shutil
import warnings

#: the job record inside DST.partial
JOB = ".tensorpress-job.json"
#: the folder of per-chunk markers inside DST.partial
DONE = ".tensorpress-done"
#: where the root group's zarr.json waits until the commit
PENDING_ROOT = ".zarr.json.pending"


def partial_path(dst: str) -> str:
    return os.fspath(dst).rstrip("/") + ".partial"


class IncompleteStore(RuntimeError):
    """A zarr output whose job has not finished (DST.partial): never read as finished."""


def _write_json(path: str, doc: dict) -> None:
    """``doc`` as JSON at ``path``, whole or not at all (a temporary file renamed)."""
    tmp = f"{path}.{secrets.token_hex(4)}.tmp"
    with open(tmp, "w") as f:
        json.dump(doc, f)
    os.replace(tmp, path)


def read_job(partial: str) -> dict | None:
    """The job record of ``partial``, None when there is none (or a torn one)."""
    try:
        with open(os.path.join(partial, JOB)) as f:
            return json.load(f)
    except (OSError, ValueError):
        return None


def start(dst: str, settings: dict, overwrite: bool) -> tuple[str, dict | None]:
    """(DST.partial, the plan recorded by an unfinished run of the same ``settings``, or
    None for a fresh start). An unfinished job with other settings is refused: its
    chunks were made under another bound or codec."""
    dst = os.fspath(dst).rstrip("/")
    if os.path.exists(dst) and not overwrite:
        raise FileExistsError(f"{dst} exists; pass overwrite=True (--force) to replace it")
    if os.path.exists(dst) and not os.path.isdir(dst):
        raise ValueError(f"{dst} exists and is not a zarr store (a directory): remove it")
    partial = partial_path(dst)
    job = read_job(partial)
    if job is not None and job.get("settings") != settings:
        raise ValueError(
            f"{partial} holds an unfinished job with other settings (input, codec, bound or "
            f"chunking): rerun it with the same options to finish it, or remove {partial}"
        )
    if job is not None and job.get("plan") is not None:
        return partial, job["plan"]
    if os.path.exists(partial):  # stopped before its plan was recorded: nothing to keep
        shutil.rmtree(partial)
    os.makedirs(os.path.join(partial, DONE))
    _write_json(os.path.join(partial, JOB), {"settings": settings, "plan": None})
    return partial, None


def record_plan(partial: str, plan: dict) -> None:
    """Record the resolved plan (bounds, chunks): from now on a rerun resumes."""
    job = read_job(partial)
    job["plan"] = plan
    _write_json(os.path.join(partial, JOB), job)


def hide_root(partial: str) -> None:
    """Set the root group's metadata aside until the commit."""
    root = os.path.join(partial, "zarr.json")
    if os.path.exists(root):
        os.replace(root, os.path.join(partial, PENDING_ROOT))


def marker_path(partial: str, var: str, index: tuple) -> str:
    name = ".".join(map(str, index)) or "0"
    return os.path.join(partial, DONE, *var.split("/"), name)


def mark(partial: str, var: str, index: tuple, stats: dict) -> None:
    """Record chunk (or shard) ``index`` of ``var`` as written and verified."""
    path = marker_path(partial, var, index)
    os.makedirs(os.path.dirname(path), exist_ok=True)
    _write_json(path, stats)


def marked(partial: str, var: str, index: tuple) -> dict | None:
    """The marker of a verified chunk, None when it has none."""
    try:
        with open(marker_path(partial, var, index)) as f:
            return json.load(f)
    except (OSError, ValueError):
        return None


def count_marked(partial: str) -> int:
    """How many chunks of ``partial`` are verified."""
    return sum(
        1
        for _, _, names in os.walk(os.path.join(partial, DONE))
        for n in names
        if not n.endswith(".tmp")
    )


def commit(partial: str, dst: str, root_attrs: dict, overwrite: bool) -> None:
    """Give the store its root group (with ``root_attrs``), drop the job's own files and
    rename it to ``dst``; an existing ``dst`` (with ``overwrite``) is removed only after
    the new store is in place."""
    pending = os.path.join(partial, PENDING_ROOT)
    with open(pending) as f:
        root = json.load(f)
    root["attributes"] = {**root.get("attributes", {}), **root_attrs}
    _write_json(os.path.join(partial, "zarr.json"), root)
    os.unlink(pending)
    shutil.rmtree(os.path.join(partial, DONE))
    os.unlink(os.path.join(partial, JOB))
    _consolidate(partial)
    old = None
    if os.path.exists(dst) and overwrite:
        old = f"{dst}.{secrets.token_hex(4)}.old"
        os.replace(dst, old)
    os.replace(partial, dst)
    if old is not None:
        with contextlib.suppress(OSError):
            shutil.rmtree(old)


def _consolidate(store: str) -> None:
    """Every node's metadata in the root's zarr.json, as xarray writes it: one read opens
    the store (zarr warns that format 3 has not specified it yet; readers without it
    read each node's own zarr.json, which stays)."""
    import zarr

    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)
        zarr.consolidate_metadata(store)


def require_finished(path: str) -> None:
    """IncompleteStore when ``path`` is (or has beside it) an unfinished job's store."""
    path = os.fspath(path).rstrip("/")
    job = read_job(path)
    if job is None and not os.path.exists(os.path.join(path, PENDING_ROOT)):
        if not os.path.exists(os.path.join(path, "zarr.json")) and os.path.exists(
            partial_path(path)
        ):
            raise IncompleteStore(
                f"{path} is not finished: its job stopped before the commit "
                f"({partial_path(path)} holds {count_marked(partial_path(path))} verified "
                "chunk(s)); rerun the compress command to finish it"
            )
        return
    raise IncompleteStore(
        f"{path} is an unfinished zarr output ({count_marked(path)} chunk(s) verified so "
        "far): rerun the same compress command to finish it; it is renamed to its "
        "destination when every chunk is written and verified"
    )
