"""The KV copy engine: cached blocks between Manager arena slots and KV pages.

Importing this package imports neither torch, vLLM nor the native runtime, and never
starts CUDA; the names below resolve on first attribute access (which imports torch).
See docs/gpu.md for the ordering rules.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from orbitkv.engine.lazy import lazy_attributes
from orbitkv.kvcopy.errors import CopyEngineError

if TYPE_CHECKING:
    from orbitkv.kvcopy.arena import ArenaView, pinned_segments
    from orbitkv.kvcopy.engine import CopyEngine, slots_array
    from orbitkv.kvcopy.handles import LoadHandle, SaveHandle
    from orbitkv.kvcopy.layout import LayerPages, layer_pages


__all__ = [
    "ArenaView",
    "CopyEngine",
    "CopyEngineError",
    "LayerPages",
    "LoadHandle",
    "SaveHandle",
    "layer_pages",
    "pinned_segments",
    "slots_array",
]

_LAZY = {
    "ArenaView": "orbitkv.kvcopy.arena",
    "pinned_segments": "orbitkv.kvcopy.arena",
    "CopyEngine": "orbitkv.kvcopy.engine",
    "LoadHandle": "orbitkv.kvcopy.handles",
    "SaveHandle": "orbitkv.kvcopy.handles",
    "slots_array": "orbitkv.kvcopy.engine",
    "LayerPages": "orbitkv.kvcopy.layout",
    "layer_pages": "orbitkv.kvcopy.layout",
}


__getattr__ = lazy_attributes(__name__, _LAZY, globals())
