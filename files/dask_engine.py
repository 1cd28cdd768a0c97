"""Running a compress job's tasks: on a Dask cluster (a local one of worker processes,
or an existing scheduler), or in this process.

The scheduler holds one small task per output chunk (or shard): a spec of a few hundred
bytes naming the region; the data never passes through it. Each worker reads its own
region of the input and writes its own chunk files into the shared store.
"""

from __future__ import annotations

import contextlib
import logging
import os
import secrets
import sys

#: worker processes of a local cluster when none are asked for: one per core, up to this
DEFAULT_MAX_WORKERS = 8
#: the scheduler address that runs the tasks in this process, one after another
INLINE = "inline"


def import_distributed():
    """``dask.distributed``, imported so that tensorpress's own ``distributed`` package
    cannot shadow it: this package's root is a folder of packages named like top-level
    ones (``distributed``, ``loaders``), so a ``sys.path`` entry pointing at it (Python's
    ``''`` when run from a checkout) is dropped first, for good: worker processes
    started later inherit this ``sys.path``."""
    root = os.path.realpath(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

    def is_root(entry: str) -> bool:
        return os.path.realpath(entry or os.getcwd()) == root

    sys.path[:] = [p for p in sys.path if not is_root(p)]
    mod = sys.modules.get("distributed")
    if mod is not None and os.path.realpath(getattr(mod, "__file__", "")).startswith(root):
        del sys.modules["distributed"]  # the wrong one, imported by name before
    import distributed

    return distributed


def default_workers() -> int:
    return max(1, min(os.cpu_count() or 1, DEFAULT_MAX_WORKERS))


class InlineRunner:
    """Tasks in this process, one after another (the single-process run)."""

    workers = 1

    def run(self, fn, specs: list, name: str):
        """Yield (spec, result or the exception it raised) for each spec."""
        for spec in specs:
            try:
                yield spec, fn(spec)
            except Exception as exc:  # reported with the others, as Dask's would be
                yield spec, exc


class DaskRunner:
    """Tasks on a Dask cluster through ``client``: one task per spec, results as they
    complete."""

    def __init__(self, client):
        self.client = client
        self.workers = max(1, len(client.scheduler_info().get("workers", {})))

    def run(self, fn, specs: list, name: str):
        """Yield (spec, result or the exception it raised) as tasks complete."""
        if not specs:
            return
        distributed = import_distributed()
        token = secrets.token_hex(3)
        keys = [
            f"{name}-{token}-{s['path']}-{'.'.join(map(str, s.get('index', ())))}-{i}"
            for i, s in enumerate(specs)
        ]
        futures = self.client.map(fn, specs, key=keys, pure=False)
        by_key = dict(zip(keys, specs, strict=True))
        try:
            for fut in distributed.as_completed(futures):
                try:
                    yield by_key[fut.key], fut.result()
                except Exception as exc:  # a task's error or a lost worker (KilledWorker)
                    yield by_key[fut.key], exc
        finally:
            self.client.cancel(futures)


@contextlib.contextmanager
def task_runner(workers: int | None, scheduler: str | None):
    """The runner of a job: a local cluster of ``workers`` processes (None: one per
    core, up to :data:`DEFAULT_MAX_WORKERS`), the Dask scheduler at ``scheduler`` (a
    ``tcp://`` address or a scheduler file, .json), or :data:`INLINE`."""
    if scheduler == INLINE:
        yield InlineRunner()
        return
    distributed = import_distributed()
    if scheduler is not None:
        if scheduler.endswith(".json"):
            if not os.path.isfile(scheduler):
                raise FileNotFoundError(f"scheduler file not found: {scheduler}")
            client = distributed.Client(scheduler_file=scheduler, timeout=30)
        else:
            client = distributed.Client(scheduler, timeout=30)
        with client:
            yield DaskRunner(client)
        return
    n = workers or default_workers()
    with (
        distributed.LocalCluster(
            n_workers=n,
            threads_per_worker=1,  # the codec runs one chunk per thread; processes scale
            processes=True,
            dashboard_address=":0",  # its HTTP server on a free port: none to collide
            silence_logs=logging.ERROR,
        ) as cluster,
        distributed.Client(cluster) as client,
    ):
        yield DaskRunner(client)
