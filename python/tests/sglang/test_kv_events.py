"""KV events from the Manager in SGLang's form (`--kv-events-hash-form sglang`), read the
way SGLang's own consumers read its `--kv-events-config` stream: a ZeroMQ SUB socket,
frames (topic, sequence number, payload), the payload decoded by msgspec into the
installed release's `KVEventBatch` (`sglang.srt.disaggregation.kv_events`). A request
served through the released UnifiedRadixCache is saved by the linker; the Manager
publishes its pages under the hashes SGLang's own events give them (`hash_str_to_int64`
of SGLang's page hash chain, computed here by the release's hashing), in host memory
(`CPU_PINNED`), and their removal when evicted."""

from __future__ import annotations

from pathlib import Path

import pytest
from sglang_env import skip_module_if_unavailable

skip_module_if_unavailable()

from engine_manager import manager_in_short_dir  # noqa: E402
from event_stream import EventStream, free_port  # noqa: E402
from sglang.srt.disaggregation.kv_events import BlockRemoved, BlockStored, KVEventBatch  # noqa: E402
from sglang.srt.mem_cache.radix_cache import RadixKey  # noqa: E402
from sglang.srt.mem_cache.utils import get_storage_hash_str, hash_str_to_int64  # noqa: E402
from sglang_harness import PAGE, Engine, prompt  # noqa: E402

pytestmark = pytest.mark.sglang

PAGES = 5


def sglang_event_hashes(tokens: list[int]) -> list[int]:
    """What SGLang's own events call the request's pages (no LoRA, no cache_salt)."""
    chain = get_storage_hash_str(RadixKey(tokens[: PAGES * PAGE]), None, page_size=PAGE)
    assert isinstance(chain, list) and len(chain) == PAGES
    return [hash_str_to_int64(h) for h in chain]


def test_a_requests_pages_are_published_as_sglang_names_them(tmp_path: Path) -> None:
    pub = f"tcp://127.0.0.1:{free_port()}"
    args = ("--kv-events", pub, "--kv-events-hash-form", "sglang", "--cache-policy", "lru")
    with manager_in_short_dir(tmp_path / "m", "okv-sev", dram_size="1MiB", extra_args=args) as m:
        stream = EventStream(pub, KVEventBatch)
        try:
            tokens = prompt(51, PAGES)
            e = Engine(str(m.socket_path), kv_cache_events=True)
            assert e.serve(tokens).mismatched_bytes == 0
            e.step()
            want = sglang_event_hashes(tokens)
            # SGLang's own events for the request (its tree, medium GPU) name them alike.
            own = [h for ev in e.cache.take_events() if isinstance(ev, BlockStored) for h in ev.block_hashes]
            assert own[:PAGES] == want
            stream.until(lambda: len(stream.with_media(BlockStored)) >= PAGES)
            assert stream.with_media(BlockStored) == [(h, "CPU_PINNED") for h in want]
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
            stream.until(lambda: set(want) <= {h for h, _ in stream.with_media(BlockRemoved)})
            assert all(medium == "CPU_PINNED" for h, medium in stream.with_media(BlockRemoved) if h in want)
            assert m.stats()["kv_events_dropped_total"] == 0
        finally:
            stream.close()
