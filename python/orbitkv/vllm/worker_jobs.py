"""What the worker role keeps about its transfers in flight (worker.py owns them)."""

from __future__ import annotations

from concurrent.futures import Future
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import numpy as np

from orbitkv.vllm.metadata import SaveSpec

if TYPE_CHECKING:
    from orbitkv._native import Lease, PendingSave
    from orbitkv.kvcopy import LoadHandle, SaveHandle


@dataclass
class LoadOutcome:
    req_id: str
    failed_block_ids: list[int] = field(default_factory=list)
    total_failure: bool = False
    bytes_copied: int = 0


@dataclass
class Acquired:
    """A kvcopy load after its Manager round trips: the lease pins the sources, `slots`
    are the arena addresses of the `block_ids` to copy (empty: nothing to copy)."""

    out: LoadOutcome
    lease: Lease | None = None
    slots: np.ndarray = field(default_factory=lambda: np.empty((0, 2), dtype=np.int64))
    block_ids: list[int] = field(default_factory=list)


@dataclass
class KvLoad:
    """A kvcopy load in flight: acquiring (`future`), then copying (`handle`)."""

    future: Future[Acquired]
    acquired: Acquired | None = None
    handle: LoadHandle | None = None


@dataclass
class ReqSaves:
    """Saves issued for one request since its last preemption."""

    in_flight: int = 0


@dataclass
class KvSave:
    """One SaveSpec in flight: committed once `handle.query()` is True (None: no copy)."""

    spec: SaveSpec
    pending: PendingSave
    handle: SaveHandle | None
    req: ReqSaves
    batch: int | None
    bytes: int
    started: float  # perf_counter when the save was issued
