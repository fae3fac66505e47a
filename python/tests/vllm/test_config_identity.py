"""Import isolation (O4), settings parsing, and namespace identity (K1, K2, K4)."""

# ruff: noqa: E402 - each module skips (with its reason) before it imports vLLM
from __future__ import annotations

from vllm_env import skip_module_if_unavailable

skip_module_if_unavailable()

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
from vllm_env import REPO_PYTHON

from orbitkv.engine.identity import adapter_digest, canonical_json, fingerprint, static_lora_identity
from orbitkv.vllm.config import Mode, OrbitKVConfigError, parse_settings

pytestmark = pytest.mark.vllm


def _run_python(code: str, env_extra: dict[str, str | None] | None = None) -> str:
    env = dict(os.environ)
    env["PYTHONPATH"] = str(REPO_PYTHON)
    for k, v in (env_extra or {}).items():  # None: unset
        if v is None:
            env.pop(k, None)
        else:
            env[k] = v
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=300)
    assert out.returncode == 0, out.stderr[-3000:]
    return out.stdout.strip().splitlines()[-1]


def test_import_loads_no_engine_and_nothing_native() -> None:
    code = (
        "import sys, json, orbitkv.vllm\n"
        "print(json.dumps(sorted(m for m in sys.modules if m.split('.')[0] in "
        "('vllm', 'sglang', 'torch') or m == 'orbitkv._native')))"
    )
    loaded = json.loads(_run_python(code))
    assert loaded == [], f"importing orbitkv.vllm loaded {loaded}"


def test_connector_class_resolves_through_module_path() -> None:
    code = (
        "import sys, orbitkv.vllm as m\n"
        "cls = m.OrbitKVConnector\n"
        "from vllm.distributed.kv_transfer.kv_connector.v1.base import KVConnectorBase_V1\n"
        "assert issubclass(cls, KVConnectorBase_V1)\n"
        "print(int('sglang' in sys.modules), int('orbitkv._native' in sys.modules), "
        "int('orbitkv.vllm.scheduler' in sys.modules), int('orbitkv.vllm.worker' in sys.modules))"
    )
    assert _run_python(code).split() == ["0", "0", "0", "0"]


def test_settings_defaults_and_every_key(tmp_path: Path) -> None:
    default = parse_settings({"unrelated": 1})
    assert default.mode is Mode.READ_WRITE and default.loads and default.socket_path is None
    adapter = tmp_path / "a"
    adapter.mkdir()
    s = parse_settings(
        {
            "orbitkv.socket_path": "/run/orbitkv.sock",
            "orbitkv.token": "t",
            "orbitkv.timeout_ms": 100,
            "orbitkv.scheduler_timeout_ms": 40,
            "orbitkv.mode": "save_only",
            "orbitkv.static_lora_adapters": {"sql": str(adapter)},
            "orbitkv.model_identity": "org/model@rev",
            "orbitkv.kv_cache_layout": "BLHNC",
            "orbitkv.load_workers": 4,
            "orbitkv.copy_engine": "torch",
            "orbitkv.copy_kernel": "triton",
            "orbitkv.query_control": True,
            "orbitkv.lookup_wait_us": 0,
            "orbitkv.load_wait_us": 20_000,
        }
    )
    assert s.mode is Mode.SAVE_ONLY and not s.loads
    assert s.static_lora_adapters == {"sql": str(adapter.resolve())}
    assert (s.timeout_ms, s.load_workers, s.kv_cache_layout) == (100, 4, "BLHNC")
    assert (s.scheduler_timeout_ms, default.scheduler_timeout_ms) == (40, 250)
    # copy_engine: "torch" copies through orbitkv.kvcopy everywhere; "auto" only on CUDA.
    assert (s.copy_engine, default.copy_engine) == ("torch", "auto")
    assert s.uses_kvcopy("cpu") and s.uses_kvcopy("cuda")
    assert not default.uses_kvcopy("cpu") and default.uses_kvcopy("cuda")
    assert (s.query_control, default.query_control) == (True, False)
    assert (s.copy_kernel, default.copy_kernel) == ("triton", "auto")
    assert (s.lookup_wait_us, default.lookup_wait_us) == (0, 1000)
    assert (s.load_wait_us, default.load_wait_us) == (20_000, 0)


@pytest.mark.parametrize(
    ("extra", "needle"),
    [
        ({"orbitkv.sockt_path": "x"}, "orbitkv.sockt_path"),
        ({"orbitkv.mode": "read_only"}, "orbitkv.mode"),
        ({"orbitkv.timeout_ms": 0}, "orbitkv.timeout_ms"),
        ({"orbitkv.scheduler_timeout_ms": True}, "orbitkv.scheduler_timeout_ms"),
        ({"orbitkv.kv_cache_layout": "NHD"}, "orbitkv.kv_cache_layout"),
        ({"orbitkv.copy_engine": "cupy"}, "orbitkv.copy_engine must be one of ['auto', 'torch']"),
        ({"orbitkv.copy_kernel": "cuda"}, "orbitkv.copy_kernel must be one of ['auto', 'torch', 'triton', 'dma']"),
        ({"orbitkv.static_lora_adapters": {"x": "/nonexistent/adapter"}}, "not a local directory"),
        ({"orbitkv.static_lora_adapters": "x"}, "orbitkv.static_lora_adapters"),
        ({"orbitkv.query_control": "yes"}, "orbitkv.query_control must be true or false"),
        ({"orbitkv.lookup_wait_us": -1}, "orbitkv.lookup_wait_us must be an integer >= 0"),
        ({"orbitkv.lookup_wait_us": 0.5}, "orbitkv.lookup_wait_us must be an integer >= 0"),
        ({"orbitkv.lookup_wait_us": 100_001}, "orbitkv.lookup_wait_us must be at most 100000"),
        ({"orbitkv.load_wait_us": -1}, "orbitkv.load_wait_us must be an integer >= 0"),
        ({"orbitkv.load_wait_us": 1_000_001}, "orbitkv.load_wait_us must be at most 1000000"),
    ],
)
def test_settings_rejections_name_the_key(extra: dict, needle: str) -> None:
    with pytest.raises(OrbitKVConfigError, match=re.escape(needle)):
        parse_settings(extra)


def test_canonical_json_ignores_insertion_order() -> None:
    a = {"b": 1, "a": {"y": [1, 2], "x": None}}
    b = {"a": {"x": None, "y": [1, 2]}, "b": 1}
    assert canonical_json(a) == canonical_json(b) == b'{"a":{"x":null,"y":[1,2]},"b":1}'
    assert fingerprint(a) == fingerprint(b) and len(fingerprint(a)) == 32


def test_adapter_digest_binds_contents_not_location(tmp_path: Path) -> None:
    from vllm_harness import write_peft_adapter

    a = write_peft_adapter(tmp_path / "a", b"weights-1")
    b = write_peft_adapter(tmp_path / "elsewhere" / "b", b"weights-1")
    assert adapter_digest(str(a)) == adapter_digest(str(b))
    write_peft_adapter(b, b"weights-2")
    assert adapter_digest(str(a)) != adapter_digest(str(b))
    ident = static_lora_identity({"x": str(a)}, {"max_lora_rank": "8"})
    assert ident is not None and set(ident["adapters"]) == {"x"}
    assert static_lora_identity({}, None) is None
    (tmp_path / "not-peft").mkdir()
    with pytest.raises(ValueError, match=r"adapter_config\.json"):
        adapter_digest(str(tmp_path / "not-peft"))


def test_fingerprint_identical_across_processes_and_roles(model_dir: Path) -> None:
    """K2: the same configuration gives the same namespace in unrelated processes, and
    the scheduler and worker roles agree on it. Each role imports only its own module."""
    suite, model = str(Path(__file__).parent), str(model_dir)

    def run(role: str, seed: str | None) -> list[str]:
        code = (
            f"import sys; sys.path.insert(0, {suite!r})\n"
            "import vllm_env, vllm_harness as harness\n"
            "from pathlib import Path\n"
            "from vllm.distributed.kv_transfer.kv_connector.factory import KVConnectorFactory\n"
            "from vllm.distributed.kv_transfer.kv_connector.v1.base import KVConnectorRole\n"
            f"cfg = harness.make_vllm_config(Path({model!r}), socket_path='/nonexistent.sock')\n"
            "kc = harness.make_kv_cache_config(64, 'LBNHC')\n"
            f"c = KVConnectorFactory.create_connector(cfg, KVConnectorRole.{role}, kc)\n"
            "mods = [m for m in ('orbitkv.vllm.scheduler', 'orbitkv.vllm.worker', 'orbitkv._native') "
            "if m in sys.modules]\n"
            "print(c.fingerprint.hex(), ','.join(mods) or '-')"
        )
        return _run_python(code, {"PYTHONHASHSEED": seed}).split()

    # PYTHONHASHSEED unset: each process randomises str hashing differently.
    worker_fp, worker_mods = run("WORKER", None)
    sched_fp, sched_mods = run("SCHEDULER", None)
    assert worker_fp == sched_fp and len(worker_fp) == 64
    # A set PYTHONHASHSEED seeds vLLM's block-hash chain (NONE_HASH): it is bound (K2).
    seeded, _ = run("SCHEDULER", "12345")
    assert seeded != sched_fp and len(seeded) == 64
    assert worker_mods == "orbitkv.vllm.worker"  # no scheduler code, nothing native yet
    assert sched_mods == "orbitkv.vllm.scheduler"
