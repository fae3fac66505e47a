"""KV events from the Manager in SGLang's form (`--kv-events-hash-form sglang`), read the
way SGLang's own consumers read its `--kv-events-config` stream: a ZeroMQ SUB socket,
frames (topic, sequence number, payload), the payload decoded by msgspec into the
installed release's `KVEventBatch` (`sglang.srt.disaggregation.kv_events`). A request
served through the released UnifiedRadixCache is saved by the linker; the Manager
publishes its pages under the hashes SGLang's own events give them (`hash_str_to_int64`
of SGLang's page hash chain, computed here by the release's hashing), in host memory
(`CPU_PINNED`), and their removal when evicted."""

from __future__ import annotations

import socket
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from sglang_env import skip_module_if_unavailable

skip_module_if_unavailable()

import msgspec  # noqa: E402
import zmq  # noqa: E402
from engine_manager import manager_in_short_dir  # noqa: E402
from sglang.srt.disaggregation.kv_events import BlockRemoved, BlockStored, KVEventBatch  # noqa: E402
from sglang.srt.mem_cache.radix_cache import RadixKey  # noqa: E402
from sglang.srt.mem_cache.utils import get_storage_hash_str, hash_str_to_int64  # noqa: E402
from sglang_harness import PAGE, Engine, prompt  # noqa: E402

pytestmark = pytest.mark.sglang

PAGES = 5


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class Stream:
    """A SUB socket on the Manager's KV-event endpoint, every batch decoded as SGLang's."""

    def __init__(self, endpoint: str) -> None:
        self.decoder = msgspec.msgpack.Decoder(KVEventBatch)
        self.ctx = zmq.Context()
        self.sub = self.ctx.socket(zmq.SUB)
        self.sub.setsockopt(zmq.SUBSCRIBE, b"")
        self.sub.connect(endpoint)
        time.sleep(0.3)  # a SUB socket misses what is published before it joined
        self.events: list[Any] = []

    def until(self, done: Callable[[], bool], timeout: float = 10.0) -> None:
        deadline = time.monotonic() + timeout
        while not done():
            assert time.monotonic() < deadline, f"the stream did not deliver in {timeout} s: {self.events[-3:]}"
            if self.sub.poll(100):
                _, _, payload = self.sub.recv_multipart()
                self.events.extend(self.decoder.decode(payload).events)

    def of(self, kind: type) -> list[tuple[int, str | None]]:
        return [(h, e.medium) for e in self.events if isinstance(e, kind) for h in e.block_hashes]

    def close(self) -> None:
        self.sub.close(0)
        self.ctx.term()


def sglang_event_hashes(tokens: list[int]) -> list[int]:
    """What SGLang's own events call the request's pages (no LoRA, no cache_salt)."""
    chain = get_storage_hash_str(RadixKey(tokens[: PAGES * PAGE]), None, page_size=PAGE)
    assert isinstance(chain, list) and len(chain) == PAGES
    return [hash_str_to_int64(h) for h in chain]


def test_a_requests_pages_are_published_as_sglang_names_them(tmp_path: Path) -> None:
    pub = f"tcp://127.0.0.1:{free_port()}"
    args = ("--kv-events", pub, "--kv-events-hash-form", "sglang", "--cache-policy", "lru")
    with manager_in_short_dir(tmp_path / "m", "okv-sev", dram_size="1MiB", extra_args=args) as m:
        stream = Stream(pub)
        try:
            tokens = prompt(51, PAGES)
            e = Engine(str(m.socket_path), kv_cache_events=True)
            assert e.serve(tokens).mismatched_bytes == 0
            e.step()
            want = sglang_event_hashes(tokens)
            # SGLang's own events for the request (its tree, medium GPU) name them alike.
            own = [h for ev in e.cache.take_events() if isinstance(ev, BlockStored) for h in ev.block_hashes]
            assert own[:PAGES] == want
            stream.until(lambda: len(stream.of(BlockStored)) >= PAGES)
            assert stream.of(BlockStored) == [(h, "CPU_PINNED") for h in want]
            # The engine computed them (the linker saved them): they are the same pages.
            assert e.linker.stats["offloaded_blocks"] == PAGES
            block_bytes = e.linker.geometry.block_bytes
            e.close()

            # Another client floods the arena: the pages leave and their removal is published.
            with m.client() as c:
                ns = c.register_namespace(b"\x07" * 32, block_bytes)
                n = 2 * (1 << 20) // block_bytes
                for i in range(0, n, 8):
                    c.save(
                        ns,
                        [bytes([i // 8 % 256, i // 2048, j, 0xE5]) + bytes(28) for j in range(8)],
                        bytes(8 * block_bytes),
                    )
            stream.until(lambda: set(want) <= {h for h, _ in stream.of(BlockRemoved)})
            assert all(medium == "CPU_PINNED" for h, medium in stream.of(BlockRemoved) if h in want)
            assert m.stats()["kv_events_dropped_total"] == 0
        finally:
            stream.close()
