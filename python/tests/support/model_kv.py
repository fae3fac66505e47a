"""Model-computed KV through a real Manager (gate G4), one role per process.

A Llama-architecture model is built with `transformers` from a local config with
seeded random weights (no download). Three fresh processes, in order:

  save       (A) prefill the prompt, copy its KV from the HF cache into vLLM-style
             paged KV (per layer `[2, num_blocks, block_size, kv_heads, head_dim]`,
             the NHD layout, one backing allocation) at random block ids, save the
             prompt's blocks through `orbitkv.kvcopy.CopyEngine.save` into slots of
             `begin_save`, synchronise, `commit_save`, exit.
  restore    (B) look the same hashes up, `acquire`, `CopyEngine.load` into fresh
             pages (filled with a sentinel) at other random block ids, make the
             compute stream wait per layer, rebuild a `DynamicCache` from the pages
             and continue greedy decoding from the token A sampled after the prompt
             (as a resumed request would: the scheduler knows its output so far).
  recompute  (C) the reference: prefill the same prompt, sample the same way and
             decode.

Each role writes `<role>.pt` (CPU tensors) into the work dir; `check_g4` runs the
three and asserts: the restored pages equal A's byte for byte and every other
page still holds the sentinel; A's and C's prefill agree; B's greedy tokens and the
logits of every decode step are bit-identical (`torch.equal`) to C's.

`--device cuda`: bf16, 4 layers, hidden 512, 8 heads, 2 KV heads, vocab 32000,
a 512-token prompt, 32 decode steps. `--device cpu`: a float32 model small enough
for CI (checks the plumbing; CPU pages go through the same CopyEngine interface).

This module imports only the standard library at import time; roles import torch.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

BLOCK_SIZE = 16
SEED = 1234


@dataclass(frozen=True)
class Shape:
    layers: int
    hidden: int
    heads: int
    kv_heads: int
    intermediate: int
    vocab: int
    prompt: int
    decode: int
    dtype: str


SHAPES = {
    "cuda": Shape(
        layers=4,
        hidden=512,
        heads=8,
        kv_heads=2,
        intermediate=1024,
        vocab=32000,
        prompt=512,
        decode=32,
        dtype="bfloat16",
    ),
    "cpu": Shape(
        layers=2, hidden=128, heads=4, kv_heads=2, intermediate=256, vocab=1000, prompt=64, decode=8, dtype="float32"
    ),
}


def _deterministic(device: str) -> None:
    import torch

    torch.manual_seed(SEED)
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    torch.backends.cudnn.benchmark = False
    torch.backends.cudnn.deterministic = True
    # warn_only: an op without a deterministic kernel warns instead of failing; every
    # op on this path runs the same shapes in A, B and C, which is what equality needs.
    torch.use_deterministic_algorithms(True, warn_only=True)
    if device == "cpu":
        torch.set_num_threads(1)


def _model(shape: Shape, device: str) -> Any:
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    cfg = LlamaConfig(
        hidden_size=shape.hidden,
        intermediate_size=shape.intermediate,
        num_hidden_layers=shape.layers,
        num_attention_heads=shape.heads,
        num_key_value_heads=shape.kv_heads,
        vocab_size=shape.vocab,
        max_position_embeddings=4096,
        attn_implementation="sdpa",
    )
    torch.manual_seed(SEED)
    model = LlamaForCausalLM(cfg)  # seeded init on the CPU: the same weights in every process
    return model.to(dtype=getattr(torch, shape.dtype), device=device).eval()


def _prompt(shape: Shape) -> list[int]:
    import torch

    g = torch.Generator().manual_seed(SEED + 1)
    return [int(t) for t in torch.randint(0, shape.vocab, (shape.prompt,), generator=g)]


def _hashes(prompt: list[int], shape: Shape) -> tuple[bytes, list[bytes]]:
    from orbitkv import hashing

    fp = hashing.fingerprint(test="g4-model-kv", shape=shape.__dict__, block_size=BLOCK_SIZE)
    return fp, hashing.chain_hashes(prompt, BLOCK_SIZE, hashing.chain_root(fp))


def layer_kv(cache: Any, i: int) -> tuple[Any, Any]:
    """(keys, values) of layer i, `[batch, kv_heads, tokens, head_dim]`, across the
    transformers cache APIs (`layers[i].keys` in 4.56+/5.x, `key_cache[i]` before)."""
    layers = getattr(cache, "layers", None)
    if layers is not None:
        return layers[i].keys, layers[i].values
    return cache.key_cache[i], cache.value_cache[i]


class PagedKV:
    """vLLM-style paged KV (the FlashAttention layout): one uint8 backing allocation, per
    layer a `[2, num_blocks, block_size, kv_heads, head_dim]` view (K then V). Also used
    by `benches/qualify_gpu.py`."""

    def __init__(self, layers: int, num_blocks: int, kv_heads: int, head_dim: int, dtype: Any, device: Any) -> None:
        import torch

        self.dtype = dtype
        self.layers, self.num_blocks = layers, num_blocks
        self.kv_heads, self.head_dim = kv_heads, head_dim
        item = torch.empty((), dtype=self.dtype).element_size()
        self.row = self.head_dim * item  # bytes of one head's vector
        self.half = BLOCK_SIZE * self.kv_heads * self.row  # one block's K (or V) page
        self.layer_bytes = 2 * num_blocks * self.half
        self.backing = torch.empty(layers * self.layer_bytes, dtype=torch.uint8, device=device)
        self.kv = [
            self.backing[i * self.layer_bytes : (i + 1) * self.layer_bytes]
            .view(self.dtype)
            .view(2, num_blocks, BLOCK_SIZE, self.kv_heads, self.head_dim)
            for i in range(layers)
        ]

    @classmethod
    def of(cls, shape: Shape, num_blocks: int, device: str) -> PagedKV:
        import torch

        dtype = getattr(torch, shape.dtype)
        return cls(shape.layers, num_blocks, shape.kv_heads, shape.hidden // shape.heads, dtype, device)

    def layer_pages(self) -> list[Any]:
        from orbitkv.kvcopy import LayerPages

        return [
            LayerPages(
                backing=self.backing,
                base=i * self.layer_bytes,
                block_stride=self.half,
                shape=(2, BLOCK_SIZE, self.kv_heads, self.row),
                strides=(self.num_blocks * self.half, self.kv_heads * self.row, self.row, 1),
                page_bytes=2 * self.half,
                num_blocks=self.num_blocks,
            )
            for i in range(self.layers)
        ]

    def write(self, cache: Any, block_ids: Any) -> None:
        """Copy the first len(block_ids) full blocks of the HF cache into the pages."""
        n = len(block_ids) * BLOCK_SIZE
        for i in range(self.layers):
            for j, t in enumerate(layer_kv(cache, i)):
                blocks = t[0, :, :n].transpose(0, 1).reshape(len(block_ids), BLOCK_SIZE, self.kv_heads, self.head_dim)
                self.kv[i][j].index_copy_(0, block_ids, blocks)

    def to_cache(self, block_ids: Any) -> Any:
        """A fresh DynamicCache holding the pages of block_ids, in order."""
        from transformers import DynamicCache

        cache = DynamicCache()
        n = len(block_ids) * BLOCK_SIZE
        for i in range(self.layers):
            k, v = (
                self.kv[i][j]
                .index_select(0, block_ids)
                .reshape(n, self.kv_heads, self.head_dim)
                .transpose(0, 1)
                .unsqueeze(0)
                .contiguous()
                for j in (0, 1)
            )
            cache.update(k, v, i)
        return cache

    def block_bytes(self, block_ids: Any) -> Any:
        """`[layers, blocks, 2 * half]` uint8 on the CPU: each block's K and V pages."""
        import torch

        out = [
            self.kv[i][:, block_ids].transpose(0, 1).contiguous().view(torch.uint8).reshape(len(block_ids), -1)
            for i in range(self.layers)
        ]
        return torch.stack(out).cpu()


def _decode(model: Any, cache: Any, first: int, steps: int, device: str) -> tuple[list[int], Any]:
    import torch

    tok, tokens, logits = first, [], []
    with torch.no_grad():
        for _ in range(steps):
            out = model(input_ids=torch.tensor([[tok]], device=device), past_key_values=cache, use_cache=True)
            cache = out.past_key_values
            step = out.logits[0, -1]
            logits.append(step.cpu())
            tok = int(torch.argmax(step))
            tokens.append(tok)
    return tokens, torch.stack(logits)


def _prefill(model: Any, prompt: list[int], device: str) -> tuple[Any, Any, int]:
    import torch

    with torch.no_grad():
        out = model(input_ids=torch.tensor([prompt], device=device), use_cache=True)
    last = out.logits[0, -1]
    return out.past_key_values, last.cpu(), int(torch.argmax(last))


def _block_ids(n: int, num_blocks: int, seed: int, device: str) -> Any:
    import torch

    g = torch.Generator().manual_seed(seed)
    return torch.randperm(num_blocks, generator=g)[:n].to(device)


def role_save(a: argparse.Namespace, shape: Shape) -> None:
    import torch

    from orbitkv import _native
    from orbitkv.kvcopy import ArenaView, CopyEngine

    model = _model(shape, a.device)
    prompt = _prompt(shape)
    fp, hashes = _hashes(prompt, shape)
    cache, last, first = _prefill(model, prompt, a.device)
    pages = PagedKV.of(shape, 3 * len(hashes), a.device)
    pages.backing.fill_(0xA5)
    ids = _block_ids(len(hashes), pages.num_blocks, SEED + 2, a.device)
    pages.write(cache, ids)
    client = _native.Client(a.socket)
    arena = ArenaView(client, a.device)
    engine = CopyEngine(pages.layer_pages(), arena)
    ns = client.register_namespace(fp, engine.block_bytes)
    pending = client.begin_save(ns, hashes)
    if pending.statuses != ["allocated"] * len(hashes):
        raise SystemExit(f"begin_save did not allocate every block: {pending.statuses}")
    slots = [s for s in pending.slots if s is not None]
    engine.save([int(b) for b in ids], slots).synchronize()
    committed = client.commit_save(pending)
    engine.drain()
    arena.close()
    client.close()
    torch.save(
        {
            "first": first,
            "prefill_logits": last,
            "blocks": pages.block_bytes(ids),
            "committed": committed,
            "block_ids": ids.cpu(),
        },
        Path(a.workdir) / "save.pt",
    )


def role_restore(a: argparse.Namespace, shape: Shape) -> None:
    import torch

    from orbitkv import _native
    from orbitkv.kvcopy import ArenaView, CopyEngine

    saved = torch.load(Path(a.workdir) / "save.pt")
    model = _model(shape, a.device)
    prompt = _prompt(shape)
    fp, hashes = _hashes(prompt, shape)
    pages = PagedKV.of(shape, 4 * len(hashes), a.device)
    pages.backing.fill_(0x5A)  # sentinel: every page the restore must not touch keeps it
    ids = _block_ids(len(hashes), pages.num_blocks, SEED + 3, a.device)
    client = _native.Client(a.socket)
    arena = ArenaView(client, a.device)
    engine = CopyEngine(pages.layer_pages(), arena)
    ns = client.register_namespace(fp, engine.block_bytes)
    lease = client.lookup(ns, hashes)
    if lease.hit_blocks != len(hashes):
        raise SystemExit(f"lookup hit {lease.hit_blocks} of {len(hashes)} blocks saved by the previous process")
    slots = client.acquire(lease)
    handle = engine.load(slots, [int(b) for b in ids])
    for i in range(engine.num_layers):
        handle.wait_layer(i)  # the current stream waits; no host synchronisation
    restored = pages.block_bytes(ids)  # reads on the current stream, ordered after the copies
    cache = pages.to_cache(ids)
    handle.synchronize()
    client.release(lease)
    others = torch.ones(pages.num_blocks, dtype=torch.bool)
    others[ids.cpu()] = False
    rest = torch.stack([kv[:, others.to(kv.device)].contiguous().view(torch.uint8) for kv in pages.kv])
    sentinel_ok = bool(torch.all(rest == 0x5A))
    tokens, logits = _decode(model, cache, saved["first"], shape.decode, a.device)
    engine.drain()
    arena.close()
    client.close()
    torch.save(
        {"blocks": restored, "sentinel_ok": sentinel_ok, "tokens": tokens, "logits": logits},
        Path(a.workdir) / "restore.pt",
    )


def role_recompute(a: argparse.Namespace, shape: Shape) -> None:
    import torch

    model = _model(shape, a.device)
    prompt = _prompt(shape)
    cache, last, first = _prefill(model, prompt, a.device)
    tokens, logits = _decode(model, cache, first, shape.decode, a.device)
    torch.save(
        {"first": first, "prefill_logits": last, "tokens": tokens, "logits": logits}, Path(a.workdir) / "recompute.pt"
    )


ROLES = {"save": role_save, "restore": role_restore, "recompute": role_recompute}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("role", choices=sorted(ROLES))
    ap.add_argument("--device", choices=sorted(SHAPES), required=True)
    ap.add_argument("--socket", default="")
    ap.add_argument("--workdir", required=True)
    a = ap.parse_args(argv)
    os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")  # before CUDA starts: deterministic cuBLAS
    _deterministic(a.device)
    ROLES[a.role](a, SHAPES[a.device])
    return 0


def run_role(role: str, device: str, socket: str, workdir: Path, timeout: float = 900.0) -> None:
    env = dict(os.environ, CUBLAS_WORKSPACE_CONFIG=":4096:8", PYTHONHASHSEED="0")
    cmd = [sys.executable, __file__, role, "--device", device, "--socket", socket, "--workdir", str(workdir)]
    p = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=timeout)
    if p.returncode != 0:
        raise AssertionError(f"role {role!r} exited with {p.returncode}\nstdout:\n{p.stdout}\nstderr:\n{p.stderr}")


def check_g4(socket: str, workdir: Path, device: str) -> dict[str, Any]:
    """Run A, B and C in fresh processes against the Manager at `socket` and assert G4."""
    import torch

    for role in ("save", "restore", "recompute"):
        run_role(role, device, socket, workdir)
    a, b, c = (torch.load(workdir / f"{r}.pt") for r in ("save", "restore", "recompute"))
    shape = SHAPES[device]
    n_blocks = shape.prompt // BLOCK_SIZE
    assert a["committed"] == n_blocks, f"process A committed {a['committed']} of {n_blocks} blocks"
    assert a["blocks"].shape[:2] == (shape.layers, n_blocks)
    assert torch.equal(b["blocks"], a["blocks"]), "restored KV pages differ from the pages process A saved"
    assert b["sentinel_ok"], "the restore wrote outside its destination pages"
    assert a["first"] == c["first"] and torch.equal(a["prefill_logits"], c["prefill_logits"]), (
        "two prefills of the same prompt disagree: the model is not deterministic here, so G4 cannot be judged"
    )
    assert len(b["tokens"]) == len(c["tokens"]) == shape.decode
    for step in range(shape.decode):
        lb, lc = b["logits"][step], c["logits"][step]
        if not torch.equal(lb, lc):
            diff = (lb.float() - lc.float()).abs().max().item()
            raise AssertionError(
                f"decode step {step}: logits after the restore differ from recomputation (max |diff| {diff}); "
                f"tokens restored {b['tokens'][: step + 1]} vs recomputed {c['tokens'][: step + 1]}"
            )
    assert b["tokens"] == c["tokens"]
    return {"tokens": b["tokens"], "blocks": n_blocks, "block_bytes": int(a["blocks"][0, 0].numel()) * shape.layers}


if __name__ == "__main__":
    raise SystemExit(main())
