"""Scheduler -> worker payload (`KVConnectorMetadata`), plain picklable dataclasses."""

from __future__ import annotations

from dataclasses import dataclass, field

from vllm.distributed.kv_transfer.kv_connector.v1.base import KVConnectorMetadata


@dataclass(frozen=True)
class _BlocksSpec:
    """Blocks of request `req_id` (cache salt `salt`): `hashes[i]` is in engine block `block_ids[i]`."""

    req_id: str
    salt: bytes
    hashes: tuple[bytes, ...]
    block_ids: tuple[int, ...]


@dataclass(frozen=True)
class LoadSpec(_BlocksSpec):
    """Restore `hashes` (a prefix hit the scheduler holds a lease on) into `block_ids`."""

    # Query control (TP, contract T1): the scheduler's TP lease token; each worker
    # redeems its own shard's part with it instead of looking up again.
    token: bytes | None = None


@dataclass(frozen=True)
class SaveSpec(_BlocksSpec):
    """Save the complete blocks `block_ids` under `hashes` after this step's forward."""


@dataclass
class OrbitKVConnectorMetadata(KVConnectorMetadata):
    loads: list[LoadSpec] = field(default_factory=list)
    saves: list[SaveSpec] = field(default_factory=list)
    # Bumped by every external reset; workers re-register namespaces when it moves.
    epoch: int = 0
    # Id of this step's save batch (None without saves); reported back when drained.
    save_batch: int | None = None
    # Requests preempted by this step's schedule (their blocks may be reused at once):
    # `handle_preemptions` orders the step's writes after saves still reading them.
    preempted: tuple[str, ...] = ()
