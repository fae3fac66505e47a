"""Retention hints through the released SGLang UnifiedRadixCache (0.5.21 and 0.5.23, L2).

An application passes `sampling_params={"custom_params": {"orbitkv_retention": {...}}}`;
when the request finishes (0.5.21 `insert_req`, 0.5.23 the final `checkpoint`) the linker
sends the hint for SGLang's page chain of the request, the keys its pages were saved
under (written through at insert; the saves commit after the hint, so it waits in the
Manager and applies at commit).

- A conversation that continues (`keep_for_s`) outlives a flood that evicts an unhinted
  prompt saved at the same time: a fresh engine restores it whole, byte-exact, and
  recomputes the unhinted one.
- `done` marks the chain for the Manager to evict first.
- A malformed hint is refused with its reason in the log, counted, and the request runs
  (and is offloaded) as if it had none; a request without a hint sends nothing.
"""

from __future__ import annotations

import logging
import os
from pathlib import Path
from typing import Any

import pytest
from sglang_env import skip_module_if_unavailable

skip_module_if_unavailable()

from engine_manager import manager_in_short_dir  # noqa: E402
from hint_cases import MALFORMED_HINTS  # noqa: E402
from sglang_harness import PAGE, Engine, prompt  # noqa: E402

pytestmark = pytest.mark.sglang

PAGES = 5
KEPT = prompt(41, PAGES)
PLAIN = prompt(42, PAGES)


def hint(h: object) -> dict[str, Any]:
    return {"custom_params": {"orbitkv_retention": h}}


def test_a_kept_conversation_outlives_a_flood_that_evicts_an_unhinted_prompt(tmp_path: Path) -> None:
    with manager_in_short_dir(tmp_path / "m", "okv-sh", dram_size="1MiB", extra_args=("--cache-policy", "lru")) as m:
        sock = str(m.socket_path)
        a = Engine(sock)
        first = a.serve(KEPT, **hint({"keep_for_s": 600}))
        assert first.mismatched_bytes == 0
        assert a.serve(PLAIN).mismatched_bytes == 0
        a.step()
        st = a.linker.stats
        assert (st["hints_sent"], st["hint_blocks"], st["hints_rejected"], st["hint_errors"]) == (1, PAGES, 0, 0)
        assert st["offloaded_blocks"] == 2 * PAGES
        block_bytes = a.linker.geometry.block_bytes
        fingerprint = a.linker.fingerprint
        a.close()
        ms = m.settled_stats(live_leases=0, live_saves=0)
        assert ms["hint_requests_total"] == 1
        assert ms["hint_kept_blocks"] == PAGES and ms["hint_refused_blocks_total"] == 0

        # Another client floods the engine's own namespace with twice the arena in new
        # prefixes (a keep competes with everything else the model caches).
        n = 2 * (1 << 20) // block_bytes
        with m.client() as cl:
            ns = cl.register_namespace(fingerprint, block_bytes)
            for i in range(0, n, 8):
                chain = [bytes([i // 8 % 256, i // 2048, j, 0xF1]) + bytes(28) for j in range(8)]
                cl.save(ns, chain, os.urandom(8 * block_bytes))
        assert m.stats()["evictions_total"] >= n // 2, "the flood evicted"

        b = Engine(sock)  # a fresh tree and pool: only OrbitKV can serve it
        got = b.serve(KEPT)
        assert (got.device_hit, got.external_hit, got.computed) == (0, PAGES * PAGE, 1)
        assert got.mismatched_bytes == 0
        plain = b.serve(PLAIN)
        assert (plain.external_hit, plain.computed) == (0, PAGES * PAGE + 1), "the unhinted prompt was evicted"
        assert plain.mismatched_bytes == 0
        b.step()
        assert b.linker.stats["hints_sent"] == 0  # no hint given, none sent
        b.close()


def test_done_marks_the_conversation_to_leave_first(orbit_manager: Any) -> None:
    e = Engine(str(orbit_manager.socket_path))
    assert e.serve(KEPT, **hint({"done": True})).mismatched_bytes == 0
    e.step()
    assert e.linker.stats["hints_sent"] == 1
    e.close()
    st = orbit_manager.settled_stats(live_leases=0, live_saves=0)
    assert st["hint_done_blocks"] == PAGES and st["hint_kept_blocks"] == 0


@pytest.mark.parametrize(("bad", "reason"), MALFORMED_HINTS)
def test_a_malformed_hint_is_refused_with_its_reason_and_the_request_runs(
    orbit_manager: Any, caplog: pytest.LogCaptureFixture, bad: object, reason: str
) -> None:
    e = Engine(str(orbit_manager.socket_path))
    with caplog.at_level(logging.ERROR, logger="orbitkv.sglang"):
        served = e.serve(KEPT, **hint(bad))
    assert served.mismatched_bytes == 0
    e.step()
    st = e.linker.stats
    assert (st["hints_rejected"], st["hints_sent"]) == (1, 0)
    assert any(reason in r.getMessage() and "orbitkv_retention" in r.getMessage() for r in caplog.records)
    assert st["offloaded_blocks"] == PAGES, "the request was cached as without a hint"
    e.close()
    assert orbit_manager.settled_stats(live_leases=0, live_saves=0)["hint_requests_total"] == 0
