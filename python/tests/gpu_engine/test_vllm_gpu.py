"""OrbitKV inside the released vLLM on a GPU (L4): the real `LLM` engine with
OrbitKVConnector, every hit compared bit for bit (greedy tokens and the logprob of
every chosen token) with vLLM's own prefix-cache hit of the same prompt in a process
without the connector. Roles and prompts: gpu_suite.py; one engine process per role.

Modes: `eager` (`enforce_eager=True`), `compile` (vLLM's default: torch.compile and
CUDA graphs) and `batch_invariant` (eager, `VLLM_BATCH_INVARIANT=1`): cases whose
batches differ between reference and reader (32 concurrent requests, preemption) are
only bit-comparable when vLLM's kernels do not depend on the batch. `tp2` / `tp4`:
compile mode at tensor-parallel size 2 / 4 with query control (skipped with fewer GPUs).

    python -m pytest -q -rs python/tests/gpu_engine     # on a GPU host, vLLM installed
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from engine_driver import prompt_tokens
from gpu_suite import (
    BLOCK,
    CONCURRENT,
    FULL,
    LONG,
    PARTIAL,
    PREEMPT,
    TP_MODES,
    Manager,
    SuiteRun,
    VllmServer,
    connector_config,
    hit_tokens,
    run_model_dir,
    settle_commits,
    tp_of,
)

Suite = Callable[[str], SuiteRun]


def same(got: dict[str, Any], want: dict[str, Any], what: str) -> None:
    """Tokens and every logprob equal as floats (bit-identical for float32 values)."""
    assert got["tokens"] == want["tokens"], f"{what}: tokens differ\n got {got['tokens']}\nwant {want['tokens']}"
    diffs = [(i, g, w) for i, (g, w) in enumerate(zip(got["logprobs"], want["logprobs"], strict=True)) if g != w]
    assert not diffs, f"{what}: logprobs differ at (step, got, want) {diffs[:4]}"


def check_ref_hits(run: SuiteRun, tag: str, prompts: list[Any], prefix: int | None = None) -> None:
    """The reference really is vLLM's own prefix hit of the expected length."""
    for i, (out, p) in enumerate(zip(run.outputs("ref", tag), prompts, strict=True)):
        assert out["num_cached_tokens"] == hit_tokens(p, prefix), f"ref {tag}[{i}] hit {out['num_cached_tokens']}"


@pytest.mark.parametrize("mode", ["eager", "compile"])
def test_full_hit_in_a_fresh_process_is_bit_identical_to_vllms_prefix_hit(suite: Suite, mode: str) -> None:
    run = suite(mode)
    for role in ("ref", "saver", "reader"):
        engine = run.roles[role]["engine"] if role in run.roles else {}
        assert engine.get("block_size") == BLOCK, f"{role}: {engine}"
        # vLLM 0.34.0's default on CUDA: the KV cache reserved as virtual memory, each
        # layer's committed segment a storage of its own (taken by the copy engine)
        assert engine.get("extensible_kv_cache") is (True if engine.get("vllm") == "0.34.0" else None), engine
    check_ref_hits(run, "full_hit", FULL)
    saver = run.roles["manager_after_saver"]["stats"]
    assert saver["blocks_committed_total"] >= sum(hit_tokens(p) // BLOCK for p in FULL)
    for i, (got, want, p) in enumerate(
        zip(run.outputs("reader", "full"), run.outputs("ref", "full_hit"), FULL, strict=True)
    ):
        assert got["num_cached_tokens"] == hit_tokens(p), f"full[{i}]: hit {got['num_cached_tokens']} tokens"
        assert got["manager"]["hit_blocks_total"] > 0, f"full[{i}]: the Manager served no block"
        same(got, want, f"{mode} full[{i}]")


@pytest.mark.parametrize("mode", ["eager", "compile"])
def test_partial_hit_is_bit_identical_to_vllms_partial_prefix_hit(suite: Suite, mode: str) -> None:
    run = suite(mode)
    check_ref_hits(run, "partial_hit", PARTIAL, prefix=1000)
    for i, (got, want, p) in enumerate(
        zip(run.outputs("reader", "partial"), run.outputs("ref", "partial_hit"), PARTIAL, strict=True)
    ):
        assert got["num_cached_tokens"] == hit_tokens(p, 1000), f"partial[{i}]: hit {got['num_cached_tokens']}"
        assert got["manager"]["hit_blocks_total"] > 0
        same(got, want, f"{mode} partial[{i}]")


def test_loads_reported_in_their_step_under_cuda_graphs_are_bit_identical(suite: Suite) -> None:
    """`orbitkv.load_wait_us` in compile mode (the worker holds a step's results until its
    loads are copied, so that each is reported in the step that starts it; a fresh
    process, before the `reader` role): full and partial hits bit for bit vLLM's own
    prefix hit. The step count itself is measured by benches/vllm_load_wait.py."""
    run = suite("compile")
    for tag, prompts, ref_tag, prefix in (("full", FULL, "full_hit", None), ("partial", PARTIAL, "partial_hit", 1000)):
        for i, (got, want, p) in enumerate(
            zip(run.outputs("reader_wait", tag), run.outputs("ref", ref_tag), prompts, strict=True)
        ):
            assert got["num_cached_tokens"] == hit_tokens(p, prefix), f"wait {tag}[{i}]: {got['num_cached_tokens']}"
            assert got["manager"]["hit_blocks_total"] > 0, f"wait {tag}[{i}]: the Manager served no block"
            same(got, want, f"wait {tag}[{i}]")


def test_torch_kernel_and_restore_after_vllm_evicted_the_prefix_from_hbm(suite: Suite) -> None:
    """A reader with a 4,800-token HBM cache and the `torch` copy kernel: full hits, then
    filler prompts evict them from HBM, then the same prompts hit the Manager again."""
    run = suite("eager")
    ref = run.outputs("ref", "full_hit")
    for tag in ("full", "full_after_eviction"):
        for i, (got, want, p) in enumerate(zip(run.outputs("reader_torch", tag), ref, FULL, strict=True)):
            assert got["num_cached_tokens"] == hit_tokens(p), f"{tag}[{i}]: hit {got['num_cached_tokens']}"
            # vLLM asks the connector only for blocks it lacks: a Manager hit here means
            # the prefix had left HBM
            assert got["manager"]["hit_blocks_total"] > 0, f"{tag}[{i}]: not served by the Manager"
            same(got, want, f"torch kernel {tag}[{i}]")


def test_abort_mid_load_leaks_no_lease_and_the_next_request_is_exact(suite: Suite) -> None:
    run = suite("eager")
    ab = run.phase("reader", "abort")
    assert not ab["unfinished_after"]
    assert ab["live_leases_settled"] == 0, f"{ab['live_leases_settled']} leases left after the abort"
    for out in ab["outputs"]:
        assert out["finish_reason"] == "abort", out
    (got,) = run.outputs("reader", "after_abort")
    same(got, run.outputs("ref", "long_hit")[0], "after abort")


def test_manager_sigkilled_mid_load_the_request_completes_correctly(suite: Suite) -> None:
    """Either the copy finished from the still-mapped arena (a hit) or vLLM recomputed
    (the connector reported the failed blocks): never wrong KV."""
    run = suite("eager")
    k = run.phase("reader", "kill")
    assert not k["unfinished_after"]
    (got,) = k["outputs"]
    assert got["finish_reason"] == "length", got
    hit, cold = run.outputs("ref", "long_hit")[1], run.outputs("ref", "long_cold")[1]
    assert got["tokens"] in (hit["tokens"], cold["tokens"]), "tokens match neither the hit nor the recompute"
    assert got["logprobs"] in (hit["logprobs"], cold["logprobs"]), "logprobs match neither hit nor recompute"
    assert len(LONG) == 2


def first_step(out: dict[str, Any]) -> dict[str, Any]:
    """The first generated token and its logprob: the prefill over the whole prompt, which
    reads every restored KV byte."""
    return {"tokens": out["tokens"][:1], "logprobs": out["logprobs"][:1]}


def test_32_concurrent_requests_sharing_a_prefix(suite: Suite) -> None:
    """32 requests at once, one shared prefix, in a reader with vLLM's full HBM cache.
    On 0.31.0 and 0.33.0 every token and logprob equals the reference. On 0.34.0 (V2 model
    runner) decode steps depend on how requests were batched even with
    VLLM_BATCH_INVARIANT=1 - vLLM's own cold and hit runs of one request differ there from
    the second decode step (H200, 2026-12-04) - so the comparison is the first token and
    its logprob, the prefill that reads every restored KV byte."""
    run = suite("batch_invariant")
    whole = run.roles["reader"]["engine"].get("vllm") != "0.34.0"
    want = run.outputs("ref", "concurrent_hit")
    got = run.outputs("reader", "concurrent")
    assert len(got) == len(CONCURRENT) == 32
    preempted = run.phase("reader", "concurrent")["vllm_metrics"].get("vllm:num_preemptions", 0)
    assert preempted == 0, f"vLLM preempted {preempted} requests: the case compares unpreempted hits"
    for i, (g, w) in enumerate(zip(got, want, strict=True)):
        assert g["num_cached_tokens"] == w["num_cached_tokens"] == hit_tokens(CONCURRENT[i])
        if whole:
            same(g, w, f"concurrent[{i}]")
        else:
            same(first_step(g), first_step(w), f"concurrent[{i}], first step")
    assert run.phase("reader", "concurrent")["vllm_metrics"].get("vllm:external_prefix_cache_hits", 0) > 0


def test_preempted_requests_resume_exactly(suite: Suite) -> None:
    """8 decodes of 48 tokens in a 4,800-token HBM cache: vLLM preempts and resumes them
    (their prompts hit the Manager again); each result equals the request run alone."""
    run = suite("batch_invariant")
    ph = run.phase("reader_small", "preempt")
    assert ph["vllm_metrics"].get("vllm:num_preemptions", 0) > 0, "no preemption happened: the case is void"
    for i, got in enumerate(ph["outputs"]):
        same(got, run.outputs("ref", f"preempt_{i}")[1], f"preempted[{i}]")
    assert len(ph["outputs"]) == len(PREEMPT)


def test_vllm_serve_with_the_connector_json_second_server_hits(suite: Suite, engine_out: Path) -> None:
    """`vllm serve` (vLLM's default compile + CUDA-graph mode) with the connector JSON;
    an OpenAI completions request with a token-id prompt computes and saves it; a second
    server process answers the same request from the Manager, bit-identical to vLLM's own
    prefix-cache hit."""
    run = suite("compile")
    want = run.outputs("ref", "full_hit")[0]
    out = engine_out / "serve"
    out.mkdir(parents=True, exist_ok=True)
    m = Manager(out / "manager.log", "--dram-size", "4GiB")
    try:
        answers = []
        for i in range(2):
            with VllmServer(run_model_dir(run), connector_config(m.socket), out / f"server{i}.log") as srv:
                answers.append(srv.complete(prompt_tokens(FULL[0]), max_tokens=8))
                if i == 0:
                    settle_commits(m)
            if i == 0:
                assert m.stats()["blocks_committed_total"] >= hit_tokens(FULL[0]) // BLOCK
        hits_before = m.stats()["hit_blocks_total"]
    finally:
        m.stop()
    assert hits_before > 0, "the second server was not served by the Manager"
    assert answers[1]["num_cached_tokens"] in (None, hit_tokens(FULL[0]))
    same(answers[1], want, "vllm serve, second server")


def need_gpus(mode: str) -> None:
    import torch

    if torch.cuda.device_count() < tp_of(mode):
        pytest.skip(f"{mode} needs {tp_of(mode)} GPUs; {torch.cuda.device_count()} visible")


@pytest.mark.parametrize("mode", TP_MODES)
def test_tp_full_and_partial_hits_are_bit_identical_to_vllms_prefix_hit(suite: Suite, mode: str) -> None:
    """TP with query control (one Manager lookup per request, each rank redeeming its
    shard), CUDA graphs on: a fresh process's full and partial hits, bit for bit."""
    need_gpus(mode)
    run = suite(mode)
    check_ref_hits(run, "full_hit", FULL)
    check_ref_hits(run, "partial_hit", PARTIAL, prefix=1000)
    for tag, ref_tag, prompts, prefix in (("full", "full_hit", FULL, None), ("partial", "partial_hit", PARTIAL, 1000)):
        for i, (got, want, p) in enumerate(
            zip(run.outputs("reader", tag), run.outputs("ref", ref_tag), prompts, strict=True)
        ):
            assert got["num_cached_tokens"] == hit_tokens(p, prefix), f"{mode} {tag}[{i}]: {got['num_cached_tokens']}"
            assert got["manager"]["hit_blocks_total"] > 0, f"{mode} {tag}[{i}]: the Manager served no block"
            same(got, want, f"{mode} {tag}[{i}]")


@pytest.mark.parametrize("mode", TP_MODES)
def test_tp_rank_killed_mid_load_leaks_nothing_and_serves_no_wrong_kv(suite: Suite, mode: str) -> None:
    """The last rank's worker SIGKILLed while the request's hit is pinned: vLLM's policy
    for a dead worker decides (its executor fails and the engine stops, or the request
    finishes); whatever finished equals the hit or the recompute, and once the engine's
    processes are gone the Manager holds no lease and no open save."""
    need_gpus(mode)
    run = suite(mode)
    k = run.phase("reader_kill", "kill_worker")
    assert k["killed_rank"] == tp_of(mode) - 1
    hit, cold = run.outputs("ref", "long_hit")[0], run.outputs("ref", "long_cold")[0]
    for got in k["outputs"]:
        assert got["tokens"] in (hit["tokens"], cold["tokens"]), "tokens match neither the hit nor the recompute"
        assert got["logprobs"] in (hit["logprobs"], cold["logprobs"]), "logprobs match neither"
    assert k["engine_error"] is not None or k["outputs"], f"the request neither finished nor failed: {k}"
    after = run.roles["manager_after"]["stats"]
    assert (after["live_leases"], after["live_saves"]) == (0, 0), after
