"""Profile guards and the namespace identity document for vLLM 0.31.0 and 0.33.0 (V3).

`check_profile` runs in both roles' constructors, before any Manager connection, and
raises `UnsupportedProfileError` naming the setting to change. `identity_document`
collects everything the namespace fingerprint binds (contract K1). Only vLLM config
objects are read; nothing here connects anywhere.
"""

from __future__ import annotations

import dataclasses
from typing import TYPE_CHECKING, Any

import vllm
from vllm.v1.kv_cache_interface import (
    AttentionSpec,
    KVCacheConfig,
    KVCacheSpecKind,
    get_kv_cache_spec_kind,
)

import orbitkv.vllm.compat as compat
from orbitkv.engine.identity import model_config_digest, static_lora_identity
from orbitkv.vllm.block_hashes import BlockHashError, block_hash_identity, check_hash_algo
from orbitkv.vllm.config import OrbitKVSettings
from orbitkv.vllm.errors import UnsupportedProfileError
from orbitkv.vllm.tp import parallel_rejection

# The schema tag of the vLLM adapter's identity document (SGLang's has its own).
SCHEMA = "orbitkv.vllm.namespace/1"

if TYPE_CHECKING:
    from vllm.config import VllmConfig

_ACCEPTED_KINDS = (KVCacheSpecKind.FULL_ATTENTION, KVCacheSpecKind.MLA_ATTENTION)

__all__ = ["UnsupportedProfileError", "check_profile", "identity_document"]


def check_profile(vllm_config: VllmConfig, kv_cache_config: KVCacheConfig, settings: OrbitKVSettings) -> AttentionSpec:
    """Reject configurations OrbitKV cannot serve correctly. Returns the group spec."""
    release = compat.current()  # an unknown vLLM version is rejected here, naming the pins
    release.check_profile(vllm_config)  # the runner, sleep mode, the KV cache's allocation
    groups = kv_cache_config.kv_cache_groups
    if len(groups) != 1:
        kinds = ", ".join(get_kv_cache_spec_kind(g.kv_cache_spec).value for g in groups)
        raise UnsupportedProfileError(
            f"OrbitKVConnector needs exactly one attention KV-cache group, the model has "
            f"{len(groups)} ({kinds}); hybrid/recurrent models are not supported "
            "(keep --disable-hybrid-kv-cache-manager on, or use a full-attention model)"
        )
    spec = groups[0].kv_cache_spec
    kind = get_kv_cache_spec_kind(spec)
    if kind not in _ACCEPTED_KINDS or not isinstance(spec, AttentionSpec):
        raise UnsupportedProfileError(
            f"OrbitKVConnector supports full-attention KV-cache groups only; the group is "
            f"{kind.value} ({type(spec).__name__})"
        )
    try:
        check_hash_algo(vllm_config.cache_config.prefix_caching_hash_algo)
    except BlockHashError as exc:
        raise UnsupportedProfileError(str(exc)) from None
    if vllm_config.speculative_config is not None:
        raise UnsupportedProfileError(
            "OrbitKVConnector rejects speculative decoding (--speculative-config): draft "
            "steps defer connector finalization (wait_for_save after the draft forward) "
            "and add unverified tokens; this ordering is not qualified"
        )
    rejection = parallel_rejection(vllm_config.parallel_config, settings)
    if rejection is not None:
        raise UnsupportedProfileError(rejection)
    if settings.static_lora_adapters and vllm_config.lora_config is None:
        raise UnsupportedProfileError("orbitkv.static_lora_adapters is set but LoRA is not enabled (--enable-lora)")
    return spec


def resolved_layout(vllm_config: VllmConfig, kv_cache_config: KVCacheConfig) -> str:
    layout = vllm_config.cache_config.kv_cache_layout or kv_cache_config.kv_cache_layout
    if layout is None:
        raise UnsupportedProfileError(
            "the KV cache layout is not resolved (CacheConfig.kv_cache_layout and "
            "KVCacheConfig.kv_cache_layout are both None); vLLM resolves it before "
            "constructing connectors"
        )
    return layout


def num_kv_layers(kv_cache_config: KVCacheConfig) -> int:
    """Layers that own KV pages (KV-sharing layers alias another layer's pages)."""
    if kv_cache_config.kv_cache_tensors:
        return sum(len(t.layers) for t in kv_cache_config.kv_cache_tensors)
    return len(kv_cache_config.kv_cache_groups[0].layer_names)


def block_bytes(kv_cache_config: KVCacheConfig, spec: AttentionSpec) -> int:
    """Bytes of one cached block: the unpadded page of every KV layer."""
    return spec.unpadded_page_size_bytes * num_kv_layers(kv_cache_config)


def _lora_settings(vllm_config: VllmConfig) -> dict[str, Any] | None:
    lora = vllm_config.lora_config
    if lora is None:
        return None
    fields = (
        "max_lora_rank",
        "max_loras",
        "fully_sharded_loras",
        "lora_dtype",
        "target_modules",
        "enable_mixed_moe_lora_format",
        "enable_moe_shared_loras",
    )
    return {f: str(getattr(lora, f, None)) for f in fields}


def identity_document(
    vllm_config: VllmConfig,
    kv_cache_config: KVCacheConfig,
    spec: AttentionSpec,
    settings: OrbitKVSettings,
) -> dict[str, Any]:
    """Everything the namespace fingerprint binds (see docs/adapters.md). The TP rank
    is not here: it is the namespace's shard (K1), so one fingerprint names every rank's
    shard and the scheduler can look all of them up at once (T1)."""
    model = vllm_config.model_config
    cache = vllm_config.cache_config
    par = vllm_config.parallel_config
    backend = vllm_config.attention_config.backend
    spec_fields = {
        f.name: str(getattr(spec, f.name))
        for f in dataclasses.fields(spec)
        if f.name not in ("block_stride_alignment",)
    }
    return {
        "schema": SCHEMA,
        "engine": {"name": "vllm", "version": vllm.__version__},
        "model": {
            "identity": settings.model_identity or model.model,
            "revision": model.revision if settings.model_identity is None else None,
            "config_sha256": model_config_digest(model.model) if settings.model_identity is None else None,
            "quantization": str(model.quantization),
            "hf_overrides": repr(model.hf_overrides) if model.hf_overrides else None,
        },
        "dtype": str(model.dtype),
        "kv_cache_dtype": str(cache.cache_dtype),
        "kv_cache_layout": resolved_layout(vllm_config, kv_cache_config),
        "block_size": cache.block_size,
        "kv_spec": {"type": type(spec).__name__, **spec_fields},
        "num_kv_layers": num_kv_layers(kv_cache_config),
        "block_bytes": block_bytes(kv_cache_config, spec),
        "parallel": {
            "tp_size": par.tensor_parallel_size,
            "pp_size": par.pipeline_parallel_size,
            "dcp_size": par.decode_context_parallel_size,
        },
        "attention_backend": backend.name if backend is not None else "auto",
        "hash_algo": cache.prefix_caching_hash_algo,
        "block_hashes": block_hash_identity(vllm_config),
        "lora": static_lora_identity(settings.static_lora_adapters, _lora_settings(vllm_config)),
    }
