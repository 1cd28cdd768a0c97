"""``main``: parse the command line, run the command, map exceptions to exit statuses."""

from __future__ import annotations

import os
import sys
from collections.abc import Callable

from .bench import run_bench
from .demo import run_demo
from .errors import EXIT_ERROR, EXIT_INTERRUPTED, EXIT_OK, UserError
from .files import run_compress, run_decompress, run_info
from .parser import build_parser
from .verify import run_verify

COMMANDS: dict[str, Callable] = {
    "compress": run_compress,
    "decompress": run_decompress,
    "info": run_info,
    "verify": run_verify,
    "bench": run_bench,
    "demo": run_demo,
}


def main(argv: list[str] | None = None) -> int:
    """Run the command line; return the exit status."""
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.command is None:
        parser.print_help()
        return EXIT_OK
    try:
        return COMMANDS[args.command](args)
    except KeyboardInterrupt:
        print("tensorpress: interrupted; no output was written", file=sys.stderr, flush=True)
        return EXIT_INTERRUPTED
    except BrokenPipeError:  # the reader went away (`tensorpress demo | head`): stop quietly
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())  # no flush error at exit
        return EXIT_ERROR
    except (UserError, OSError, ValueError, TypeError, KeyError, RuntimeError) as exc:
        if os.environ.get("TENSORPRESS_TRACEBACK"):
            raise
        msg = error_message(exc)
        source = getattr(args, "input", None) or getattr(args, "file", None)
        if isinstance(exc, OSError) and "open file" in msg and source and source not in msg:
            msg = f"{source}: {msg}"  # h5py does not name the file it could not open
        print(f"tensorpress: error: {msg}", file=sys.stderr, flush=True)
        return EXIT_ERROR


def error_message(exc: BaseException) -> str:
    """One line that says what went wrong (and, where it helps, what to do)."""
    from ..formats import ChecksumError, TruncatedError

    if isinstance(exc, FileExistsError):
        what = exc.filename or str(exc).split(" exists")[0]
        msg = f"{what} exists: pass --force to overwrite it"
    elif isinstance(exc, OSError) and exc.filename is not None and exc.strerror:
        msg = f"{exc.filename}: {exc.strerror[0].lower()}{exc.strerror[1:]}"
    elif isinstance(exc, KeyError):
        msg = f"{exc.args[0] if exc.args else exc}"
    else:
        msg = str(exc) or type(exc).__name__
    if isinstance(exc, ChecksumError) and "checksum" not in msg.lower():
        msg = f"checksum mismatch: {msg}"
    if isinstance(exc, TruncatedError) and "truncated" not in msg.lower():
        msg = f"truncated file: {msg}"
    return " ".join(msg.split())
