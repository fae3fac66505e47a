#!/usr/bin/env python3
"""Time to first token in the released vLLM on a GPU host, every row in one run.

Rows, per prompt length (median of --reps distinct prompts; one generated token):
- `recompute`: vLLM alone, a prompt it never saw.
- `hbm_hit`: vLLM's own prefix-cache hit of the same prompt (same process).
- `orbitkv_dram`: OrbitKV hit in a fresh engine process: another process computed and
  saved the prompt; the blocks come from the Manager's DRAM.
- `orbitkv_ssd`: the same after the Manager restarted: the blocks come from its SSD tier.
- `offloading_cpu`: vLLM's own OffloadingConnector, same process, after the HBM prefix
  cache was emptied (`reset_prefix_cache`): its CPU copy is loaded.
- `floor`: `hbm_hit` + the hit's KV bytes / the pinned host-to-device copy rate measured
  in the same run (a 4 GiB `cudaMemcpy` from pinned memory, median of 5). With `--tp N`
  each rank restores its own 1/N of the bytes over its own link: the probe runs on the N
  GPUs at once, the floor takes the slowest rank (`dma.per_rank` in the JSON).

`--tp N` (2, 4, 8) runs every engine with `tensor_parallel_size=N` and every OrbitKV
role with query control (`--enable-query-control` on the Manager, `orbitkv.query_control`
in the connector): one Manager lookup per request, each rank redeeming its shard. Set
`NCCL_NVLS_ENABLE=0` (kept off on the lent machines).

Every row checks what it claims (`num_cached_tokens`, the Manager's hit counter, vLLM's
external-hit counter) and records it. The model is a Llama-3-8B shape (32 layers, 8 KV
heads of 128, bf16) with vLLM's dummy weights (`load_format="dummy"`: deterministic,
nothing to download). Needs a GPU, vLLM importable and the orbitkv wheel.

    python3 benches/engine_ttft.py --out ttft.json --png ttft.png [--lengths 2048,8192,32768] [--reps 3]
        [--mode eager|compile] [--tp N] [--step-cost] [--sections plain,offload,dram,ssd]
        [--orbitkv-variant 'inline={"orbitkv.async_lookups": false}' ...]

`--sections` runs part of the rows (a device session too short for all: the rows
measured are kept, the others are named missing, never filled in). Each
`--orbitkv-variant NAME=JSON` adds a fresh-process DRAM reader with those settings
(`orbitkv.*` keys for the connector, other keys for `LLM(...)`, e.g. `async_scheduling`;
row `orbitkv_dram_NAME_s`), to see what a setting costs or saves per hit.
`--step-cost` adds the scheduler-side cost: the same all-miss batch stepped in an engine
with and without OrbitKV (engine core in-process), per-step wall time and the time inside
the connector's scheduler hooks (after the DRAM rows on their Manager, or after the SSD
row on the restarted one when `ssd` is among the sections).
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "python" / "tests" / "gpu_engine"))

from gpu_suite import BLOCK, Manager, connector_config, run_driver  # noqa: E402

LAYERS, KV_HEADS, HEAD_DIM = 32, 8, 128
KV_BYTES_PER_TOKEN = LAYERS * 2 * KV_HEADS * HEAD_DIM * 2  # K and V, bf16
# BLOCK: vLLM's default block size for the installed release (16; 64 from 0.34.0).

DMA_PROBE = r"""
import json, sys, time, torch
torch.cuda.set_device(int(sys.argv[1]) if len(sys.argv) > 1 else 0)
n = 4 << 30
src = torch.empty(n, dtype=torch.uint8, pin_memory=True); src.fill_(1)
dst = torch.empty(n, dtype=torch.uint8, device="cuda")
rates = []
for _ in range(6):
    torch.cuda.synchronize(); t = time.perf_counter()
    dst.copy_(src, non_blocking=True); torch.cuda.synchronize()
    rates.append(n / (time.perf_counter() - t))
print(json.dumps({"h2d_bytes_per_s": sorted(rates[1:])[2], "samples": rates}))
"""


def write_model(path: Path) -> Path:
    """config.json of a Llama-3-8B shape; weights come from vLLM's dummy loader."""
    path.mkdir(parents=True, exist_ok=True)
    cfg = {
        "architectures": ["LlamaForCausalLM"],
        "model_type": "llama",
        "vocab_size": 128256,
        "hidden_size": 4096,
        "intermediate_size": 14336,
        "num_hidden_layers": LAYERS,
        "num_attention_heads": 32,
        "num_key_value_heads": KV_HEADS,
        "head_dim": HEAD_DIM,
        "max_position_embeddings": 40960,
        "rope_theta": 500000.0,
        "rms_norm_eps": 1e-5,
        "torch_dtype": "bfloat16",
        "tie_word_embeddings": False,
        "bos_token_id": 1,
        "eos_token_id": 2,
    }
    (path / "config.json").write_text(json.dumps(cfg, indent=1))
    return path


def prompts_for(lengths: list[int], reps: int) -> dict[int, list[Any]]:
    return {n: [[[90_000 + n + r, n]] for r in range(reps)] for n in lengths}


def gen(tag: str, prompts: list[Any], **kw: Any) -> dict[str, Any]:
    return {"op": "generate", "tag": tag, "prompts": prompts, "max_tokens": 1, **kw}


WARMUP = [[[12345, 512]], [[12346, 2048]]]


def parse_variants(ap: argparse.ArgumentParser, values: list[str], *, connector_only: bool = False) -> dict[str, Any]:
    """`--orbitkv-variant NAME=JSON` values as {name: settings}; bad ones end the program
    through `ap.error` (with `connector_only`, any key but `orbitkv.*` too)."""
    variants: dict[str, dict[str, Any]] = {}
    for v in values:
        name, sep, js = v.partition("=")
        if not sep or not name.isidentifier():
            ap.error(f"--orbitkv-variant {v!r}: expected NAME=JSON")
        try:
            variants[name] = dict(json.loads(js))
        except (ValueError, TypeError) as exc:
            ap.error(f"--orbitkv-variant {name}: {exc}")
        if connector_only and not all(k.startswith("orbitkv.") for k in variants[name]):
            ap.error(f"--orbitkv-variant {name}: only orbitkv.* connector settings")
    return variants


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--png", type=Path)
    ap.add_argument("--lengths", default="2048,8192,32768")
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--mode", choices=("eager", "compile"), default="compile")
    ap.add_argument("--dram-size", default="24GiB")
    ap.add_argument(
        "--ssd-dir",
        type=Path,
        default=None,
        help="an empty directory for the SSD tier (default: WORK/ssd); blocks of an earlier run would count",
    )
    ap.add_argument("--ssd-capacity", default="24GiB")
    ap.add_argument("--gpu-memory-utilization", type=float, default=0.6)
    ap.add_argument("--step-cost", action="store_true")
    ap.add_argument("--tp", type=int, default=1, help="tensor_parallel_size of every engine (1, 2, 4 or 8)")
    ap.add_argument(
        "--sections",
        default="plain,offload,dram,ssd",
        help="which rows to run (plain: recompute, HBM hit and the floor; offload; dram; ssd)",
    )
    ap.add_argument(
        "--orbitkv-variant",
        action="append",
        default=[],
        metavar="NAME=JSON",
        help="another fresh-process DRAM reader with these settings (orbitkv.* keys: the connector's, others: "
        'LLM(...) keyword arguments), e.g. inline={"orbitkv.async_lookups": false}, '
        'redeem={"orbitkv.query_control": true} or sync={"async_scheduling": false}; '
        "its row is orbitkv_dram_NAME_s (repeatable)",
    )
    ap.add_argument("--work", type=Path, default=None, help="logs and plans (default: a temporary directory)")
    args = ap.parse_args()
    if args.reps < 3:
        ap.error("--reps must be at least 3 (medians)")
    if args.tp not in (1, 2, 4, 8):
        ap.error("--tp must be 1, 2, 4 or 8 (the model's 8 KV heads split evenly)")
    lengths = [int(x) for x in args.lengths.split(",")]
    sections = set(args.sections.split(","))
    if not sections <= {"plain", "offload", "dram", "ssd"}:
        ap.error(f"--sections: unknown {sorted(sections - {'plain', 'offload', 'dram', 'ssd'})}")
    variants = parse_variants(ap, args.orbitkv_variant)
    if max(lengths) + 64 > 40960:
        ap.error("a length above 40,896 tokens does not fit the model's context")
    work = args.work or Path(tempfile.mkdtemp(prefix="engine-ttft-"))
    work.mkdir(parents=True, exist_ok=True)
    ssd_dir = args.ssd_dir or work / "ssd"
    if ssd_dir.exists() and any(ssd_dir.iterdir()):
        # An earlier run's blocks would satisfy the wait for the SSD copies before this run's were
        # written, and fill the tier (seen on the H200, 2026-12-03: the SSD row read 0).
        ap.error(f"--ssd-dir {ssd_dir} is not empty; give an empty or new directory")
    ssd_dir.mkdir(parents=True, exist_ok=True)
    model = write_model(work / "llama-8b-shape")
    prompts = prompts_for(lengths, args.reps)
    all_prompts = [p for n in lengths for p in prompts[n]]
    llm = {
        "dtype": "bfloat16",
        "load_format": "dummy",
        "max_model_len": max(lengths) + 64,
        "max_num_batched_tokens": 8192,
        "gpu_memory_utilization": args.gpu_memory_utilization,
        "seed": 0,
        "enforce_eager": args.mode == "eager",
    }
    # With TP every OrbitKV role looks up once per request and each rank redeems its shard.
    qc: dict[str, Any] = {"orbitkv.query_control": True} if args.tp > 1 else {}
    if args.tp > 1:
        llm["tensor_parallel_size"] = args.tp
    base = {"model": str(model), "metrics": True}
    result: dict[str, Any] = {
        "mode": args.mode,
        "lengths": lengths,
        "reps": args.reps,
        "kv_bytes_per_token": KV_BYTES_PER_TOKEN,
        "block_size": BLOCK,
        "tp": args.tp,
        "started": time.strftime("%FT%TZ", time.gmtime()),
    }
    t0 = time.monotonic()

    result["dma"] = dma_probe(args.tp)
    print(
        f"engine_ttft: pinned H2D {result['dma']['h2d_bytes_per_s'] / 1e9:.1f} GB/s (slowest of {args.tp})", flush=True
    )

    roles: dict[str, Any] = {}

    def save() -> None:
        """The JSON as it stands, after every role: a run cut short keeps what it measured."""
        result["wall_s"] = time.monotonic() - t0
        result["roles"] = roles
        result["rows"] = summarise(result, roles, lengths, args.reps)
        args.out.write_text(json.dumps(result, indent=1))

    def step_cost(socket: str) -> None:
        """All-miss steps (64 requests of 1,024 new tokens, OrbitKV saving every block) with
        the connector's scheduler hooks timed, then the same without a connector."""
        steps = [[[50_000 + i, 1024]] for i in range(64)]
        step_env = {"VLLM_ENABLE_V1_MULTIPROCESSING": "0", "ORBITKV_TIME_SCHEDULER_HOOKS": "1"}
        ph = [gen("warmup", WARMUP), {"op": "steps", "tag": "steps", "prompts": steps, "max_tokens": 64}]
        cfg = connector_config(socket, **qc)
        roles["steps_orbitkv"] = run_driver(
            base | {"socket": socket, "llm": llm | {"kv_transfer_config": cfg}, "phases": ph},
            work,
            "steps_orbitkv",
            step_env,
        )
        roles["steps_plain"] = run_driver(base | {"llm": llm, "phases": ph}, work, "steps_plain", step_env)
        save()

    phases_plain = [gen("warmup", WARMUP)]
    for n in lengths:
        phases_plain += [gen(f"recompute_{n}", prompts[n]), gen(f"hbm_{n}", prompts[n])]
    if "plain" in sections:
        roles["plain"] = run_driver(base | {"llm": llm, "phases": phases_plain}, work, "plain")
        save()
        print(f"engine_ttft: plain done ({time.monotonic() - t0:.0f} s)", flush=True)

    off_phases = [gen("warmup", WARMUP)]
    for n in lengths:
        for r, p in enumerate(prompts[n]):
            off_phases += [
                gen(f"off_cold_{n}_{r}", [p]),
                {"op": "reset_prefix_cache", "tag": f"off_reset_{n}_{r}"},
                gen(f"off_hit_{n}_{r}", [p]),
            ]
    off_llm = llm | {"kv_offloading_size": float(args.dram_size.removesuffix("GiB")), "kv_offloading_backend": "native"}
    if "offload" in sections:
        roles["offload"] = run_driver(base | {"llm": off_llm, "phases": off_phases}, work, "offload")
        save()
        print(f"engine_ttft: offload done ({time.monotonic() - t0:.0f} s)", flush=True)
    if not sections & {"dram", "ssd"}:
        save()
        print_table(result["rows"], lengths)
        return 0

    ssd = (
        "--ssd-dir",
        str(ssd_dir),
        "--ssd-capacity",
        args.ssd_capacity,
        "--ssd-write-policy",
        "eager",
        "--enable-query-control",
    )  # query control only for a variant that asks for it
    mlog = work / "manager.log"
    m = Manager(mlog, "--dram-size", args.dram_size, *ssd)
    try:
        cfg = connector_config(m.socket, **qc)
        oll = llm | {"kv_transfer_config": cfg}
        roles["saver"] = run_driver(
            base
            | {
                "socket": m.socket,
                "llm": oll,
                "phases": [gen("warmup", WARMUP), gen("save", all_prompts), {"op": "settle", "tag": "settle"}],
            },
            work,
            "saver",
        )
        if "dram" in sections:
            dram_phases = [
                gen("warmup", WARMUP),
                *[gen(f"dram_{n}", prompts[n], per_prompt_counters=True) for n in lengths],
            ]
            for name, extra in variants.items():
                # `orbitkv.*` keys go to the connector, the others to vLLM's `LLM(...)`
                conn = {k: v for k, v in extra.items() if k.startswith("orbitkv.")}
                engine = {k: v for k, v in extra.items() if not k.startswith("orbitkv.")}
                vcfg = connector_config(m.socket, **(qc | conn))
                roles[f"reader_dram_{name}"] = run_driver(
                    base
                    | {"socket": m.socket, "llm": llm | engine | {"kv_transfer_config": vcfg}, "phases": dram_phases},
                    work,
                    f"reader_dram_{name}",
                )
                save()
            roles["reader_dram"] = run_driver(
                base
                | {
                    "socket": m.socket,
                    "llm": oll,
                    "phases": [
                        gen("warmup", WARMUP),
                        *[gen(f"dram_{n}", prompts[n], per_prompt_counters=True) for n in lengths],
                    ],
                },
                work,
                "reader_dram",
            )
        want = sum(n // BLOCK for n in lengths) * args.reps
        deadline = time.monotonic() + (300 if "ssd" in sections else 0)
        while time.monotonic() < deadline and int(m.stats().get("ssd_blocks", 0)) < want:
            time.sleep(0.5)
        result["ssd_blocks_before_restart"] = on_ssd = int(m.stats().get("ssd_blocks", 0))
        result["ssd_blocks_wanted"] = want
        if "ssd" in sections and on_ssd < want:
            print(f"engine_ttft: only {on_ssd} of {want} blocks on SSD after 300 s; the SSD row will miss", flush=True)
        save()
        if args.step_cost and "ssd" not in sections:
            step_cost(m.socket)  # on this Manager; with the SSD row, after it on the restarted one
    finally:
        m.stop()
    if "ssd" not in sections:
        save()
        print_table(result["rows"], lengths)
        return 0
    m = Manager(mlog, "--dram-size", args.dram_size, *ssd)
    try:
        result["manager_after_restart"] = {k: v for k, v in m.stats().items() if k.startswith(("ssd_", "dram_"))}
        roles["reader_ssd"] = run_driver(
            base
            | {
                "socket": m.socket,
                "llm": llm | {"kv_transfer_config": connector_config(m.socket, **qc)},
                "phases": [
                    gen("warmup", WARMUP),
                    *[gen(f"ssd_{n}", prompts[n], per_prompt_counters=True) for n in lengths],
                ],
            },
            work,
            "reader_ssd",
        )
        if args.step_cost:
            step_cost(m.socket)
    finally:
        m.stop()
    save()
    print_table(result["rows"], lengths)
    if args.png:
        plot(result["rows"], lengths, args.png)
    return 0


def dma_probe(tp: int) -> dict[str, Any]:
    """The pinned host-to-device rate of each of the `tp` GPUs, all copying at once (as
    the ranks restore at once); `h2d_bytes_per_s` is the slowest rank's."""
    procs = [
        subprocess.Popen([sys.executable, "-c", DMA_PROBE, str(rank)], stdout=subprocess.PIPE, text=True)
        for rank in range(tp)
    ]
    per_rank = []
    for rank, p in enumerate(procs):
        out, _ = p.communicate(timeout=300)
        if p.returncode != 0:
            raise RuntimeError(f"the DMA probe on GPU {rank} failed (rc {p.returncode})")
        per_rank.append(json.loads(out))
    return {"h2d_bytes_per_s": min(r["h2d_bytes_per_s"] for r in per_rank), "per_rank": per_rank}


def phase(role: dict[str, Any], tag: str) -> dict[str, Any]:
    for ph in role["phases"]:
        if ph["tag"] == tag:
            return ph  # type: ignore[no-any-return]
    raise KeyError(tag)


def summarise(result: dict[str, Any], roles: dict[str, Any], lengths: list[int], reps: int) -> dict[str, Any]:
    """Rows per length from the roles' results; a role that did not run leaves its
    columns out (named in `missing`), never filled in."""
    rate = result["dma"]["h2d_bytes_per_s"]
    rows: dict[str, Any] = {"missing": [r for r in ("plain", "offload", "reader_dram", "reader_ssd") if r not in roles]}
    for n in lengths:
        hit_tokens = (n - 1) // BLOCK * BLOCK
        row: dict[str, Any] = {"hit_tokens": hit_tokens, "hit_bytes": hit_tokens * KV_BYTES_PER_TOKEN}

        def med(outs: list[dict[str, Any]], expect: tuple[int, ...], name: str, row: dict[str, Any] = row) -> float:
            for o in outs:
                if o["num_cached_tokens"] not in expect:
                    row.setdefault("problems", []).append(f"{name}: cached {o['num_cached_tokens']} not in {expect}")
            return statistics.median(o["wall_s"] for o in outs)

        for role_name, role in roles.items():
            if role_name.startswith("reader_dram_"):
                outs = phase(role, f"dram_{n}")["outputs"]
                row[f"orbitkv_dram_{role_name.removeprefix('reader_dram_')}_s"] = med(outs, (hit_tokens,), role_name)
        if "plain" in roles:
            row["recompute_s"] = med(phase(roles["plain"], f"recompute_{n}")["outputs"], (0,), "recompute")
            row["hbm_hit_s"] = med(phase(roles["plain"], f"hbm_{n}")["outputs"], (hit_tokens,), "hbm")
            # each rank restores its 1/TP of the bytes over its own link; the slowest decides
            row["floor_s"] = row["hbm_hit_s"] + row["hit_bytes"] / result.get("tp", 1) / rate
        for src in ("dram", "ssd"):
            if f"reader_{src}" in roles:
                outs = phase(roles[f"reader_{src}"], f"{src}_{n}")["outputs"]
                row[f"orbitkv_{src}_s"] = med(outs, (hit_tokens,), src)
                row[f"orbitkv_{src}_manager_hit_blocks"] = [o["manager"].get("hit_blocks_total", 0) for o in outs]
        if "offload" in roles:
            # vLLM's CPU offloading reports the whole prompt as cached (the last token is
            # recomputed all the same); OrbitKV never offers the block holding it
            off = [phase(roles["offload"], f"off_hit_{n}_{r}")["outputs"][0] for r in range(reps)]
            row["offloading_cpu_s"] = med(off, (hit_tokens, n), "offloading")
            row["offloading_resets"] = [phase(roles["offload"], f"off_reset_{n}_{r}")["reset"] for r in range(reps)]
        if "floor_s" in row and "orbitkv_dram_s" in row:
            row["orbitkv_dram_over_floor"] = row["orbitkv_dram_s"] / row["floor_s"]
            row["recompute_over_orbitkv_dram"] = row["recompute_s"] / row["orbitkv_dram_s"]
        if "offloading_cpu_s" in row and "orbitkv_dram_s" in row:
            row["orbitkv_dram_over_offloading"] = row["orbitkv_dram_s"] / row["offloading_cpu_s"]
        rows[str(n)] = row
    if "steps_orbitkv" in roles and "steps_plain" in roles:
        so, sp = phase(roles["steps_orbitkv"], "steps"), phase(roles["steps_plain"], "steps")
        hooks = sum(so.get("scheduler_hook_s", {}).values())
        rows["step_cost"] = {
            "steps_orbitkv": len(so["step_s"]),
            "steps_plain": len(sp["step_s"]),
            "step_s_orbitkv_total": sum(so["step_s"]),
            "step_s_plain_total": sum(sp["step_s"]),
            "scheduler_hook_s_total": hooks,
            "hook_share_of_step_time": hooks / sum(so["step_s"]),
            "hooks": so.get("scheduler_hook_s", {}),
        }
    return rows


def print_table(rows: dict[str, Any], lengths: list[int]) -> None:
    cols = ("recompute_s", "hbm_hit_s", "orbitkv_dram_s", "orbitkv_ssd_s", "offloading_cpu_s", "floor_s")
    print("tokens  " + "  ".join(f"{c:>17}" for c in cols) + "  dram/floor")
    for n in lengths:
        r = rows[str(n)]
        cells = "  ".join(f"{r[c]:17.4f}" if c in r else f"{'-':>17}" for c in cols)
        print(f"{n:6d}  {cells}  {r.get('orbitkv_dram_over_floor', float('nan')):.2f}")
        if r.get("problems"):
            print("   problems:", r["problems"])
    if "step_cost" in rows:
        print("step cost:", json.dumps(rows["step_cost"]))


def plot(rows: dict[str, Any], lengths: list[int], png: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    names = [
        ("recompute_s", "recompute"),
        ("offloading_cpu_s", "vLLM OffloadingConnector (CPU)"),
        ("orbitkv_ssd_s", "OrbitKV (SSD)"),
        ("orbitkv_dram_s", "OrbitKV (DRAM, fresh process)"),
        ("floor_s", "floor"),
        ("hbm_hit_s", "vLLM HBM hit"),
    ]
    fig, ax = plt.subplots(figsize=(8, 4.5))
    width = 0.8 / len(names)
    for i, (key, label) in enumerate(names):
        if all(key in rows[str(n)] for n in lengths):
            ax.bar(
                [j + i * width for j in range(len(lengths))], [rows[str(n)][key] for n in lengths], width, label=label
            )
    ax.set_xticks([j + 0.4 - width / 2 for j in range(len(lengths))], [f"{n // 1024}K" for n in lengths])
    ax.set_yscale("log")
    ax.set_ylabel("time to first token (s)")
    ax.set_title("Llama-3-8B shape, one H200 (median)")
    ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(png, dpi=120)


if __name__ == "__main__":
    sys.exit(main())
