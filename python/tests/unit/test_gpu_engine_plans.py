"""The GPU engine suite's plans, checked where no GPU is (source-only: no vLLM, torch or
native module): every role and phase the tests read exists, every phase is one the
driver runs, every prompt fits the engines' context, prompts are the same in every
process. A plan error found here costs no device time."""

from __future__ import annotations

import ast
import sys
from pathlib import Path

import pytest

SUITE = Path(__file__).resolve().parents[1] / "gpu_engine"
sys.path.insert(0, str(SUITE))

import engine_driver  # noqa: E402
import gpu_suite  # noqa: E402

MODES = ("eager", "compile", "batch_invariant", *gpu_suite.TP_MODES)


def driver_ops() -> set[str]:
    """The `op` values `Driver.run` dispatches on (`Driver.OPS`, each a method of the driver)."""
    ops = set(engine_driver.Driver.OPS)
    assert all(callable(getattr(engine_driver.Driver, op, None)) for op in ops), ops
    return ops


def test_prompts_are_deterministic_and_inside_the_vocabulary() -> None:
    a = engine_driver.prompt_tokens([[1, 500], [2, 300]])
    assert a == engine_driver.prompt_tokens([[1, 500], [2, 300]])
    assert len(a) == 800 and a[:500] == engine_driver.prompt_tokens([[1, 500]])
    assert min(a) >= 100 and max(a) < 32000 - 100


@pytest.mark.parametrize("mode", MODES)
def test_every_role_and_phase_is_well_formed(mode: str) -> None:
    roles = gpu_suite.roles_for(mode)
    names = [r.name for r in roles]
    assert names[0] == "ref" and not roles[0].connector, "the reference runs without the connector"
    assert len(set(names)) == len(names)
    assert all(r.connector for r in roles[1:]) and names[1] == "saver"
    ops = driver_ops()
    max_len = gpu_suite.llm_kwargs(mode)["max_model_len"]
    for r in roles:
        tags = [ph["tag"] for ph in r.phases]
        assert len(set(tags)) == len(tags), f"{r.name}: a tag twice"
        for ph in r.phases:
            assert ph["op"] in ops, f"{r.name}/{ph['tag']}: the driver has no op {ph['op']!r}"
            for p in ph.get("prompts", []):
                n = sum(length for _, length in p)
                assert n + ph.get("max_tokens", 8) <= max_len, f"{r.name}/{ph['tag']}: {n} tokens"


def phase_tags() -> dict[str, dict[str, set[str]]]:
    return {m: {r.name: {ph["tag"] for ph in r.phases} for r in gpu_suite.roles_for(m)} for m in MODES}


def test_the_phases_the_tests_read_exist() -> None:
    """Every `run.outputs(role, tag)` / `run.phase(role, tag)` with literal arguments in
    test_vllm_gpu.py names a phase of some mode."""
    tree = ast.parse((SUITE / "test_vllm_gpu.py").read_text())
    wanted: set[tuple[str, str]] = set()
    for node in ast.walk(tree):
        if (
            isinstance(node, ast.Call)
            and isinstance(node.func, ast.Attribute)
            and node.func.attr in ("outputs", "phase")
            and len(node.args) == 2
            and all(isinstance(a, ast.Constant) for a in node.args)
        ):
            wanted.add((node.args[0].value, node.args[1].value))  # type: ignore[union-attr]
    assert len(wanted) > 10
    tags = phase_tags()
    for role, tag in sorted(wanted):
        assert any(tag in tags[m].get(role, set()) for m in MODES), f"no mode has {role}/{tag}"


def test_partial_hits_share_exactly_the_saved_prefix() -> None:
    """The partial prompts start with the whole saved base prompt and go on with tokens
    of their own; the full prompts are not prefixes of one another."""
    for base, part in zip(gpu_suite.PARTIAL_BASE, gpu_suite.PARTIAL, strict=True):
        b, p = engine_driver.prompt_tokens(base), engine_driver.prompt_tokens(part)
        assert p[: len(b)] == b and len(p) > len(b)
    fulls = [engine_driver.prompt_tokens(f) for f in gpu_suite.FULL]
    assert all(a[:16] != b[:16] for i, a in enumerate(fulls) for b in fulls[i + 1 :])
    assert gpu_suite.hit_tokens(gpu_suite.PARTIAL[0], 1000) == 992


@pytest.mark.parametrize("mode", gpu_suite.TP_MODES)
def test_tp_modes_run_every_engine_at_their_size_and_kill_the_last_rank(mode: str) -> None:
    tp = gpu_suite.tp_of(mode)
    assert tp in (2, 4) and gpu_suite.llm_kwargs(mode)["tensor_parallel_size"] == tp
    assert not gpu_suite.llm_kwargs(mode)["enforce_eager"], "TP runs with CUDA graphs on"
    (kill,) = [ph for r in gpu_suite.roles_for(mode) for ph in r.phases if ph["op"] == "kill_worker_mid_load"]
    assert kill["rank"] == tp - 1
    (role,) = [r for r in gpu_suite.roles_for(mode) if kill in r.phases]
    assert role.env.get("VLLM_ENABLE_V1_MULTIPROCESSING") == "0", "the driver reaches the workers in-process"
    assert "tensor_parallel_size" not in gpu_suite.llm_kwargs("compile")
