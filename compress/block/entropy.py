"""The ``block`` codec's entropy mode: zstd over a chunk's packed blocks, where it pays.

Fixed-width packing pays for bits an entropy coder would not: on skewed
distributions (GELU outputs, attention probabilities, LayerNorm outputs) and on
smooth fields whose blocks repeat, a plain quantize-then-zstd can write fewer
bytes than the packed blocks. With ``entropy="zstd"`` each chunk payload in the
blocks mode (2) is compressed once more with zstd, and kept as a mode-3 payload
(the mode byte 3, then one zstd frame of the mode-2 payload without its mode byte)
only when that is smaller. Long payloads are probed first: a sample says whether
zstd pays at all and which level (level 1 only where its Huffman-coded literals
save much more than the fast level). The choice is per chunk, from the bytes alone, so a
chunk's payload depends on nothing but its values and the config; the GPU kernels
write mode-2 payloads and the host applies this step to them (byte-identical, but
a CUDA tensor's payload travels to the host and back: the mode is for storage, not
for the training step). ``benchmarks/compressors.py`` (rows ``tp-block-z``)
measures what it gains and costs.
"""

from __future__ import annotations

import numpy as np

from ..zstd import zstd_compress, zstd_decompress
from .kernels import layout as bl

#: the entropy modes a ``block`` codec takes (config key ``"entropy"``)
ENTROPY_MODES = ("none", "zstd")
#: zstd levels of mode-3 payloads: level 1 codes the literals (the packed bits) with
#: Huffman tables, the fast negative level only finds repeats and costs a third as
#: much; each chunk takes the one that pays (``benchmarks/compressors.py``, rows
#: ``tp-block-z``, weighs both against SZ3's speed and quantize+zstd's size)
ZSTD_LEVEL, ZSTD_FAST_LEVEL = 1, -1


def check_entropy(entropy) -> str:
    """Validate the ``entropy`` parameter of a ``block`` codec."""
    if entropy not in ENTROPY_MODES:
        raise ValueError(f"block entropy must be one of {ENTROPY_MODES}, got {entropy!r}")
    return entropy


#: payloads at least this long are probed first: zstd at both levels on a sixteenth of
#: them (from the middle). Level 1 must save PROBE_GAIN of the sample, else the chunk
#: stays in mode 2 (zstd costs the most where it gains least); it is used when it saves
#: LITERAL_GAIN of the sample more than the fast level, else the fast level is, where
#: that saves PROBE_GAIN. Shorter payloads take level 1 where it is smaller.
PROBE_BYTES = 1 << 17
PROBE_GAIN = 0.05
LITERAL_GAIN = 0.08
_MODE3 = bytes([bl.MODE_BLOCKS_ZSTD])


def squeeze(payload) -> bytes:
    """``payload`` (one chunk, any mode; bytes or a uint8 array) as a mode-3 payload when
    that is smaller, else unchanged, as bytes."""
    if len(payload) < 16 or payload[0] != bl.MODE_BLOCKS:
        return bytes(payload)
    frame = _frame(memoryview(payload)[1:])
    return bytes(payload) if frame is None else _MODE3 + frame


def squeeze_into(buf: np.ndarray, size: int) -> int:
    """:func:`squeeze` in place: the payload ``buf[:size]`` (uint8) rewritten as a mode-3
    payload when that is smaller; returns its length in bytes."""
    if size < 16 or buf[0] != bl.MODE_BLOCKS:
        return size
    frame = _frame(memoryview(buf)[1:size])
    if frame is None:
        return size
    buf[0] = bl.MODE_BLOCKS_ZSTD
    buf[1 : 1 + len(frame)] = np.frombuffer(frame, np.uint8)
    return 1 + len(frame)


def _frame(body: memoryview) -> bytes | None:
    """The zstd frame of a mode-2 ``body`` (its payload without the mode byte), or None
    where the chunk stays in mode 2 (no level pays, or the frame is not smaller)."""
    level = _level(body) if len(body) >= PROBE_BYTES else ZSTD_LEVEL
    if level is None:
        return None
    frame = zstd_compress(body, level)
    return frame if len(frame) < len(body) else None


def _level(body: memoryview) -> int | None:
    """The zstd level a long mode-2 ``body`` takes, from a sample; None: no zstd."""
    cut = len(body) // 16
    sample = body[len(body) // 2 : len(body) // 2 + cut]
    best = len(zstd_compress(sample, ZSTD_LEVEL))
    if best > (1 - PROBE_GAIN) * cut:
        return None
    fast = len(zstd_compress(sample, ZSTD_FAST_LEVEL))
    if fast - best >= LITERAL_GAIN * cut:
        return ZSTD_LEVEL
    return ZSTD_FAST_LEVEL if fast <= (1 - PROBE_GAIN) * cut else None


def unsqueeze(buf, n: int, itemsize: int, pw: bool):
    """The mode-2 payload inside a mode-3 payload ``buf`` (a uint8 array or bytes) of a
    chunk of ``n`` values of ``itemsize`` bytes; any other payload is returned as is."""
    if len(buf) < 1 or buf[0] != bl.MODE_BLOCKS_ZSTD:
        return buf
    nb = -(-n // bl.BLOCK)
    limit = bl.counts_at(nb, pw) + nb + n * itemsize  # no mode-2 payload is longer
    body = zstd_decompress(memoryview(np.asarray(buf, np.uint8))[1:], limit)
    out = np.empty(1 + len(body), np.uint8)
    out[0] = bl.MODE_BLOCKS
    out[1:] = np.frombuffer(body, np.uint8)
    return out


def squeeze_tensor(payload, lengths: list):
    """:func:`squeeze` on each chunk of a tensor path's ``(payload, lengths)``; the
    payload comes back on its device."""
    import torch

    host = payload.cpu().numpy()
    starts = np.concatenate([[0], np.cumsum(lengths)]).astype(np.int64).tolist()
    parts = [squeeze(host[a:b]) for a, b in zip(starts[:-1], starts[1:], strict=True)]
    out = torch.empty(sum(len(p) for p in parts), dtype=torch.uint8)
    if parts:  # one copy of each squeezed payload, into the tensor's memory
        np.concatenate([np.frombuffer(p, np.uint8) for p in parts], out=out.numpy())
    return out.to(payload.device), [len(p) for p in parts]


def unsqueeze_tensor(payload, lengths: list, n: int, chunk_elems: int, itemsize: int, pw: bool):
    """Inverse of :func:`squeeze_tensor` on a ``(payload, lengths)`` of ``n`` values cut
    every ``chunk_elems``: mode-3 chunks unpacked to mode 2 (payload back on its
    device); unchanged when no chunk is in mode 3."""
    import torch

    if len(lengths) * chunk_elems < n or sum(lengths) != payload.numel():
        return payload, lengths  # the kernels report the mismatch
    host = payload.cpu().numpy()
    starts = np.concatenate([[0], np.cumsum(lengths)]).astype(np.int64).tolist()
    pairs = list(zip(starts[:-1], starts[1:], strict=True))
    if not any(b > a and host[a] == bl.MODE_BLOCKS_ZSTD for a, b in pairs):
        return payload, lengths
    parts = []
    for i, (a, b) in enumerate(pairs):
        m = min(chunk_elems, n - i * chunk_elems)
        parts.append(np.asarray(unsqueeze(host[a:b], m, itemsize, pw), np.uint8))
    out = torch.from_numpy(np.concatenate(parts) if parts else np.zeros(0, np.uint8))
    return out.to(payload.device), [p.size for p in parts]
