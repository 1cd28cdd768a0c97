"""Running the ``tensorpress`` command in-process, as the CLI tests do."""

from __future__ import annotations

import json

from tensorpress.cli import main


def run_cli(capsys, *argv) -> tuple[int, str, str]:
    """(exit status, stdout, stderr) of ``tensorpress ARGV``."""
    try:
        rc = main([str(a) for a in argv])
    except SystemExit as exc:  # argparse exits for --version and usage errors
        rc = exc.code
    out, err = capsys.readouterr()
    return rc, out, err


def run_json(capsys, *argv) -> dict:
    """The JSON document ``tensorpress ARGV --json`` prints; the command must succeed."""
    rc, out, err = run_cli(capsys, *argv, "--json")
    assert rc == 0, err
    return json.loads(out)
