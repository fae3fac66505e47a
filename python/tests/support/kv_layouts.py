"""vLLM 0.31.0's six KV cache layouts, rebuilt without importing vLLM (for the copy-engine
tests, which also run where vLLM cannot be installed, e.g. the GPU machine).

Mirrors vllm/v1/kv_cache_layout.py (`KVCacheLayout`: a stride permutation over the logical
[L, B, H, N, C] axes) and vllm/v1/kv_cache_interface.py (`compute_layout_strides`,
`create_kv_cache_views`): one int8 backing allocation, viewed per layer as a strided
`[B, H, N, C]` tensor of the KV dtype at byte offset `l * layer_stride`.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

# layout name -> physical order of the logical axes (L=0, B=1, H=2, N=3, C=4), outermost first
LAYOUTS: dict[str, tuple[int, ...]] = {
    "LBHNC": (0, 1, 2, 3, 4),
    "LBNHC": (0, 1, 3, 2, 4),
    "LHBNC": (0, 2, 1, 3, 4),
    "BLHNC": (1, 0, 2, 3, 4),
    "BLNHC": (1, 0, 3, 2, 4),
    "BHLNC": (1, 2, 0, 3, 4),
}


@dataclass(frozen=True)
class Shape:
    layers: int
    blocks: int
    heads: int
    tokens: int  # tokens per manager block
    content: int  # elements of `dtype` per token and head
    dtype: torch.dtype = torch.bfloat16
    ratio: int = 1  # kernel blocks per manager block (splits the tokens)
    pad: int = 64  # bytes of sentinel before and after the KV bytes


def byte_strides(layout: str, s: Shape) -> tuple[int, ...]:
    """Byte strides in logical [L, B, H, N, C] order (vLLM's compute_layout_strides)."""
    item = torch.empty(0, dtype=s.dtype).element_size()
    sizes = (s.layers, s.blocks, s.heads, s.tokens, s.content * item)
    strides = [0] * 5
    current = 1
    for dim in reversed(LAYOUTS[layout]):
        strides[dim] = current
        current *= sizes[dim]
    return tuple(strides)


def total_bytes(s: Shape) -> int:
    item = torch.empty(0, dtype=s.dtype).element_size()
    return s.layers * s.blocks * s.heads * s.tokens * s.content * item + 2 * s.pad


def views(raw: torch.Tensor, layout: str, s: Shape) -> dict[str, torch.Tensor]:
    """vLLM-style per-layer [B*ratio, H, N/ratio, C] views over `raw` (int8 or uint8, 1-D)."""
    item = torch.empty(0, dtype=s.dtype).element_size()
    s_l, s_b, s_h, s_n, _ = byte_strides(layout, s)
    if s.ratio > 1 and s_n * s.tokens != s_b:
        raise ValueError(f"{layout}: a kernel block split needs the tokens of a block to be one run")
    typed = raw.view(torch.int8).view(s.dtype)
    out = {}
    for layer in range(s.layers):
        out[f"model.layers.{layer}.self_attn.attn"] = typed.as_strided(
            (s.blocks * s.ratio, s.heads, s.tokens // s.ratio, s.content),
            (s_b // s.ratio // item, s_h // item, s_n // item, 1),
            (s.pad + layer * s_l) // item,
        )
    return out


def random_backing(s: Shape, seed: int, device: torch.device | str = "cpu") -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    return torch.randint(0, 256, (total_bytes(s),), dtype=torch.uint8, generator=g).to(device)


def page_bytes_of(kv: dict[str, torch.Tensor], s: Shape, block: int) -> bytes:
    """One manager block's bytes, layer by layer in logical order, read through the views."""
    out = b""
    for view in kv.values():
        part = view[block * s.ratio : (block + 1) * s.ratio].contiguous().view(torch.uint8)
        out += part.cpu().numpy().tobytes()
    return out
