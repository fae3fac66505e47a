"""Handles of the copies in flight: a load's per-layer "ready" events, a save's events.
The engine (engine.py, dma.py) makes them; callers query, wait or synchronise on them."""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch

if TYPE_CHECKING:
    from orbitkv.kvcopy.engine import CopyEngine


class _Handle:
    def __init__(self, engine: CopyEngine, events: list[torch.cuda.Event] | None) -> None:
        self._engine = engine
        self._events = events  # None once the copy is known complete (events back in the pool)

    @property
    def _last(self) -> torch.cuda.Event:
        assert self._events is not None
        return self._events[-1]

    def _poll(self) -> bool:
        """True once the copy completed; releases the events then (no lock taken)."""
        if self._events is None:
            return True
        if not self._last.query():
            return False
        events, self._events = self._events, None
        self._engine._free_events.extend(events)
        return True

    def query(self) -> bool:
        """The copy has completed (no host wait)."""
        with self._engine._lock:
            return self._poll()

    def synchronize(self) -> None:
        """Wait (host) until the copy has completed."""
        events = self._events
        if events is not None:
            events[-1].synchronize()
        self.query()


class LoadHandle(_Handle):
    """A load in flight: a "gathered" event per chunk (load stream), then per layer a
    "ready" event (place stream, recorded once the layer's pages hold the bytes); the last
    ready event is the handle's completion."""

    def wait_layer(self, i: int, stream: torch.cuda.Stream | None = None) -> None:
        """Make `stream` (default: the current stream) wait for layer i's copy - a device-side
        wait, no host synchronisation. A no-op once the load is known complete, and on CPU."""
        if not 0 <= i < self._engine.num_layers:
            raise IndexError(f"layer {i} outside [0, {self._engine.num_layers})")
        events = self._events
        if events is None:
            return
        s = stream if stream is not None else torch.cuda.current_stream(self._engine.device)
        s.wait_event(events[len(events) - self._engine.num_layers + i])  # layer i's "ready" event

    def query(self) -> bool:
        """Every layer's copy has completed (safe to release the lease)."""
        return super().query()


class SaveHandle(_Handle):
    """A save in flight."""

    def query(self) -> bool:
        """The copy has completed (safe to commit, safe to let the engine reuse the pages)."""
        return super().query()
