"""Where the activation memory went: bytes saved, bytes held, per module."""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass
class ModuleRow:
    """One module's share of a step.

    ``saves``: tensors it saved; ``saved_bytes``: their bytes as autograd asked
    (a tensor saved twice counts twice); ``stored_bytes``: bytes held for them
    (compressed payload, masks, and tensors kept as they are; a repeat costs 0);
    ``tolerance``: the last absolute error bound used (None: not error-bounded).
    """

    name: str
    saves: int = 0
    saved_bytes: int = 0
    stored_bytes: int = 0
    tolerance: float | None = None

    @property
    def ratio(self) -> float:
        return self.saved_bytes / self.stored_bytes if self.stored_bytes else float("inf")


@dataclass
class ActivationStats:
    """Bytes of the activations of the last step (reset when a forward pass starts).

    Parameters and buffers that autograd saves are not activations and are not
    counted. ``peak_stored_bytes`` is the most bytes held at any one time since the
    reset (records of earlier steps still alive count too). With a store, records
    moved into it count as held too; ``device_bytes`` / ``peak_device_bytes`` count
    only those still in the tensors' own device memory.

    ``records``: the records made for the saved tensors, by kind (``"Compressed"``,
    ``"Kept"``, ``"Offloaded"``, or one derived from other records: ``"GeluOfInput"``,
    ``"ReluOfBatchNorm"``, ``"LayerNormOfInput"``, ``"ViewOfRegion"``,
    ``"LogSoftmaxOfRegion"``); a tensor saved again reuses its record. In backward:
    ``decoded`` counts codec payloads decoded (a record restored for several users is
    decoded once), ``rebuilt`` the regions rebuilt for views (once for all of a
    region's views).
    """

    saved_bytes: int = 0
    stored_bytes: int = 0
    peak_stored_bytes: int = 0
    live_bytes: int = 0
    device_bytes: int = 0
    peak_device_bytes: int = 0
    rows: dict = field(default_factory=dict)
    records: dict = field(default_factory=dict)
    decoded: int = 0
    rebuilt: int = 0

    @property
    def ratio(self) -> float:
        """saved_bytes / stored_bytes (the reduction factor)."""
        return self.saved_bytes / self.stored_bytes if self.stored_bytes else float("inf")

    def reset(self) -> None:
        self.saved_bytes = self.stored_bytes = 0
        self.peak_stored_bytes = self.live_bytes
        self.peak_device_bytes = self.device_bytes
        self.rows, self.records = {}, {}
        self.decoded = self.rebuilt = 0

    def row(self, name: str) -> ModuleRow:
        if name not in self.rows:
            self.rows[name] = ModuleRow(name)
        return self.rows[name]

    def count(self, name: str, saved: int, stored: int, tolerance=None) -> None:
        """One save by module ``name``: ``saved`` bytes asked, ``stored`` newly held."""
        r = self.row(name)
        r.saves += 1
        r.saved_bytes += saved
        r.stored_bytes += stored
        if tolerance is not None:
            r.tolerance = tolerance
        self.saved_bytes += saved
        self.stored_bytes += stored

    def hold(self, nbytes: int, offloaded: bool = False) -> None:
        self.live_bytes += nbytes
        self.peak_stored_bytes = max(self.peak_stored_bytes, self.live_bytes)
        if not offloaded:
            self.device_bytes += nbytes
            self.peak_device_bytes = max(self.peak_device_bytes, self.device_bytes)

    def release(self, nbytes: int, offloaded: bool = False) -> None:
        self.live_bytes -= nbytes
        if not offloaded:
            self.device_bytes -= nbytes

    def __str__(self) -> str:
        mib = 1 << 20
        lines = [
            f"activations: saved {self.saved_bytes / mib:.2f} MiB, held "
            f"{self.stored_bytes / mib:.2f} MiB ({self.ratio:.1f}x), peak held "
            f"{self.peak_stored_bytes / mib:.2f} MiB",
            f"{'module':<32} {'saves':>5} {'saved MiB':>10} {'held MiB':>9} {'ratio':>7} "
            f"{'bound':>9}",
        ]
        for r in sorted(self.rows.values(), key=lambda r: -r.saved_bytes):
            bound = "" if r.tolerance is None else f"{r.tolerance:.2e}"
            lines.append(
                f"{r.name[:32]:<32} {r.saves:>5} {r.saved_bytes / mib:>10.3f} "
                f"{r.stored_bytes / mib:>9.3f} {r.ratio:>7.1f} {bound:>9}"
            )
        return "\n".join(lines)
