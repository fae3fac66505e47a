"""A cache failure is never a request failure (contract L7): vLLM's load-failure policy.

vLLM 0.31.0 reports a failed KV load (`failed_recving`, `invalid_block_ids`) to its
scheduler, which applies `KVTransferConfig.kv_load_failure_policy`: `"fail"` (the
default) finishes the request with `FinishReason.ERROR`, `"recompute"` recomputes the
blocks that could not be loaded. The Scheduler reads the policy once, in its
constructor, right *after* it constructed the scheduler-role connector
(`Scheduler.__init__`: `create_connector(...)`, then
`self.recompute_kv_load_failures = kv_transfer_config.kv_load_failure_policy ==
"recompute"`).

OrbitKV is a best-effort cache: every block it fails to deliver (a Manager that
crashed, restarted or timed out between the lookup and the copy) can be recomputed by
the engine, and nothing is ever lost by recomputing it. So when OrbitKV loads
(`orbitkv.mode = read_write`) as the engine's own connector, it sets the policy to
`"recompute"` in its constructor, with one log line naming the setting. The scheduler
then reads `"recompute"`.

Inside a MultiConnector vLLM hands each child a fresh `KVTransferConfig` built from the
child's own JSON, so a child cannot change (nor see) the policy the Scheduler reads;
there the MultiConnector's own `kv_load_failure_policy` applies, and docs/adapters.md
says to set it to `"recompute"` when OrbitKV loads (in `save_only` mode it never loads).
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING

from orbitkv.vllm.config import OrbitKVSettings

if TYPE_CHECKING:
    from vllm.config import VllmConfig

logger = logging.getLogger("orbitkv.vllm")

RECOMPUTE = "recompute"


def ensure_recompute_policy(vllm_config: VllmConfig, settings: OrbitKVSettings, *, log: bool) -> str:
    """Make vLLM recompute blocks OrbitKV fails to load. Returns the policy in effect for
    this connector's config ("recompute" after the call whenever OrbitKV loads)."""
    ktc = vllm_config.kv_transfer_config
    if ktc is None:
        return RECOMPUTE
    policy = str(ktc.kv_load_failure_policy)
    if not settings.loads or policy == RECOMPUTE:
        return policy
    ktc.kv_load_failure_policy = RECOMPUTE
    if log:
        logger.warning(
            "orbitkv: kv_load_failure_policy set to 'recompute' (was %r): OrbitKV is a best-effort "
            "cache, so a load it cannot complete (a Manager that died, restarted or timed out) must "
            "cost a recompute, never the request. Inside a MultiConnector set "
            '"kv_load_failure_policy": "recompute" on the MultiConnector itself.',
            policy,
        )
    return RECOMPUTE
