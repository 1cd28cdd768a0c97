"""The ``tensorpress`` command's first second: Ctrl-C or SIGTERM while the package imports.

The console script and ``python -m tensorpress`` import the whole package (numba, h5py,
the codecs: about a second) before ``cli.main`` sets its own handlers; a signal then
would print an import traceback. This module imports nothing of tensorpress.
"""

from __future__ import annotations

import os
import signal
import sys

#: the command's exit status once it has finished and flushed its output (None before):
#: a signal from then on ends the process quietly with it (:func:`exit_if_finished`)
finished: int | None = None
#: what the command is called on the command line (pip's console script)
COMMAND_NAMES = ("tensorpress", "tensorpress.exe")
#: whether this process is the command, as :func:`guard_start` found while the package
#: imported (``sys.argv[0]`` changes after ``python -m`` has found the module)
is_command = False


def started_as_command(package: str) -> bool:
    """Whether this process is the ``tensorpress`` command importing ``package``: the
    console script, or ``python -m`` of the package or of its ``cli``."""
    first = sys.argv[0] if sys.argv else ""
    if os.path.basename(first) in COMMAND_NAMES:
        return True
    argv = getattr(sys, "orig_argv", [])
    if first != "-m" or "-m" not in argv:  # -m: argv[0] is "-m" while the package imports
        return False
    return argv[argv.index("-m") + 1 :][:1] in ([package], [f"{package}.cli"])


def exit_if_finished() -> None:
    """In a signal handler: once the command has finished (its output complete, said and
    flushed), end the process with its status, quietly: what Python has left to do is
    tear down, and neither a traceback nor "no output was written" would be true."""
    if finished is not None:
        flush_output()
        os._exit(finished)


def flush_output() -> None:
    """Flush stdout and stderr, saying nothing where they cannot be (a closed pipe, or a
    flush that this signal interrupted)."""
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError, RuntimeError, AttributeError):
            pass


def quit_while_starting(signum, frame) -> None:
    """Signal handler: one line, exit 128 + the signal (nothing is written yet); after
    the command has finished, its own status (:func:`exit_if_finished`)."""
    exit_if_finished()
    name = "interrupted" if signum == signal.SIGINT else f"{signal.Signals(signum).name} received"
    os.write(2, f"tensorpress: {name}; no output was written\n".encode())
    os._exit(128 + signum)  # no import traceback; no file is open yet


def guard_start(package: str) -> None:
    """In the command only, end on Ctrl-C and SIGTERM with one line until ``cli.main``
    sets its handlers; a library import keeps Python's, and an ignored signal stays so."""
    global is_command
    is_command = started_as_command(package)
    if not is_command:
        return
    for sig in (signal.SIGINT, signal.SIGTERM):
        if signal.getsignal(sig) != signal.SIG_IGN:
            signal.signal(sig, quit_while_starting)
