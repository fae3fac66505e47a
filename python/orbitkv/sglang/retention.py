"""Retention hints from SGLang requests (both releases).

An application passes the hint in the request's custom parameters:

    sampling_params={"custom_params": {"orbitkv_retention": {"keep_for_s": 120}}}
    sampling_params={"custom_params": {"orbitkv_retention": {"done": True}}}

(validated by `orbitkv.engine.hints.parse_hint`, the same rules as the vLLM adapter's
`kv_transfer_params`). When the request finishes and its pages are in the tree — 0.5.21:
`insert_req`; 0.5.23: the final `checkpoint` — the linker sends the hint for the page
chain the tree holds for it: SGLang's own page hashes from the root to the node the insert
ended on, the keys under which OrbitKV stored those pages (written through at insert, so
pages whose save has not committed yet take the hint when it does). A malformed hint is
logged, counted (`hints_rejected`) and ignored: the request runs and is cached as without
one. A request that OrbitKV does not cache (caller `extra_key`, `skip_radix_cache_insert`)
sends none.
"""

from __future__ import annotations

from typing import Any

from orbitkv.engine.hints import HintError, RetentionHint, parse_hint
from orbitkv.sglang._shared import LinkerCore, caller_extra_key, logger


def request_hint(linker: LinkerCore, req: Any) -> RetentionHint | None:
    """The finished request's retention hint, or None (none given, malformed, or a
    request OrbitKV does not cache)."""
    if getattr(req, "skip_radix_cache_insert", False) or caller_extra_key(req):
        return None
    params = getattr(getattr(req, "sampling_params", None), "custom_params", None)
    if not isinstance(params, dict):
        return None
    try:
        return parse_hint(params)
    except HintError as exc:
        linker.stats["hints_rejected"] += 1
        logger.error("orbitkv: request %s: %s; it runs without a retention hint", getattr(req, "rid", "?"), exc)
        return None


def page_chain(cache: Any, node: Any) -> list[str]:
    """SGLang's page hashes from the root to `node` (inclusive), prefix first."""
    if node is None or cache.is_root(node):
        return []
    return list(cache.get_prefix_hash_values(node)) + list(cache.tree_core.get_hash_values(node))


def send_hint(linker: LinkerCore, cache: Any, req: Any, hint: RetentionHint, node: Any) -> None:
    """Send `hint` for the chain ending at `node` (never raises: a failure is logged and
    counted, the request's outcome does not depend on it)."""
    try:
        chain = page_chain(cache, node)
    except Exception as exc:  # a node evicted meanwhile: nothing to hint
        logger.debug("orbitkv: no page chain for request %s (%s)", getattr(req, "rid", "?"), exc)
        return
    if chain:
        linker.retain(getattr(req, "rid", "?"), chain, hint)
