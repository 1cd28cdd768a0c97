"""The ``tensorpress`` command: compress, decompress, info, verify, bench, demo.

    tensorpress compress INPUT OUTPUT (--abs E | --rel E | --pw-rel E) [--codec sz]
                [--chunk 4M] [--set NAME:MODE=E ...] [--dtype float32 --shape 100,500,500]
    tensorpress decompress INPUT OUTPUT
    tensorpress info FILE
    tensorpress verify ORIGINAL COMPRESSED
    tensorpress bench FILE [--rel E ...] [--max-bytes 64M] [--plot rd.png]
    tensorpress demo

Every command takes ``--json`` (one JSON document on stdout) and ``--quiet``;
those that write take ``--force`` and ``--workers N``. Exit status: 0 on
success, 1 when ``verify`` (or ``bench``/``demo`` for tensorpress's own codecs)
finds an element outside its bound, 2 for an error (one line on stderr,
``tensorpress: error: ...``), 130 when interrupted (no output is left behind).
Set ``TENSORPRESS_TRACEBACK=1`` to see the traceback of an unexpected error.
"""

from .app import COMMANDS, error_message, main
from .bench import bench_codecs, bench_one, plot_rate_distortion
from .demo import demo_activation, demo_field
from .errors import EXIT_ERROR, EXIT_INTERRUPTED, EXIT_OK, EXIT_VIOLATION, UserError
from .files import report_dict
from .output import Progress, bound_text, codec_text, print_table, rate_text, size_text
from .parser import (
    build_parser,
    parse_bound_value,
    parse_bytes,
    parse_float_dtype,
    parse_override,
    parse_positive_rel,
    parse_shape,
    parse_workers,
)
from .verify import ErrorCheck, row_blocks

__all__ = [
    "COMMANDS",
    "EXIT_ERROR",
    "EXIT_INTERRUPTED",
    "EXIT_OK",
    "EXIT_VIOLATION",
    "ErrorCheck",
    "Progress",
    "UserError",
    "bench_codecs",
    "bench_one",
    "bound_text",
    "build_parser",
    "codec_text",
    "demo_activation",
    "demo_field",
    "error_message",
    "main",
    "parse_bound_value",
    "parse_bytes",
    "parse_float_dtype",
    "parse_override",
    "parse_positive_rel",
    "parse_shape",
    "parse_workers",
    "plot_rate_distortion",
    "print_table",
    "rate_text",
    "report_dict",
    "row_blocks",
    "size_text",
]
