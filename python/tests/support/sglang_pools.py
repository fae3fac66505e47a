"""SGLang's released dense KV pools on CPU, as the SGLang suite and the copy-backend oracle
(`benches/sglang_kv_oracle.py`) build them: one place for the constructor arguments the
pinned releases take. Import it only where SGLang is installed."""

from __future__ import annotations

from typing import Any


def cpu_pool(
    kind: str,
    *,
    pages: int,
    page: int,
    layers: int,
    heads: int = 2,
    head_dim: int = 8,
    kv_lora_rank: int = 16,
    rope_dim: int = 8,
    cls: Any = None,
) -> Any:
    """A bfloat16 `MHATokenToKVPool` (`kind` "mha") or `MLATokenToKVPool` ("mla") of
    `pages` pages of `page` tokens on the CPU; `cls` replaces the pool class (a subclass)."""
    import torch
    from sglang.srt.mem_cache.memory_pool import MHATokenToKVPool, MLATokenToKVPool

    common: dict[str, Any] = dict(
        size=pages * page, page_size=page, dtype=torch.bfloat16, layer_num=layers, device="cpu",
        enable_memory_saver=False,
    )  # fmt: skip
    if kind == "mha":
        return (cls or MHATokenToKVPool)(head_num=heads, head_dim=head_dim, enable_alt_stream=False, **common)
    if kind == "mla":
        return (cls or MLATokenToKVPool)(kv_lora_rank=kv_lora_rank, qk_rope_head_dim=rope_dim, **common)
    raise ValueError(f"unknown pool kind {kind!r} (mha or mla)")


def pool_buffers(pool: Any, kind: str) -> list[Any]:
    """The pool's per-layer buffers in the order a cached block lays them out:
    MHA K then V of layer 0, K then V of layer 1, ...; MLA one latent buffer per layer."""
    if kind == "mha":
        return [b for i in range(len(pool.k_buffer)) for b in (pool.k_buffer[i], pool.v_buffer[i])]
    return list(pool.kv_buffer)
