"""Tensor parallelism on one host for the vLLM adapter (contracts T1-T3, K1).

Each TP rank's worker saves its own KV shard under the namespace of (fingerprint,
shard = its TP rank, salt); the fingerprint itself binds the TP size but no rank, so
the scheduler can name every shard. Per request the scheduler makes ONE Manager call,
`lookup_tp`, over the namespaces of shards 0..tp_size-1: the Manager returns the prefix
present in every shard (the common prefix) and pins it in each under one TP lease whose
token travels to the workers in the `LoadSpec`. Each worker redeems its own shard's
part with the token (`redeem_tp`: no second lookup), copies it and releases it (its
"done" report); the TP lease ends when every rank reported done, or when the scheduler
releases it (after vLLM aggregated `finished_recving` from every rank, on an unselected
hit, preemption or finish), or with the scheduler's session, or by the Manager's
deadline (`--tp-lease-ttl-ms`) for parts no rank redeemed.

Opt-in (T1): `orbitkv.query_control = true` in the connector settings and
`--enable-query-control` on the Manager. PP > 1, DCP/PCP > 1 and TP spanning hosts
are rejected, naming the setting. No vLLM import here at module level.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from orbitkv.vllm.config import OrbitKVSettings

if TYPE_CHECKING:
    from vllm.config import ParallelConfig


def parallel_rejection(par: ParallelConfig, settings: OrbitKVSettings) -> str | None:
    """Why this parallel layout cannot be served (None: it can)."""
    others = {
        "pipeline_parallel_size": par.pipeline_parallel_size,
        "decode_context_parallel_size": par.decode_context_parallel_size,
        "prefill_context_parallel_size": par.prefill_context_parallel_size,
    }
    multi = {k: v for k, v in others.items() if v != 1}
    if multi:
        return (
            "OrbitKVConnector serves tensor parallelism only: "
            + ", ".join(f"{k}={v}" for k, v in multi.items())
            + " is not supported (each pipeline/context-parallel rank would hold a different "
            "part of a block's KV; only equal TP-only shards are qualified, contract T2)"
        )
    tp = par.tensor_parallel_size
    if tp == 1:
        return None
    nnodes = int(getattr(par, "nnodes", 1) or 1)
    if nnodes > 1:
        return (
            f"OrbitKVConnector serves tensor_parallel_size={tp} on one host only; nnodes={nnodes} "
            "(--nnodes) spreads the engine over several hosts, and multi-host TP query control "
            "is not delivered"
        )
    if not settings.query_control:
        return (
            f"tensor_parallel_size={tp} needs Manager query control (contract T1): set "
            "orbitkv.query_control=true in kv_connector_extra_config and start the Manager with "
            "--enable-query-control"
        )
    return None


def worker_tp_rank(par: ParallelConfig) -> int:
    """This worker's TP rank (its shard): vLLM's TP group, initialised before the
    worker builds its connector. TP = 1 has one shard, 0."""
    if par.tensor_parallel_size == 1:
        return 0
    from vllm.distributed.parallel_state import get_tensor_model_parallel_rank, model_parallel_is_initialized

    if not model_parallel_is_initialized():
        raise RuntimeError(
            f"orbitkv: tensor_parallel_size={par.tensor_parallel_size} but vLLM's TP group is not "
            "initialised in this worker: its shard (TP rank) is unknown"
        )
    rank = int(get_tensor_model_parallel_rank())
    if not 0 <= rank < par.tensor_parallel_size:
        raise RuntimeError(f"orbitkv: TP rank {rank} outside tensor_parallel_size={par.tensor_parallel_size}")
    return rank


def token_of(lease: Any) -> bytes | None:
    """The token a TP lease hands to the workers (None for a plain lease)."""
    token = getattr(lease, "token", None)
    return bytes(token) if token is not None else None
