"""Worker -> scheduler payload (`KVConnectorWorkerMetadata`)."""

from __future__ import annotations

from dataclasses import dataclass, field

from vllm.distributed.kv_transfer.kv_connector.v1.base import KVConnectorWorkerMetadata


@dataclass
class OrbitKVWorkerMetadata(KVConnectorWorkerMetadata):
    """Save batches (one per scheduler step with saves) whose copies have drained."""

    saved_batches: set[int] = field(default_factory=set)
    stored_blocks: int = 0
    refused_blocks: int = 0
    failed_saves: int = 0

    def empty(self) -> bool:
        return not (self.saved_batches or self.stored_blocks or self.refused_blocks or self.failed_saves)

    def aggregate(self, other: KVConnectorWorkerMetadata) -> KVConnectorWorkerMetadata:
        assert isinstance(other, OrbitKVWorkerMetadata)
        return OrbitKVWorkerMetadata(
            saved_batches=self.saved_batches | other.saved_batches,
            stored_blocks=self.stored_blocks + other.stored_blocks,
            refused_blocks=self.refused_blocks + other.refused_blocks,
            failed_saves=self.failed_saves + other.failed_saves,
        )
