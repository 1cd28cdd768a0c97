"""Little-endian byte building and bounds-checked reading for codec payloads."""

from __future__ import annotations

import struct

import numpy as np


class ByteWriter:
    """Accumulates little-endian fields and arrays into one bytes object."""

    def __init__(self):
        self._parts: list[bytes] = []

    def u8(self, v: int) -> None:
        self._parts.append(struct.pack("<B", v))

    def u32(self, v: int) -> None:
        self._parts.append(struct.pack("<I", v))

    def u64(self, v: int) -> None:
        self._parts.append(struct.pack("<Q", v))

    def f64(self, v: float) -> None:
        self._parts.append(struct.pack("<d", v))

    def blob(self, data: bytes) -> None:
        """A u64 length followed by ``data``."""
        self.u64(len(data))
        self._parts.append(bytes(data))

    def array(self, a: np.ndarray) -> None:
        """Raw little-endian bytes of ``a`` (the reader must know its dtype and count)."""
        self._parts.append(np.asarray(a, a.dtype.newbyteorder("<"), order="C").tobytes())

    def getvalue(self) -> bytes:
        return b"".join(self._parts)


class ByteReader:
    """Reads what :class:`ByteWriter` wrote; raises ValueError instead of reading past the end."""

    def __init__(self, data: bytes | memoryview, what: str = "payload"):
        self._buf = memoryview(data)
        self._pos = 0
        self._what = what

    def take(self, n: int) -> memoryview:
        if n < 0 or self._pos + n > len(self._buf):
            raise ValueError(f"truncated {self._what}: needed {n} bytes at offset {self._pos}")
        out = self._buf[self._pos : self._pos + n]
        self._pos += n
        return out

    def u8(self) -> int:
        return self.take(1)[0]

    def u32(self) -> int:
        return struct.unpack("<I", self.take(4))[0]

    def u64(self) -> int:
        return struct.unpack("<Q", self.take(8))[0]

    def f64(self) -> float:
        return struct.unpack("<d", self.take(8))[0]

    def blob(self) -> memoryview:
        return self.take(self.u64())

    def array(self, dtype, count: int) -> np.ndarray:
        dtype = np.dtype(dtype).newbyteorder("<")
        raw = self.take(count * dtype.itemsize)
        return np.frombuffer(raw, dtype).astype(dtype.newbyteorder("="))

    def tell(self) -> int:
        """How many bytes were read."""
        return self._pos

    def done(self) -> None:
        """Raise unless every byte was consumed."""
        if self._pos != len(self._buf):
            extra = len(self._buf) - self._pos
            raise ValueError(f"{extra} unexpected trailing bytes in {self._what}")
