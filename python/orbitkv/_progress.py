"""A dependency-free progress bar on stderr."""

from __future__ import annotations

import sys
import time


class Progress:
    def __init__(self, total: int, label: str, enabled: bool | None = None) -> None:
        self.total = max(total, 1)
        self.label = label
        self.done = 0
        self.start = time.monotonic()
        self.enabled = sys.stderr.isatty() if enabled is None else enabled
        self._last = 0.0

    def update(self, n: int = 1, note: str = "") -> None:
        self.done += n
        now = time.monotonic()
        if not self.enabled or (now - self._last < 0.1 and self.done < self.total):
            return
        self._last = now
        frac = min(self.done / self.total, 1.0)
        bar = "#" * int(frac * 30)
        sys.stderr.write(f"\r{self.label} [{bar:<30}] {self.done}/{self.total} {now - self.start:5.1f}s {note}\x1b[K")
        sys.stderr.flush()

    def close(self) -> None:
        if self.enabled:
            sys.stderr.write("\n")
            sys.stderr.flush()
