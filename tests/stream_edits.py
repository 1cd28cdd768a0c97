"""Edits of a container stream's JSON header that keep its checksum valid, so that a
test reaches the checks behind the CRC (formats/SPEC.md, "Layout")."""

from __future__ import annotations

import json
import struct
import zlib


def rewrite_header(blob: bytes, edit=None, text: bytes | None = None) -> bytes:
    """``blob`` with its JSON header edited (or replaced by ``text``), checksum valid."""
    _, ver, flags, hlen = struct.unpack_from("<8sHHI", blob)
    if text is None:
        head = json.loads(blob[16 : 16 + hlen])
        edit(head)
        text = json.dumps(head).encode()
    pre = blob[:8] + struct.pack("<HHI", ver, flags, len(text)) + text
    return pre + struct.pack("<I", zlib.crc32(pre)) + blob[16 + hlen + 4 :]


def set_field(key, value):
    """An edit for :func:`rewrite_header`: header field ``key`` becomes ``value``."""

    def edit(h):
        h[key] = value

    return edit


def set_bound(key, value):
    """An edit for :func:`rewrite_header`: the bound's field ``key`` becomes ``value``."""

    def edit(h):
        h["bound"][key] = value

    return edit
