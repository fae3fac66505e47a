"""A/B runs of the benches that compare variants in one run: each variant once per
repetition, their order alternated, medians and paired ratios, the JSON report written."""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

Runs = dict[str, list[dict[str, Any]]]


def hit_args(ap: argparse.ArgumentParser, name: str) -> None:
    """The options of the vLLM CPU benches that serve saved prompts: repetitions, hits,
    their size, the emulated forward per step, and the report's path."""
    root = Path(__file__).resolve().parents[1]
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--hits", type=int, default=8, help="requests whose prompts another engine saved")
    ap.add_argument("--hit-blocks", type=int, default=32, help="blocks of each hit prompt")
    ap.add_argument("--step-ms", type=float, default=10.0, help="sleep per step, for the model forward")
    ap.add_argument("--out", default=str(root / "bench-results" / f"{name}.json"))


def alternated(variants: Sequence[str], reps: int, run: Callable[[str, int], dict[str, Any]]) -> Runs:
    """`run(variant, rep)` for every variant in every repetition, in the given order on even
    repetitions and reversed on odd ones (so neither always runs first)."""
    runs: Runs = {v: [] for v in variants}
    for rep in range(reps):
        for v in list(variants) if rep % 2 == 0 else list(variants)[::-1]:
            runs[v].append(run(v, rep))
    return runs


def vllm_ab(
    variants: Sequence[str],
    args: argparse.Namespace,
    run_variant: Callable[[str, Path, str, argparse.Namespace, int], dict[str, Any]],
    describe: Callable[[dict[str, Any]], str],
) -> Runs:
    """The vLLM CPU benches' A/B: a tiny model and one real Manager for the whole run,
    `run_variant(variant, model_dir, socket, args, seed)` alternated per repetition (each
    variant its own prompts), one line per run. Needs `python/tests/vllm` on sys.path."""
    import vllm_env
    from vllm_harness import write_tiny_model

    tmp = Path(tempfile.mkdtemp(prefix="okv-ab-"))
    model_dir = write_tiny_model(tmp / "tiny-llama")
    manager = vllm_env.ManagerProcess(tmp / "m.sock", tmp / "manager.log", fault_injection=False, dram_size="256MiB")

    def one(v: str, rep: int) -> dict[str, Any]:
        seed = 1_000_000 * (rep + 1) + 500_000 * list(variants).index(v)
        r = run_variant(v, model_dir, str(manager.socket_path), args, seed)
        print(f"rep {rep} {v:5}: {describe(r)}")
        return r

    try:
        return alternated(variants, args.reps, one)
    finally:
        manager.stop()


def median_of(runs: Runs, variant: str, key: str) -> float:
    return statistics.median(r[key] for r in runs[variant])


def paired_median(runs: Runs, num: str, den: str, key: str) -> float:
    """The median over repetitions of `num`'s `key` divided by `den`'s."""
    return statistics.median(a[key] / b[key] for a, b in zip(runs[num], runs[den], strict=True))


def write_report(out: str, report: dict[str, Any]) -> None:
    """Write `report` as JSON to `out` and print its summary."""
    path = Path(out)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(report, indent=2))
    print(json.dumps(report["summary"], indent=1))
