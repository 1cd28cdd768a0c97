"""The ``tensorpress`` command: compress, decompress, info, verify, bench, demo.

    tensorpress compress INPUT OUTPUT (--abs E | --rel E | --pw-rel E | --psnr DB) [--codec sz]
                [--chunk 4M] [--set NAME:MODE=E ...] [--dtype float32 --shape 100,500,500]
                [--container]
    tensorpress compress INPUT OUTPUT --codec zstd | --codec quant --bits 4
    tensorpress decompress INPUT OUTPUT [--raw]
    tensorpress info FILE
    tensorpress verify ORIGINAL COMPRESSED
    tensorpress bench FILE [--rel E ...] [--max-bytes 64M] [--plot rd.png]
    tensorpress demo [--rel E ...]
    tensorpress --version

Every command takes ``--json`` (one JSON document on stdout) and ``--quiet``;
those that write take ``--force`` and ``--workers N``. Exit status: 0 on
success, 1 when ``verify`` (or ``bench``/``demo`` for tensorpress's own codecs)
finds an element outside its bound, 2 for any other error (``verify``: a dataset it
could not read, after reporting every dataset; elsewhere one line on stderr,
``tensorpress: error: ...``), 130 when interrupted, 128 + the signal for SIGTERM and
SIGHUP (no output is left behind).
Set ``TENSORPRESS_TRACEBACK=1`` to see the traceback of an unexpected error.
"""

from .app import main

__all__ = ["main"]
