"""KV events from the Manager (`--kv-events`), read the way vLLM's own consumers read
vLLM's `--kv-events-config` stream: a ZeroMQ SUB socket, frames (topic, sequence number,
payload), the payload decoded by msgspec into the installed release's `KVEventBatch`
(`vllm.distributed.kv_events`), and vLLM's replay protocol on the ROUTER socket. Real
Manager processes; the vLLM case saves a request through the released Scheduler and finds
the request's own block hashes (what a KV-aware router computes) in the stream."""

# ruff: noqa: E402 - each module skips (with its reason) before it imports vLLM
from __future__ import annotations

from vllm_env import skip_module_if_unavailable

skip_module_if_unavailable()

import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import zmq
from engine_manager import ManagerProcess, manager_in_short_dir
from event_stream import EventStream, free_port
from vllm.distributed.kv_events import AllBlocksCleared, BlockRemoved, BlockStored, KVEventBatch
from vllm_harness import BLOCK, Engine, make_request, make_vllm_config, prompt_tokens

pytestmark = [pytest.mark.vllm, pytest.mark.native]

BLOCK_BYTES = 1 << 20


class Stream(EventStream):
    """The Manager's stream decoded as vLLM's `KVEventBatch`."""

    def __init__(self, endpoint: str) -> None:
        super().__init__(endpoint, KVEventBatch)

    def stored(self) -> list[Any]:
        return self.hashes(BlockStored)

    def removed(self) -> list[Any]:
        return self.hashes(BlockRemoved)


def replay(endpoint: str, start: int) -> tuple[list[tuple[bytes, int, bytes]], bool]:
    """vLLM's replay request (a DEALER sends an empty frame and the start sequence number):
    the batches from `start` on, and whether the end marker (-1) came."""
    ctx = zmq.Context()
    d = ctx.socket(zmq.DEALER)
    d.connect(endpoint)
    d.send_multipart([b"", start.to_bytes(8, "big")])
    out: list[tuple[bytes, int, bytes]] = []
    ended = False
    while d.poll(5000):
        _, topic, seq, payload = d.recv_multipart()
        if int.from_bytes(seq, "big", signed=True) == -1:
            ended = True
            break
        out.append((topic, int.from_bytes(seq, "big"), payload))
    d.close(0)
    ctx.term()
    return out, ended


@pytest.fixture
def events_manager(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[ManagerProcess, str, str]]:
    pub, rep = f"tcp://127.0.0.1:{free_port()}", f"tcp://127.0.0.1:{free_port()}"
    tmp = Path(tmp_path_factory.mktemp("mgr", numbered=True))
    args = ("--kv-events", pub, "--kv-events-replay", rep)
    with manager_in_short_dir(tmp, "okve", extra_args=args) as m:
        yield m, pub, rep


def test_stored_and_removed_blocks_decode_with_vllms_classes_and_replay(events_manager) -> None:  # type: ignore[no-untyped-def]
    m, pub, rep = events_manager
    stream = Stream(pub)
    fp = bytes(range(32))
    first = [bytes([1, i]) * 16 for i in range(10)]
    more = [bytes([2, i]) * 16 for i in range(70)]
    try:
        with m.client() as c:
            ns = c.register_namespace(fp, BLOCK_BYTES)
            assert c.save(ns, first, bytearray(len(first) * BLOCK_BYTES)).stored == len(first)
            stream.until(lambda: len(stream.stored()) >= len(first))
            assert stream.stored() == first, "each committed block, once, as bytes"
            # the 64 MiB arena holds 64 blocks: saving 70 more (16 at a time) evicts
            for i in range(0, len(more), 16):
                part = more[i : i + 16]
                assert c.save(ns, part, bytearray(len(part) * BLOCK_BYTES)).stored == len(part)
            stream.until(lambda: len(stream.stored()) >= len(first) + len(more) and bool(stream.removed()))
            time.sleep(0.3)
            stream.until(lambda: True)
            # what the stream says is visible is what the Manager serves
            visible = [h for h in first + more if h in set(stream.stored()) - set(stream.removed())]
            for h in first + more:
                with c.lookup(ns, [h]) as lease:
                    assert lease.hit_blocks == (1 if h in visible else 0), h
            c.reset_generation(ns)
            stream.until(lambda: set(stream.removed()) >= set(visible))
        topics = {t for t, _ in stream.events()}
        assert topics == {fp.hex().encode() + b".0"}, topics
        for _, e in stream.events():
            assert e.medium == "CPU" and not isinstance(e, AllBlocksCleared)
            if isinstance(e, BlockStored):
                assert (e.parent_block_hash, e.token_ids, e.block_size, e.lora_id) == (None, [], 0, None)
        seqs = [s for _, s, _, _ in stream.batches]
        assert seqs == list(range(seqs[0], seqs[0] + len(seqs))), "one sequence number per batch, no gap"
        stats = m.stats()
        setting = {"enabled": True, "endpoint": pub, "replay": rep, "buffer": 10000, "hash_form": "bytes"}
        assert stats["kv_events"] == setting, "`orbitkv status` names the endpoints"
        assert stats["kv_events_published_total"] == len(stream.stored()) + len(stream.removed())
        assert stats["kv_events_dropped_total"] == 0

        live = [(t, s, p) for t, s, _, p in stream.batches]
        got, ended = replay(rep, seqs[2])
        assert ended and got == [b for b in live if b[1] >= seqs[2]], "replay: the same frames from that sequence on"
        assert m.stats()["kv_events_replays_total"] == 1
    finally:
        stream.close()


def test_a_block_moved_to_ssd_is_in_storage_and_back_in_cpu_once_staged(
    tmp_path_factory: pytest.TempPathFactory,
) -> None:
    """Per-tier media: a block the Manager demotes from DRAM to its SSD is stored under
    `STORAGE` and removed from `CPU` (in that order); staged back by a restore, it is
    stored under `CPU` and removed from `STORAGE`. A view keyed by (hash, medium) never
    loses it."""
    pub = f"tcp://127.0.0.1:{free_port()}"
    tmp = Path(tmp_path_factory.mktemp("mgr", numbered=True))
    ssd = tmp / "ssd"
    ssd.mkdir(mode=0o700)
    args = ("--kv-events", pub, "--ssd-dir", str(ssd), "--ssd-capacity", "512MiB", "--ssd-mode", "kernel")
    args += ("--ssd-write-policy", "eager")
    with manager_in_short_dir(tmp / "m", "okvs", extra_args=args) as m:
        stream = Stream(pub)
        first = [bytes([7, i]) * 16 for i in range(8)]
        more = [bytes([8, i]) * 16 for i in range(96)]
        try:
            with m.client() as c:
                ns = c.register_namespace(b"\x06" * 32, BLOCK_BYTES)
                data = bytes(range(256)) * (len(first) * BLOCK_BYTES // 256)
                c.save(ns, first, data)
                deadline = time.monotonic() + 20
                while m.stats()["ssd_spilled_blocks_total"] < len(first):  # written behind to SSD
                    assert time.monotonic() < deadline, m.stats()
                    time.sleep(0.05)
                for i in range(0, len(more), 16):  # 104 blocks through a 64-block arena
                    c.save(ns, more[i : i + 16], bytearray(16 * BLOCK_BYTES))
                stream.until(lambda: set(first) <= {h for h, m in stream.with_media(BlockStored) if m == "STORAGE"})
                # Slots still being written behind to SSD cannot take the staged blocks:
                # let the writer finish (on a loaded machine it trails the saves).
                m.quiet_counter("ssd_spilled_blocks_total")
                out = bytearray(len(first) * BLOCK_BYTES)
                with c.lookup(ns, first) as lease:
                    assert lease.hit_blocks == len(first) and len(lease.ssd_blocks) == len(first)
                    c.restore(lease, out)
                assert bytes(out) == data
                stream.until(lambda: set(first) <= {h for h, m in stream.with_media(BlockRemoved) if m == "STORAGE"})
            media: dict[bytes, set[str]] = {}
            seen: dict[bytes, list[tuple[str, str]]] = {}
            for _, e in stream.events():
                for h in e.block_hashes:
                    kind = "stored" if isinstance(e, BlockStored) else "removed"
                    seen.setdefault(h, []).append((kind, e.medium))
                    if kind == "stored":
                        media.setdefault(h, set()).add(e.medium)
                    else:
                        media.get(h, set()).discard(e.medium)
                    if h in first:
                        assert media.get(h), f"{h.hex()[:8]} absent from the view after {seen[h]}"
            for h in first:
                assert seen[h] == [
                    ("stored", "CPU"),
                    ("stored", "STORAGE"),
                    ("removed", "CPU"),
                    ("stored", "CPU"),
                    ("removed", "STORAGE"),
                ], seen[h]
            assert m.stats()["kv_events_dropped_total"] == 0
        finally:
            stream.close()


def test_int_hashes_on_an_ipc_socket_in_a_private_directory(tmp_path_factory: pytest.TempPathFactory) -> None:
    """vLLM's 64-bit form of the hashes; an ipc socket only in a directory no one else can enter."""
    tmp = Path(tmp_path_factory.mktemp("mgr", numbered=True))
    shared = tmp / "shared"
    shared.mkdir(mode=0o755)
    shared.chmod(0o755)
    with pytest.raises(RuntimeError, match="no access for group or others"):
        with manager_in_short_dir(tmp / "a", "okva", extra_args=("--kv-events", f"ipc://{shared}/e.sock")):
            pass
    private = tmp / "private"
    private.mkdir(mode=0o700)
    pub = f"ipc://{private}/e.sock"
    with manager_in_short_dir(tmp / "b", "okvi", extra_args=("--kv-events", pub, "--kv-events-int-hashes")) as m:
        stream = Stream(pub)
        hashes = [bytes([3, i]) * 16 for i in range(4)]
        try:
            with m.client() as c:
                ns = c.register_namespace(b"\x05" * 32, BLOCK_BYTES)
                c.save(ns, hashes, bytearray(len(hashes) * BLOCK_BYTES))
            stream.until(lambda: len(stream.stored()) >= len(hashes))
            # vLLM's maybe_convert_block_hash with VLLM_KV_EVENTS_USE_INT_BLOCK_HASHES=1
            assert stream.stored() == [int.from_bytes(h, "big") & ((1 << 64) - 1) for h in hashes]
        finally:
            stream.close()


def test_a_vllm_requests_own_block_hashes_are_published(model_dir: Path, events_manager) -> None:  # type: ignore[no-untyped-def]
    """What a KV-aware router computes for a request (vLLM's block hashes) is what the
    Manager publishes once the released Scheduler's engine saved it."""
    m, pub, _ = events_manager
    stream = Stream(pub)
    prompt = prompt_tokens(100, seed=41)
    try:
        e = Engine.build(make_vllm_config(model_dir, socket_path=str(m.socket_path)))
        r = e.submit(prompt)
        e.run_to_completion([r.request_id])
        e.run_until_drained()
        want = list(make_request(prompt).block_hashes)[: len(prompt) // BLOCK]
        stream.until(lambda: len(stream.stored()) >= len(want))
        assert stream.stored()[: len(want)] == want
        e.shutdown()
    finally:
        stream.close()
