"""The OrbitKV linker inside the released SGLang 0.5.21 UnifiedRadixCache, with a real
Manager process, on CPU tensors (contracts S1, S2, L1-L3, L7, O5, K3, K4).

Every test checks the bytes a request reads for *every* position (restored, natively
matched and computed) against what that request would compute, and that the adapter and
the Manager end drained (no lookup lease, load, save or Manager lease left).
"""

from __future__ import annotations

import os
import signal
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from sglang_env import V0_5_23, ManagerProcess, skip_module_if_unavailable

skip_module_if_unavailable()

import torch  # noqa: E402
from engine_manager import stop_all_threads  # noqa: E402
from sglang_harness import PAGE, Engine, prompt  # noqa: E402

pytestmark = pytest.mark.sglang
NewEngine = Callable[..., Engine]  # the `new_engine` fixture


@pytest.fixture
def new_engine(orbit_manager: ManagerProcess) -> Iterator[NewEngine]:
    """Makes engines on `orbit_manager` (keywords as `Engine`'s), each closed after the test."""
    made: list[Engine] = []

    def make(**kwargs: Any) -> Engine:
        made.append(Engine(str(orbit_manager.socket_path), **kwargs))
        return made[-1]

    yield make
    for e in made:
        e.close()


def assert_drained(*engines: Engine, manager: ManagerProcess | None = None) -> None:
    for e in engines:
        e.step()
        assert e.drained() == {"query_leases": 0, "queued_loads": 0, "load_batches": 0, "offloads": 0}
    if manager is not None:
        manager.settled_stats(live_leases=0, live_saves=0)


def test_cold_miss_offload_then_restore_byte_exact(orbit_manager: ManagerProcess, new_engine: NewEngine) -> None:
    tokens = prompt(1, 5)
    a = new_engine()
    first = a.serve(tokens)
    assert (first.device_hit, first.external_hit, first.computed) == (0, 0, 21)
    assert first.mismatched_bytes == 0
    assert a.linker.stats["offloaded_blocks"] == 5  # every complete page, saved once
    st = orbit_manager.stats()
    assert st["dram_visible_blocks"] == 5 and st["blocks_committed_total"] == 5

    b = new_engine()  # a second engine (fresh tree and pool): only OrbitKV can serve it
    again = b.serve(tokens)
    assert (again.device_hit, again.external_hit, again.computed) == (0, 5 * PAGE, 1)
    assert again.mismatched_bytes == 0
    # The query lease's release is quiet (possibly still queued in b's client).
    st = orbit_manager.settled_stats(live_leases=0)
    assert st["hit_blocks_total"] == 5 and st["leases_retired_total"] >= 1
    # Nothing offloaded twice: the restored path is marked as stored in the tree.
    assert b.linker.stats["offloaded_blocks"] == 0
    assert_drained(a, b, manager=orbit_manager)


def test_partial_hit_and_partial_destinations(orbit_manager: ManagerProcess, new_engine: NewEngine) -> None:
    base = prompt(2, 5)
    a = new_engine()
    assert a.serve(base).mismatched_bytes == 0

    b = new_engine()
    # Shares 3 pages with `base`, then diverges: OrbitKV restores exactly those 3.
    fork = base[: 3 * PAGE] + prompt(3, 2)[: 2 * PAGE + 1]
    got = b.serve(fork)
    assert (got.device_hit, got.external_hit, got.computed) == (0, 3 * PAGE, 2 * PAGE + 1)
    assert got.mismatched_bytes == 0
    # Now `base` on b: pages 0-2 are native (HBM) hits, only pages 3-4 come from OrbitKV,
    # into destinations after the native prefix (the lookup chains from its last page).
    got = b.serve(base)
    assert (got.device_hit, got.external_hit, got.computed) == (3 * PAGE, 2 * PAGE, 1)
    assert got.mismatched_bytes == 0
    assert_drained(a, b, manager=orbit_manager)


def test_native_hbm_hit_makes_no_external_query(orbit_manager: ManagerProcess, new_engine: NewEngine) -> None:
    e = new_engine()
    tokens = prompt(4, 4)
    assert e.serve(tokens).mismatched_bytes == 0
    lookups = e.linker.stats["lookups"]
    before = orbit_manager.stats()["lookups_total"]
    got = e.serve(tokens)
    assert (got.device_hit, got.external_hit) == (4 * PAGE, 0)
    assert got.mismatched_bytes == 0
    assert e.linker.stats["lookups"] == lookups  # O5: no lookup for blocks the engine holds
    assert orbit_manager.stats()["lookups_total"] == before
    assert_drained(e, manager=orbit_manager)


def test_abort_during_queued_load_then_same_prefix_exact(orbit_manager: ManagerProcess, new_engine: NewEngine) -> None:
    tokens = prompt(5, 5)
    a = new_engine()
    a.serve(tokens)

    b = new_engine()
    req = b.admit(tokens)  # admitted: the load is queued (0.5.21: its pages are already in b's tree)
    assert req.orbit_loaded == 5 * PAGE
    assert b.drained()["queued_loads"] == 1
    private = b.linker._queued[0].pages
    # Abort through the released lifecycle only: finish(ABORT) -> release_aborted_request.
    from sglang.srt.mem_cache.base_prefix_cache import CacheRequestOutcome

    b.cache.finish(req.cache_request_handle, CacheRequestOutcome.ABORT)
    if V0_5_23:
        # 0.5.23 loads into slots private to the request: the queued load is cancelled
        # for real (its lease released), and the scheduler frees those slots.
        assert b.linker.stats["cancelled_loads"] == 1 and b.drained()["queued_loads"] == 0
        b.alloc.free(torch.tensor([p * PAGE + o for p in private for o in range(PAGE)], dtype=torch.int64))
    else:
        assert b.linker.stats["cancel_refused"] == 1  # 0.5.21: never cancel a queued load
    b.unlock(req)  # the scheduler drops its lock
    b.step()

    # The same prefix again. 0.5.21: SGLang serves it from its tree (pages the aborted
    # request's load brought in; the queued load runs with this batch). 0.5.23: nothing
    # of the cancelled load reached the tree, so OrbitKV restores it again. Exact bytes.
    got = b.serve(tokens)
    if V0_5_23:
        assert got.device_hit == 0 and got.external_hit == 5 * PAGE
    else:
        assert got.device_hit == 5 * PAGE and got.external_hit == 0
    assert got.mismatched_bytes == 0
    assert_drained(a, b, manager=orbit_manager)


@pytest.mark.skipif(V0_5_23, reason="0.5.21 only: 0.5.23 loads into request-private slots, so the trap does not exist")
def test_control_a_real_cancel_serves_unloaded_pages(orbit_manager: ManagerProcess, new_engine: NewEngine) -> None:
    """Control for the test above: the 0.5.21 trap is real. A linker whose
    cancel_queued_load drops the queued load and returns True makes the released cache
    serve the never-loaded pages as an ordinary hit (wrong bytes)."""
    tokens = prompt(6, 5)
    new_engine().serve(tokens)
    b = new_engine()
    linker = b.linker

    def really_cancel(rid: str) -> bool:
        for ld in list(linker._queued):
            if ld.rid == rid:
                linker._queued.remove(ld)
                linker._release(ld.query)
                return True
        return False

    linker.cancel_queued_load = really_cancel  # type: ignore[method-assign]
    req = b.admit(tokens)
    from sglang.srt.mem_cache.base_prefix_cache import CacheRequestOutcome

    b.cache.finish(req.cache_request_handle, CacheRequestOutcome.ABORT)
    b.unlock(req)
    got = b.serve(tokens)
    assert got.device_hit == 5 * PAGE
    assert got.mismatched_bytes > 1000


def test_abort_while_waiting_releases_the_lookup_lease(orbit_manager: ManagerProcess, new_engine: NewEngine) -> None:
    tokens = prompt(7, 3)
    new_engine().serve(tokens)
    b = new_engine()
    before = orbit_manager.stats()["lookups_total"]
    req = b.abort_waiting(tokens, rematch=2)  # matched in three scheduling rounds, then aborted
    assert req.host_hit_length == 3 * PAGE  # the match saw (and staged) the hit
    # One Manager lookup: re-matches of a waiting request with the same tail reuse it.
    assert b.linker.stats["lookups"] == 1
    assert orbit_manager.stats()["lookups_total"] == before + 1
    # 0.5.21 releases it in cancel_queued_load; 0.5.23's release_request only drops the
    # hit marker (no load was queued), and the lease goes at the next event poll.
    b.step()
    assert b.linker.stats["query_leases_released"] == 1
    assert_drained(b, manager=orbit_manager)
    got = b.serve(tokens)  # and a later request still restores it
    assert got.external_hit == 3 * PAGE and got.mismatched_bytes == 0


def test_unselected_lookup_lease_is_released(orbit_manager: ManagerProcess, new_engine: NewEngine) -> None:
    """L1: load-back that cannot allocate pages drops SGLang's hit marker without a
    linker call; the staged lease is released at the next event poll."""
    tokens = prompt(18, 4)
    new_engine().serve(tokens)
    b = new_engine()
    hog = b.alloc.alloc(b.alloc.available_size())  # every free page held by "running" requests
    req = b.admit(tokens)
    assert req.host_hit_length == 4 * PAGE and req.orbit_loaded == 0
    assert orbit_manager.stats()["live_leases"] == 1
    b.step()
    assert b.linker.stats["query_leases_released"] == 1
    orbit_manager.settled_stats(live_leases=0)
    b.alloc.free(hog)
    got = b.run(req, tokens)
    assert got.computed == 4 * PAGE + 1 and got.mismatched_bytes == 0
    assert_drained(b, manager=orbit_manager)


def test_manager_sigkilled_during_queued_load(orbit_manager: ManagerProcess, tmp_path: Path) -> None:
    sock = str(orbit_manager.socket_path)
    tokens = prompt(8, 5)
    a = Engine(sock)
    a.serve(tokens)
    b = Engine(sock)
    req = b.admit(tokens)  # lookup hit staged in the arena, load queued
    assert req.orbit_loaded == 5 * PAGE
    orbit_manager.kill()
    # The request completes normally and reads exact bytes: the queued copy reads the
    # staged slots from the mapping, which outlives the Manager.
    got = b.run(req, tokens)
    assert got.mismatched_bytes == 0
    b.step()
    # Later requests recompute (lookups fail -> miss), never an error, never wrong bytes.
    other = prompt(9, 4)
    got = b.serve(other)
    assert (got.external_hit, got.computed) == (0, 4 * PAGE + 1)
    assert got.mismatched_bytes == 0
    c = Engine(sock)  # an engine started while no Manager runs: misses only
    got = c.serve(tokens)
    assert (got.external_hit, got.mismatched_bytes) == (0, 0)
    assert_drained(a, b, c)

    # A Manager restarted on the same socket is picked up again after the back-off.
    restarted = ManagerProcess(orbit_manager.socket_path, tmp_path / "restarted.log")
    try:
        time.sleep(1.1)
        fresh = prompt(10, 3)
        deadline = time.monotonic() + 10
        while b.linker.stats["offloaded_blocks"] == 0 and time.monotonic() < deadline:
            b.serve(fresh)
            fresh = prompt(int(time.monotonic() * 1000) % 100000 + 11, 3)
            time.sleep(0.3)
        assert b.linker.stats["offloaded_blocks"] > 0
        assert_drained(b, manager=restarted)
    finally:
        for e in (a, b, c):
            e.close()
        restarted.stop()


def test_a_stalled_manager_holds_one_match_not_one_per_reconnect(
    orbit_manager: ManagerProcess, new_engine: NewEngine
) -> None:
    """L7 under a long stall: the Manager stops answering (alive, socket open) while
    requests keep arriving. The call that meets the stall waits `orbitkv.timeout_ms` once
    and breaks the session; every reconnection attempt after it runs on a background
    thread (a silent Manager accepts the connect and never answers the handshake: on the
    scheduler thread each back-off period would cost another full timeout). Requests are
    computed meanwhile, exact; once the Manager runs again the engine offloads again."""
    timeout_s = 1.0
    # No eviction in this harness: a pool for every request of the stall (~4 pages each).
    e = new_engine(pages=1024, settings={"orbitkv.timeout_ms": int(timeout_s * 1000)})
    assert e.serve(prompt(30, 3)).mismatched_bytes == 0
    assert e.linker.stats["offloaded_blocks"] > 0  # connected before the stall
    slow: list[float] = []
    served = 0
    stop_all_threads(orbit_manager.proc.pid)
    try:
        end = time.monotonic() + 8.0  # the back-off reaches 4 s: four attempts
        while time.monotonic() < end:
            t0 = time.monotonic()
            got = e.serve(prompt(31 + served, 3))
            took = time.monotonic() - t0
            assert got.mismatched_bytes == 0 and got.external_hit == 0
            served += 1
            if took > 0.9 * timeout_s:
                slow.append(round(took, 3))
            time.sleep(0.1)  # requests keep arriving, not as fast as possible
    finally:
        os.kill(orbit_manager.proc.pid, signal.SIGCONT)
    assert served > 10, served
    assert len(slow) == 1, f"requests that waited on the stalled Manager: {slow}"
    before = e.linker.stats["offloaded_blocks"]
    deadline = time.monotonic() + 40  # the back-off may have reached 8 s
    while e.linker.stats["offloaded_blocks"] == before:
        assert time.monotonic() < deadline, "the engine never offloaded again"
        e.serve(prompt(100 + served, 3))
        served += 1
        time.sleep(0.2)
    assert_drained(e, manager=orbit_manager)


def test_load_failure_injected_in_the_manager_recomputes(orbit_manager: ManagerProcess, new_engine: NewEngine) -> None:
    tokens = prompt(12, 4)
    a = new_engine()
    a.serve(tokens)
    with orbit_manager.client() as c:
        c.inject_faults(restore_failures=1)
    b = new_engine()
    got = b.serve(tokens)
    # The staging failed inside the lookup, before SGLang committed anything: a miss.
    assert (got.external_hit, got.computed) == (0, 4 * PAGE + 1)
    assert got.mismatched_bytes == 0
    assert b.linker.stats["lookup_errors"] == 1
    assert orbit_manager.stats()["restore_failures_injected_total"] == 1
    assert_drained(a, b, manager=orbit_manager)
    c2 = new_engine()  # the entries are intact: the next engine restores them
    got = c2.serve(tokens)
    assert got.external_hit == 4 * PAGE and got.mismatched_bytes == 0


def test_two_salts_never_share(orbit_manager: ManagerProcess, new_engine: NewEngine) -> None:
    tokens = prompt(13, 4)
    a = new_engine()
    assert a.serve(tokens, cache_salt="tenant-a").mismatched_bytes == 0
    b = new_engine()
    for salt in ("tenant-b", None):
        got = b.serve(tokens, cache_salt=salt)
        assert got.external_hit == 0, salt
        assert got.mismatched_bytes == 0
    c = new_engine()
    got = c.serve(tokens, cache_salt="tenant-a")
    assert got.external_hit == 4 * PAGE and got.mismatched_bytes == 0
    assert_drained(a, b, c, manager=orbit_manager)


def _adapter(path: Path, weights: bytes) -> str:
    path.mkdir(parents=True, exist_ok=True)
    (path / "adapter_config.json").write_text('{"peft_type": "LORA", "r": 4, "target_modules": ["q_proj"]}')
    (path / "adapter_model.safetensors").write_bytes(weights)
    return str(path)


def test_lora_set_change_moves_the_namespace(
    orbit_manager: ManagerProcess, new_engine: NewEngine, tmp_path: Path
) -> None:
    v1 = _adapter(tmp_path / "v1" / "ad", b"weights-one" * 64)
    tokens = prompt(14, 4)

    def engine(path: str) -> Engine:
        # The KV "model" depends on the adapter contents, as real KV would.
        tag = (Path(path) / "adapter_model.safetensors").read_bytes().hex()[:16]
        return new_engine(server_args={"lora_paths": [f"ad={path}"]}, adapter_tag=tag)

    a = engine(v1)
    lora_id = a.lora_refs[0].lora_id
    assert a.serve(tokens, lora_id=lora_id).mismatched_bytes == 0
    same = engine(v1)
    got = same.serve(tokens, lora_id=lora_id)
    assert got.external_hit == 4 * PAGE and got.mismatched_bytes == 0

    # Same name and path, different weights: a new namespace, so a miss (not stale KV).
    v2 = _adapter(tmp_path / "v1" / "ad", b"weights-two" * 64)
    changed = engine(v2)
    assert changed.lora_refs[0].lora_id == lora_id  # SGLang's own id does not change
    assert changed.linker.fingerprint != a.linker.fingerprint
    got = changed.serve(tokens, lora_id=lora_id)
    assert got.external_hit == 0 and got.mismatched_bytes == 0
    # LoRA off entirely: another namespace again.
    plain = new_engine()
    assert plain.linker.fingerprint not in (a.linker.fingerprint, changed.linker.fingerprint)
    assert plain.serve(tokens).external_hit == 0
    assert_drained(a, same, changed, plain, manager=orbit_manager)


def test_caller_extra_key_is_rejected(orbit_manager: ManagerProcess, new_engine: NewEngine) -> None:
    """K3: a caller `extra_key` fails that request with HTTP 400 naming `extra_key`, at
    its first match (the release's mid-flight abort, `Req.to_finish`); the cache keeps
    serving other requests. It is never looked up in OrbitKV, and nothing it computed
    is inserted into the tree or offloaded."""
    from http import HTTPStatus

    from sglang.srt.managers.schedule_batch import FINISH_ABORT

    tokens = prompt(15, 3)
    new_engine().serve(tokens)  # OrbitKV holds this prefix (no extra_key)
    a = new_engine()
    req = a.admit(tokens, extra_key="caller-key")
    # Rejected at the match, before admission: no lookup, no load.
    assert isinstance(req.to_finish, FINISH_ABORT) and req.orbit_loaded == 0
    got = a.run(req, tokens)
    reason = got.finished_reason
    assert isinstance(reason, FINISH_ABORT), reason
    assert reason.status_code == HTTPStatus.BAD_REQUEST and reason.err_type == "BadRequestError"
    assert "extra_key" in reason.message and "cache_salt" in reason.message
    assert got.mismatched_bytes == 0
    assert a.linker.stats["lookups"] == 0 and a.linker.stats["extra_key_rejected"] == 1
    assert a.linker.stats["offloaded_blocks"] == 0
    # Not inserted into the tree: the same request again is matched from nothing, and
    # rejected again (with LoRA, the caller part is still there: same outcome).
    again = a.serve(tokens, extra_key="caller-key")
    assert again.device_hit == 0 and isinstance(again.finished_reason, FINISH_ABORT)
    assert a.linker.stats["extra_key_rejected"] == 2 and a.linker.stats["lookups"] == 0
    # The same cache serves the next ordinary request: restored from OrbitKV, exact.
    ok = a.serve(tokens)
    assert ok.finished_reason is None  # not failed during its step
    assert (ok.external_hit, ok.mismatched_bytes) == (3 * PAGE, 0)
    assert_drained(a, manager=orbit_manager)
    assert orbit_manager.stats()["dram_visible_blocks"] == 3  # only the plain request's pages


def test_lora_id_alone_is_not_a_caller_extra_key(
    orbit_manager: ManagerProcess, new_engine: NewEngine, tmp_path: Path
) -> None:
    """SGLang writes the LoRA id into `extra_key`: that alone is not rejected, a caller
    key next to it is."""
    from sglang.srt.managers.schedule_batch import FINISH_ABORT

    path = _adapter(tmp_path / "ad", b"weights" * 64)
    e = new_engine(server_args={"lora_paths": [f"ad={path}"]})
    lora_id = e.lora_refs[0].lora_id
    tokens = prompt(19, 3)
    got = e.serve(tokens, lora_id=lora_id)
    assert got.finished_reason is None and got.req.extra_key == lora_id
    assert e.linker.stats["offloaded_blocks"] == 3
    bad = e.serve(prompt(20, 3), lora_id=lora_id, extra_key="caller-key")
    assert isinstance(bad.finished_reason, FINISH_ABORT) and "extra_key" in bad.finished_reason.message
    assert e.linker.stats["offloaded_blocks"] == 3
    assert_drained(e, manager=orbit_manager)


def test_flush_cache_keeps_same_weight_external_reuse(orbit_manager: ManagerProcess, new_engine: NewEngine) -> None:
    e = new_engine()
    tokens = prompt(16, 4)
    assert e.serve(tokens).mismatched_bytes == 0
    # flush_cache: Scheduler.flush_cache -> tree_cache.reset() (linker reset first), then the
    # pools are cleared. The Manager's entries (same weights, same namespace) stay.
    e.cache.reset()
    e.req_pool.clear()
    e.alloc.clear()
    got = e.serve(tokens)
    assert (got.device_hit, got.external_hit) == (0, 4 * PAGE)
    assert got.mismatched_bytes == 0
    assert_drained(e, manager=orbit_manager)


def test_mla_pool_restores_byte_exact(orbit_manager: ManagerProcess, new_engine: NewEngine) -> None:
    tokens = prompt(17, 5)
    a = new_engine(kind="mla")
    assert a.serve(tokens).mismatched_bytes == 0
    b = new_engine(kind="mla")
    got = b.serve(tokens)
    assert got.external_hit == 5 * PAGE and got.mismatched_bytes == 0
    # MHA and MLA pools never share a namespace.
    assert b.linker.fingerprint != new_engine().linker.fingerprint
    assert_drained(a, b, manager=orbit_manager)
