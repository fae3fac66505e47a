"""A KV-event subscriber for the tests, read the way the engines' own consumers read their
streams: a ZeroMQ SUB socket, frames (topic, sequence number, payload), each payload
decoded by msgspec into the given release's `KVEventBatch` class (vLLM's or SGLang's)."""

from __future__ import annotations

import socket
import time
from collections.abc import Callable, Iterator
from typing import Any


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class EventStream:
    """Every batch received on `endpoint`, as (topic, sequence, decoded batch, payload)."""

    def __init__(self, endpoint: str, batch_type: type) -> None:
        import msgspec
        import zmq

        self.decoder = msgspec.msgpack.Decoder(batch_type)
        self.ctx = zmq.Context()
        self.sub = self.ctx.socket(zmq.SUB)
        self.sub.setsockopt(zmq.SUBSCRIBE, b"")
        self.sub.connect(endpoint)
        time.sleep(0.3)  # a SUB socket misses what is published before it joined
        self.batches: list[tuple[bytes, int, Any, bytes]] = []

    def until(self, done: Callable[[], bool], timeout: float = 10.0) -> None:
        deadline = time.monotonic() + timeout
        while not done():
            assert time.monotonic() < deadline, f"the stream did not deliver in {timeout} s: {self.batches[-3:]}"
            if self.sub.poll(100):
                topic, seq, payload = self.sub.recv_multipart()
                self.batches.append((topic, int.from_bytes(seq, "big"), self.decoder.decode(payload), payload))

    def events(self) -> Iterator[tuple[bytes, Any]]:
        for topic, _, batch, _ in self.batches:
            for e in batch.events:
                yield topic, e

    def hashes(self, kind: type) -> list[Any]:
        """The block hashes of every event of `kind`, in order."""
        return [h for _, e in self.events() if isinstance(e, kind) for h in e.block_hashes]

    def with_media(self, kind: type) -> list[tuple[Any, str | None]]:
        """(hash, medium) of every block of every event of `kind`, in order."""
        return [(h, e.medium) for _, e in self.events() if isinstance(e, kind) for h in e.block_hashes]

    def close(self) -> None:
        self.sub.close(0)
        self.ctx.term()
