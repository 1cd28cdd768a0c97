"""``main``: parse the command line, run the command, map exceptions to exit statuses."""

from __future__ import annotations

import contextlib
import os
import signal
import sys
import threading
from collections.abc import Callable

from .._util import startup
from .._util.numba_cache import announce_compilation
from ..files.output import is_full_disk
from ..formats.hdf5_filter import forget_interrupt, interrupts_deferred, raise_interrupt
from .bench import run_bench
from .demo import run_demo
from .errors import EXIT_ERROR, EXIT_INTERRUPTED, EXIT_OK, Terminated, UserError
from .files import run_compress, run_convert, run_decompress, run_info
from .parser import build_parser
from .verify_zarr import run_verify_any

COMMANDS: dict[str, Callable] = {
    "compress": run_compress,
    "decompress": run_decompress,
    "convert": run_convert,
    "info": run_info,
    "verify": run_verify_any,  # a zarr store, or any other compressed output
    "bench": run_bench,
    "demo": run_demo,
    "plugin-path": lambda args: run_plugin_path(),
}


def run_plugin_path() -> int:
    """Print the folder of the compiled HDF5 plugin (for ``HDF5_PLUGIN_PATH``); an error
    where it was not built."""
    from ..formats import hdf5_plugin_path

    if hdf5_plugin_path.plugin_library() is None:
        raise UserError(hdf5_plugin_path.NOT_BUILT)
    print(hdf5_plugin_path.PLUGIN_PATH)
    return EXIT_OK


def main(argv: list[str] | None = None) -> int:
    """Run the command line; return the exit status."""
    with signals_handled():
        status = _interruptible(argv)
        _finished(status)
        return status


def _interruptible(argv: list[str] | None) -> int:
    """:func:`_run`, with an interrupt said in one line and its status returned."""
    try:
        return _run(argv)
    except KeyboardInterrupt:
        forget_interrupt()  # this one was kept too, in case a finalizer dropped it
        print("tensorpress: interrupted; no output was written", file=sys.stderr, flush=True)
        return EXIT_INTERRUPTED
    except Terminated as exc:
        forget_interrupt()
        name = signal.Signals(exc.signum).name
        print(f"tensorpress: {name} received; no output was written", file=sys.stderr)
        sys.stderr.flush()
        return 128 + exc.signum


def _finished(status: int) -> None:
    """The command is done: flush what it said, and from here (the command only, not a
    caller of :func:`main` in-process) a signal ends it quietly with ``status``: every
    handler set here or put back after asks ``startup.exit_if_finished`` first."""
    if not startup.is_command:
        return
    startup.finished = status  # first: a signal during the flush below then flushes too
    startup.flush_output()


def _run(argv: list[str] | None) -> int:
    """Parse and run one command; every error but an interrupt becomes its status."""
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.command is None:
        parser.print_help()
        return EXIT_OK
    announce_compilation()  # a first run compiles kernels for seconds: say so
    try:
        return COMMANDS[args.command](args)
    except BrokenPipeError:  # the reader went away (`tensorpress demo | head`): stop quietly
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())  # no flush error at exit
        return EXIT_ERROR
    except Exception as exc:  # every error that is not a found violation: one line, exit 2
        raise_interrupt()  # HDF5 failed a read because a filter callback was interrupted
        if os.environ.get("TENSORPRESS_TRACEBACK"):
            raise
        msg = error_message(exc)
        source = getattr(args, "input", None) or getattr(args, "file", None)
        if isinstance(exc, OSError) and "open file" in msg and source and source not in msg:
            msg = f"{source}: {msg}"  # h5py does not name the file it could not open
        print(f"tensorpress: error: {msg}", file=sys.stderr, flush=True)
        if is_full_disk(exc) and startup.is_command:
            # h5py 3.16 / HDF5 2.0: once a write or a close failed for a full disk, freeing
            # any h5py object of that file crashes (SIGSEGV) in the finalizers at exit; the
            # error is said and the temporary file removed, so end without them
            sys.stdout.flush()
            os._exit(EXIT_ERROR)
        return EXIT_ERROR


#: what a job scheduler, a container runtime or ``timeout`` sends to end a program
TERMINATION_SIGNALS = tuple(
    getattr(signal, name) for name in ("SIGTERM", "SIGHUP") if hasattr(signal, name)
)


def _terminate(signum, frame):
    startup.exit_if_finished()
    raise Terminated(signum)


def _interrupt(signum, frame):
    """Ctrl-C: Python's KeyboardInterrupt, unless the command has finished."""
    startup.exit_if_finished()
    raise KeyboardInterrupt


@contextlib.contextmanager
def signals_handled():
    """While the block runs, Ctrl-C raises KeyboardInterrupt and SIGTERM and SIGHUP
    raise :class:`Terminated`, so that all unwind alike (temporary outputs removed),
    also inside HDF5 filter callbacks, where the exception waits until h5py returns
    (``interrupts_deferred``). A signal ignored when the command started (``nohup``)
    stays ignored; the old handlers come back after. Only the main thread handles
    signals: elsewhere this sets none."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    wanted = {signal.SIGINT: _interrupt}
    wanted.update(dict.fromkeys(TERMINATION_SIGNALS, _terminate))
    previous = {}
    for sig, handler in wanted.items():
        if signal.getsignal(sig) != signal.SIG_IGN:
            previous[sig] = signal.signal(sig, handler)
    try:
        with interrupts_deferred(tuple(previous)), _full_disk_finalizers_quiet():
            yield
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)


@contextlib.contextmanager
def _full_disk_finalizers_quiet():
    """Drop what h5py's finalizers report for a full disk while the block runs (each
    object of the failed file says it again): the command says it once, naming the
    output. Every other unraisable error goes to the hook that was set."""
    unraisable_hook, except_hook = sys.unraisablehook, sys.excepthook

    def unraisable(args) -> None:
        if not is_full_disk(args.exc_value):
            unraisable_hook(args)

    def printed(kind, value, tb) -> None:  # Cython prints a finalizer's traceback so
        if not is_full_disk(value):
            except_hook(kind, value, tb)

    sys.unraisablehook, sys.excepthook = unraisable, printed
    try:
        yield
    finally:
        sys.unraisablehook, sys.excepthook = unraisable_hook, except_hook


def error_message(exc: BaseException) -> str:
    """One line that says what went wrong (and, where it helps, what to do)."""
    from ..formats import ChecksumError, TruncatedError

    if isinstance(exc, MemoryError):
        msg = f"out of memory: {exc}" if str(exc) else "out of memory"
    elif isinstance(exc, FileExistsError):
        what = exc.filename or str(exc).split(" exists")[0]
        msg = f"{what} exists: pass --force to overwrite it"
    elif isinstance(exc, OSError) and exc.filename is not None and exc.strerror:
        msg = f"{exc.filename}: {exc.strerror[0].lower()}{exc.strerror[1:]}"
    elif isinstance(exc, KeyError):
        msg = f"{exc.args[0] if exc.args else exc}"
    elif isinstance(exc, (UserError, OSError, ValueError, TypeError, RuntimeError)):
        msg = str(exc) or type(exc).__name__
    else:  # not an error tensorpress raises on purpose: name its kind
        msg = f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__
    if isinstance(exc, ChecksumError) and "checksum" not in msg.lower():
        msg = f"checksum mismatch: {msg}"
    if isinstance(exc, TruncatedError) and "truncated" not in msg.lower():
        msg = f"truncated file: {msg}"
    return " ".join(msg.split())
