"""What differs between the qualified vLLM pins (orbitkv.vllm.compat), on the released
package that is installed: the release module selected, unknown versions rejected, and
each pin's own behaviour - per-tier hit reporting and sleep mode from 0.33.0, sleep mode
rejected on 0.31.0, the extensible KV cache accepted and saves ordered before the next
step on 0.34.0. run.sh runs this module once per pin; a test for the other pin is
skipped with the pin named."""

# ruff: noqa: E402 - each module skips (with its reason) before it imports vLLM
from __future__ import annotations

from vllm_env import skip_module_if_unavailable

skip_module_if_unavailable()

import os
import shutil
import signal
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import vllm
from vllm.distributed.kv_transfer.kv_connector.factory import KVConnectorFactory
from vllm.distributed.kv_transfer.kv_connector.v1.base import KVConnectorRole
from vllm.v1.request import RequestStatus
from vllm_env import ManagerProcess
from vllm_harness import (
    BLOCK,
    Engine,
    kv_connector_output,
    make_kv_cache_config,
    make_request,
    make_vllm_config,
    runner_output,
)
from vllm_harness import prompt_tokens as tokens

from orbitkv.vllm import compat
from orbitkv.vllm.connector import OrbitKVConnector
from orbitkv.vllm.errors import UnsupportedProfileError
from orbitkv.vllm.metadata import LoadSpec, OrbitKVConnectorMetadata

pytestmark = [pytest.mark.vllm, pytest.mark.native]

NO_MANAGER = "/nonexistent/orbitkv-compat-test.sock"
PROMPT = tokens(100, seed=33)  # 6 full blocks + 4 tokens
FULL_BLOCKS = len(PROMPT) // BLOCK
only_033 = pytest.mark.skipif(
    vllm.__version__ not in ("0.33.0", "0.34.0"), reason="vLLM 0.33.0 hook, kept in 0.34.0 (this run: another pin)"
)
only_034 = pytest.mark.skipif(vllm.__version__ != "0.34.0", reason="vLLM 0.34.0 guard (this run: another pin)")
only_031 = pytest.mark.skipif(vllm.__version__ != "0.31.0", reason="vLLM 0.31.0 guard (this run: another pin)")


def _run_checked(e: Engine, r: Any, steps: list[Any] | None = None) -> list[Any]:
    """Run `r` to completion; once its prompt is computed, check its pages byte-exact."""
    steps = list(steps or [])

    def prefilled() -> bool:
        q = e.scheduler.requests.get(r.request_id)
        return q is not None and q.status == RequestStatus.RUNNING and q.num_computed_tokens >= len(PROMPT)

    steps += e.run_until(prefilled, what="prefill")
    e.check_pages(r, len(PROMPT))
    return steps + e.run_to_completion([r.request_id])


def assert_rejected_in_both_roles(cfg: Any, match: str) -> None:
    """Building the connector from `cfg` raises UnsupportedProfileError matching `match`
    in the scheduler role and in the worker role."""
    for role in (KVConnectorRole.SCHEDULER, KVConnectorRole.WORKER):
        with pytest.raises(UnsupportedProfileError, match=match):
            KVConnectorFactory.create_connector(cfg, role, make_kv_cache_config(64, "LBNHC"))


def test_the_installed_release_selects_its_module() -> None:
    release = compat.current()
    assert release.VERSION == vllm.__version__ and vllm.__version__ in compat.SUPPORTED_PINS
    assert compat.SUPPORTED_PINS == ("0.31.0", "0.33.0", "0.34.0")
    # Only a runner that rewrites blocks before it reports preemptions (0.34) orders saves.
    assert release.SAVES_BEFORE_NEXT_STEP is (vllm.__version__ == "0.34.0")
    # The release's own hooks precede the base class, once, in the connector's MRO.
    assert OrbitKVConnector.__mro__[1] is release.ConnectorHooks


@pytest.mark.parametrize("version", ["0.32.0", "0.33.1", "0.34.1", "0.31.0rc1", ""])
def test_an_unknown_version_is_rejected_naming_the_pins(version: str) -> None:
    with pytest.raises(UnsupportedProfileError, match=r"vllm 0\.31\.0, 0\.33\.0, 0\.34\.0, found"):
        compat.select(version)


def test_the_connector_rejects_an_unknown_installed_version(model_dir: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(vllm, "__version__", "0.32.0")
    monkeypatch.setattr(compat, "_current", None)  # selected again from the (patched) version
    cfg = make_vllm_config(model_dir, socket_path=NO_MANAGER)
    with pytest.raises(UnsupportedProfileError, match=r"0\.31\.0, 0\.33\.0, 0\.34\.0, found 0\.32\.0"):
        KVConnectorFactory.create_connector(cfg, KVConnectorRole.SCHEDULER, make_kv_cache_config(64, "LBNHC"))


# ---- 0.34.0: the extensible KV cache ----------------------------------------------------


@only_034
def test_the_extensible_kv_cache_is_accepted_on_0_34(model_dir: Path) -> None:
    """On by default on CUDA (off on CPU): each layer over a storage of its own, which the
    page geometry takes (`test_layout.py`, `test_kvcopy_flow.py`); both roles build."""
    cfg = make_vllm_config(model_dir, socket_path=NO_MANAGER)
    assert cfg.cache_config.enable_extensible_kv_cache is False  # CPU resolves it off
    cfg.cache_config.enable_extensible_kv_cache = True
    for role in (KVConnectorRole.SCHEDULER, KVConnectorRole.WORKER):
        KVConnectorFactory.create_connector(cfg, role, make_kv_cache_config(64, "LBNHC")).shutdown()


# ---- sleep mode -----------------------------------------------------------------------


@only_031
def test_sleep_mode_is_rejected_on_0_31_naming_the_setting(model_dir: Path) -> None:
    cfg = make_vllm_config(model_dir, socket_path=NO_MANAGER)
    cfg.model_config.enable_sleep_mode = True
    assert_rejected_in_both_roles(cfg, "--enable-sleep-mode")


@only_033
def test_sleep_mode_is_declared_supported_on_0_33(model_dir: Path) -> None:
    cfg = make_vllm_config(model_dir, socket_path=NO_MANAGER)
    assert OrbitKVConnector.supports_sleep_mode(cfg.kv_transfer_config) is True
    cfg.model_config.enable_sleep_mode = True  # the connector itself accepts it
    conn = KVConnectorFactory.create_connector(cfg, KVConnectorRole.WORKER, make_kv_cache_config(64, "LBNHC"))
    conn.unregister_kv_caches()  # nothing registered or in flight: a no-op, idempotent
    conn.unregister_kv_caches()
    conn.restore_kv_caches()
    conn.restore_kv_caches()
    conn.shutdown()


def _saved(model_dir: Path, manager: ManagerProcess, **kw: Any) -> None:
    a = Engine.build(make_vllm_config(model_dir, socket_path=str(manager.socket_path), **kw))
    r = make_request(PROMPT)
    a.scheduler.add_request(r)
    a.run_to_completion([r.request_id])
    assert a.connector.scheduler_side.counters["saved_blocks"] >= FULL_BLOCKS
    a.shutdown()


@only_033
@pytest.mark.parametrize("copy_engine", ["auto", "torch"])
def test_sleep_mid_load_drains_the_copy_refuses_transfers_and_resumes(
    model_dir: Path, orbit_manager: ManagerProcess, copy_engine: str
) -> None:
    """vLLM 0.33.0's Worker.sleep calls unregister_kv_caches before it releases the KV
    memory: the load in flight has written its pages when the call returns, nothing is
    copied while unregistered, and after restore_kv_caches the request completes
    byte-exact and the engine saves again."""
    extra = {"orbitkv.copy_engine": copy_engine}
    _saved(model_dir, orbit_manager, extra=extra)
    b = Engine.build(make_vllm_config(model_dir, socket_path=str(orbit_manager.socket_path), extra=extra))
    w = b.worker
    r = b.submit(PROMPT)
    # One step by hand, up to the point where the load was submitted to the worker
    # (earlier steps only wait for the background lookup: they carry no load).
    so = b.schedule_admitting(r)
    meta = so.kv_connector_metadata
    assert isinstance(meta, OrbitKVConnectorMetadata) and [len(s.block_ids) for s in meta.loads] == [FULL_BLOCKS]
    w.handle_preemptions(meta)
    w.bind_connector_metadata(meta)
    w.start_load_kv(None)
    w.unregister_kv_caches()  # what Worker.sleep does first
    # The copy completed before the call returned: the pages hold the saved bytes.
    b.check_pages(r, FULL_BLOCKS * BLOCK)
    w.wait_for_save()  # no save this step
    out = kv_connector_output(w, so)  # the step ends normally while unregistered
    b.scheduler.update_from_output(so, runner_output([], [], out))
    # While unregistered, a transfer is refused, naming sleep mode.
    w.bind_connector_metadata(OrbitKVConnectorMetadata(loads=[LoadSpec("x", b"", tuple(r.block_hashes[:1]), (0,))]))
    with pytest.raises(RuntimeError, match="sleep mode"):
        w.start_load_kv(None)
    w.clear_connector_metadata()
    w.restore_kv_caches()  # Worker.wake_up
    _run_checked(b, r)
    c = b.connector.scheduler_side.counters
    assert (c["hit_blocks"], c["loads_finished"], c["loads_failed"]) == (FULL_BLOCKS, 1, 0)
    # Saving works again after the wake-up.
    r2 = make_request(tokens(40, seed=34))
    b.scheduler.add_request(r2)
    b.run_to_completion([r2.request_id])
    b.run_until_drained()
    assert c["saved_blocks"] >= 2 and c["failed_saves"] == 0
    b.assert_drained()
    b.shutdown()


# ---- per-tier hits (get_external_cache_hit_sources) ------------------------------------


def _hits_by_source(steps: list[Any]) -> dict[str, int]:
    """What vLLM's own connector prefix-cache stats recorded, by tier (Prometheus label)."""
    out: dict[str, int] = {}
    for step in steps:
        for eco in step.engine_outputs.values():
            stats = eco.scheduler_stats
            cps = stats.connector_prefix_cache_stats if stats is not None else None
            for src, n in (cps.hits_by_source if cps is not None else {}).items():
                out[src.value] = out.get(src.value, 0) + n
    return out


@pytest.fixture
def ssd_manager(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Path, list[ManagerProcess]]]:
    """A socket directory and the Manager processes started on it (SSD tier on)."""
    d = Path(tmp_path_factory.mktemp("mgr-ssd", numbered=True))
    short = Path("/tmp") / f"okv-{os.getpid()}-{d.name}"
    short.mkdir(mode=0o700, exist_ok=True)
    started: list[ManagerProcess] = []
    try:
        yield d, started
    finally:
        for m in started:
            m.stop()
        shutil.rmtree(short, ignore_errors=True)


def _start_ssd_manager(d: Path, started: list[ManagerProcess]) -> ManagerProcess:
    short = Path("/tmp") / f"okv-{os.getpid()}-{d.name}"
    sock = short / "m.sock"
    sock.unlink(missing_ok=True)  # the previous (killed) Manager's socket
    ssd = ("--ssd-dir", str(d / "ssd"), "--ssd-capacity", "64MiB", "--ssd-admit-hits", "0")
    m = ManagerProcess(
        sock, d / f"manager-{len(started)}.log", fault_injection=False, extra_args=(*ssd, "--ssd-write-policy", "eager")
    )
    started.append(m)
    return m


def _wait_spilled(m: ManagerProcess, blocks: int) -> None:
    deadline = time.monotonic() + 20
    while m.stats()["ssd_spilled_blocks_total"] < blocks:
        assert time.monotonic() < deadline, m.stats()
        time.sleep(0.05)


@only_033
def test_hits_are_reported_by_tier_dram_then_ssd_then_mixed(
    ssd_manager: tuple[Path, list[ManagerProcess]], model_dir: Path
) -> None:
    d, started = ssd_manager
    m = _start_ssd_manager(d, started)
    _saved(model_dir, m)
    _wait_spilled(m, FULL_BLOCKS)

    def hit_run(manager: ManagerProcess) -> tuple[dict[str, int], Engine]:
        e = Engine.build(make_vllm_config(model_dir, socket_path=str(manager.socket_path)))
        r = make_request(PROMPT)
        e.scheduler.add_request(r)
        return _hits_by_source(_run_checked(e, r)), e

    # 1. DRAM: the Manager still holds every block in DRAM (the spill keeps a copy).
    by_tier, e = hit_run(m)
    assert by_tier == {"host": FULL_BLOCKS * BLOCK}, by_tier
    e.shutdown()
    # 2. SSD: after a Manager restart only the SSD tier holds the blocks.
    m.proc.send_signal(signal.SIGKILL)
    m.proc.wait()
    m2 = _start_ssd_manager(d, started)
    assert m2.stats()["ssd_dormant_blocks"] >= FULL_BLOCKS
    by_tier, e = hit_run(m2)
    assert by_tier == {"disk": FULL_BLOCKS * BLOCK}, by_tier
    assert m2.stats()["ssd_staged_blocks_total"] == FULL_BLOCKS
    e.shutdown()
    # 3. Mixed: restart again, stage the first two blocks back by hand; the load then
    # takes two blocks from DRAM and four from SSD, reported per tier.
    m2.proc.send_signal(signal.SIGKILL)
    m2.proc.wait()
    m3 = _start_ssd_manager(d, started)
    e = Engine.build(make_vllm_config(model_dir, socket_path=str(m3.socket_path)))
    probe = make_request(PROMPT)
    conn = e.worker.worker_side.session
    client = conn.client()
    lease = client.lookup(conn.namespace(b""), list(probe.block_hashes[:2]))
    assert (lease.hit_blocks, lease.ssd_blocks) == (2, [0, 1])
    client.acquire(lease)  # stages both into DRAM
    client.release(lease)
    r = make_request(PROMPT)
    e.scheduler.add_request(r)
    # Lookup (in the background), then allocation; the lease is held until the load
    # drains. Asked before the step runs: a fast load may drain within its own step.
    so = e.schedule_admitting(r)
    assert e.status(r.request_id) == RequestStatus.WAITING_FOR_REMOTE_KVS
    side = e.connector.scheduler_side
    # A shorter selection counts only its own blocks: of the first three, one is on SSD.
    assert side.hit_tiers(r, 3 * BLOCK) == (2 * BLOCK, BLOCK)
    assert e.connector.get_external_cache_hit_sources(r, 0) == {}
    first = e.execute(so)
    steps = _run_checked(e, r, [first])
    assert _hits_by_source(steps) == {"host": 2 * BLOCK, "disk": (FULL_BLOCKS - 2) * BLOCK}
    assert side.hit_tiers(r, 3 * BLOCK) == (0, 0)  # no lease once the load drained
    e.run_until_drained()
    e.assert_drained()
    e.shutdown()
