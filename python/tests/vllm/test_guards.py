"""Profile guards (V3): each rejection names its setting and happens before any
Manager connection (the configured socket does not exist, so connecting would fail
with a different error)."""

# ruff: noqa: E402 - each module skips (with its reason) before it imports vLLM
from __future__ import annotations

from vllm_env import skip_module_if_unavailable

skip_module_if_unavailable()

from pathlib import Path

import pytest
import torch
import vllm
from vllm.config import SpeculativeConfig
from vllm.distributed.kv_transfer.kv_connector.factory import KVConnectorFactory
from vllm.distributed.kv_transfer.kv_connector.v1.base import KVConnectorRole
from vllm.v1.kv_cache_interface import (
    FullAttentionSpec,
    KVCacheConfig,
    KVCacheGroupSpec,
    SlidingWindowSpec,
)
from vllm_harness import BLOCK, LAYERS, make_kv_cache_config, make_vllm_config

from orbitkv.vllm.profile import UnsupportedProfileError

pytestmark = pytest.mark.vllm

NO_MANAGER = "/nonexistent/orbitkv-guard-test.sock"


def _build(cfg, kc: KVCacheConfig | None = None, role: KVConnectorRole = KVConnectorRole.SCHEDULER):  # type: ignore[no-untyped-def]
    return KVConnectorFactory.create_connector(cfg, role, kc or make_kv_cache_config(64, "LBNHC"))


@pytest.mark.parametrize("role", [KVConnectorRole.SCHEDULER, KVConnectorRole.WORKER])
def test_accepted_profile_constructs_without_connecting(model_dir: Path, role: KVConnectorRole) -> None:
    conn = _build(make_vllm_config(model_dir, socket_path=NO_MANAGER), role=role)
    side = conn.scheduler_side if role == KVConnectorRole.SCHEDULER else conn.worker_side
    assert not side.session.connected
    other = "_worker" if role == KVConnectorRole.SCHEDULER else "_scheduler"
    assert getattr(conn, other) is None  # only the selected role's object exists


@pytest.mark.skipif(
    vllm.__version__ not in ("0.31.0", "0.33.0"), reason="vLLM 0.34 has only the V2 model runner (this run)"
)
def test_rejects_v2_model_runner(model_dir: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    cfg = make_vllm_config(model_dir, socket_path=NO_MANAGER)
    monkeypatch.setenv("VLLM_USE_V2_MODEL_RUNNER", "1")
    with pytest.raises(UnsupportedProfileError, match="VLLM_USE_V2_MODEL_RUNNER=0"):
        _build(cfg)


@pytest.mark.parametrize("algo", ["xxhash", "xxhash_cbor"])
def test_rejects_xxhash_block_hashes_naming_the_reason(
    model_dir: Path, monkeypatch: pytest.MonkeyPatch, algo: str
) -> None:
    # K2: vLLM seeds xxhash with random bytes per process unless PYTHONHASHSEED is set.
    monkeypatch.delenv("PYTHONHASHSEED", raising=False)
    cfg = make_vllm_config(model_dir, socket_path=NO_MANAGER, hash_algo=algo)
    with pytest.raises(UnsupportedProfileError, match=f"prefix-caching-hash-algo {algo}: without PYTHONHASHSEED"):
        _build(cfg)
    # With a fixed seed the chain is reproducible, but 16-byte non-cryptographic digests
    # are still not keys the Manager takes.
    monkeypatch.setenv("PYTHONHASHSEED", "0")
    cfg = make_vllm_config(model_dir, socket_path=NO_MANAGER, hash_algo=algo)
    with pytest.raises(UnsupportedProfileError, match="not collision resistant"):
        _build(cfg)


def test_rejects_more_than_one_kv_cache_group(model_dir: Path) -> None:
    cfg = make_vllm_config(model_dir, socket_path=NO_MANAGER)
    full = FullAttentionSpec(block_size=BLOCK, num_kv_heads=2, head_size=8, dtype=torch.float16)
    swa = SlidingWindowSpec(block_size=BLOCK, num_kv_heads=2, head_size=8, dtype=torch.float16, sliding_window=64)
    kc = KVCacheConfig(
        num_blocks=64,
        kv_cache_tensors=[],
        kv_cache_groups=[KVCacheGroupSpec([LAYERS[0]], full), KVCacheGroupSpec([LAYERS[1]], swa)],
    )
    with pytest.raises(UnsupportedProfileError, match="exactly one attention KV-cache group"):
        _build(cfg, kc)


def test_rejects_non_attention_group(model_dir: Path) -> None:
    cfg = make_vllm_config(model_dir, socket_path=NO_MANAGER)
    swa = SlidingWindowSpec(block_size=BLOCK, num_kv_heads=2, head_size=8, dtype=torch.float16, sliding_window=64)
    kc = KVCacheConfig(num_blocks=64, kv_cache_tensors=[], kv_cache_groups=[KVCacheGroupSpec(list(LAYERS), swa)])
    with pytest.raises(UnsupportedProfileError, match="full-attention"):
        _build(cfg, kc)


def test_rejects_speculative_decoding(model_dir: Path) -> None:
    cfg = make_vllm_config(model_dir, socket_path=NO_MANAGER)
    cfg.speculative_config = SpeculativeConfig(
        method="ngram", num_speculative_tokens=2, prompt_lookup_max=3, prompt_lookup_min=1
    )
    with pytest.raises(UnsupportedProfileError, match="--speculative-config"):
        _build(cfg)


def test_rejects_tensor_parallel_without_query_control(model_dir: Path) -> None:
    cfg = make_vllm_config(model_dir, socket_path=NO_MANAGER)
    cfg.parallel_config.tensor_parallel_size = 2
    with pytest.raises(UnsupportedProfileError, match=r"tensor_parallel_size=2.*orbitkv.query_control=true"):
        _build(cfg)


QC = {"orbitkv.query_control": True}


def test_tensor_parallel_with_query_control_constructs_the_scheduler_without_connecting(model_dir: Path) -> None:
    cfg = make_vllm_config(model_dir, socket_path=NO_MANAGER, extra=QC)
    cfg.parallel_config.tensor_parallel_size = 4
    side = _build(cfg).scheduler_side
    assert not side.session.connected and side.session.shards == 4


def test_tensor_parallel_worker_needs_the_tp_group_for_its_shard(model_dir: Path) -> None:
    cfg = make_vllm_config(model_dir, socket_path=NO_MANAGER, extra=QC)
    cfg.parallel_config.tensor_parallel_size = 2
    with pytest.raises(RuntimeError, match="TP group is not initialised"):
        _build(cfg, role=KVConnectorRole.WORKER)


@pytest.mark.parametrize(
    "field", ["pipeline_parallel_size", "decode_context_parallel_size", "prefill_context_parallel_size"]
)
def test_rejects_pipeline_and_context_parallelism_even_with_query_control(model_dir: Path, field: str) -> None:
    cfg = make_vllm_config(model_dir, socket_path=NO_MANAGER, extra=QC)
    setattr(cfg.parallel_config, field, 2)
    with pytest.raises(UnsupportedProfileError, match=f"{field}=2"):
        _build(cfg)


def test_rejects_tensor_parallel_across_hosts(model_dir: Path) -> None:
    cfg = make_vllm_config(model_dir, socket_path=NO_MANAGER, extra=QC)
    cfg.parallel_config.tensor_parallel_size = 2
    cfg.parallel_config.nnodes = 2
    with pytest.raises(UnsupportedProfileError, match=r"one host only; nnodes=2 \(--nnodes\)"):
        _build(cfg)


def test_rejects_static_lora_without_enable_lora(model_dir: Path, tmp_path: Path) -> None:
    from vllm_harness import write_peft_adapter

    adapter = write_peft_adapter(tmp_path / "adapter", b"w")
    cfg = make_vllm_config(
        model_dir, socket_path=NO_MANAGER, extra={"orbitkv.static_lora_adapters": {"a": str(adapter)}}
    )
    with pytest.raises(UnsupportedProfileError, match="--enable-lora"):
        _build(cfg)


def test_native_copy_path_rejects_non_cpu_pages_naming_the_setting(model_dir: Path) -> None:
    # Device type cpu + orbitkv.copy_engine=auto: the native client copies, CPU pages only.
    conn = _build(make_vllm_config(model_dir, socket_path=NO_MANAGER), role=KVConnectorRole.WORKER)
    assert not conn.kvcopy
    fake = {name: torch.empty((64, 2, 16, 16), dtype=torch.float16, device="meta") for name in LAYERS}
    with pytest.raises(ValueError, match=r"lives on meta.*orbitkv\.copy_engine='torch'"):
        conn.register_kv_caches(fake)


def test_required_layout_is_configurable(model_dir: Path) -> None:
    from orbitkv.vllm import OrbitKVConnector

    assert OrbitKVConnector.get_required_kvcache_layout(make_vllm_config(model_dir)) is None
    cfg = make_vllm_config(model_dir, extra={"orbitkv.kv_cache_layout": "BLHNC"})
    assert OrbitKVConnector.get_required_kvcache_layout(cfg) == "BLHNC"


def test_requests_that_could_alias_bypass_orbitkv(tmp_path: Path) -> None:
    """K3/K4: such requests are served by the engine without OrbitKV (no lookup, no save)."""
    from vllm import SamplingParams
    from vllm.lora.request import LoRARequest
    from vllm.utils.hashing import sha256_cbor
    from vllm.v1.core.kv_cache_utils import get_request_block_hasher
    from vllm.v1.request import Request
    from vllm_harness import make_request, write_peft_adapter

    from orbitkv.vllm.config import parse_settings
    from orbitkv.vllm.scheduler import bypass_reason

    declared = write_peft_adapter(tmp_path / "sql", b"w")
    copy = write_peft_adapter(tmp_path / "copy-of-sql", b"w")
    settings = parse_settings({"orbitkv.static_lora_adapters": {"sql": str(declared)}})
    prompt = list(range(3, 40))
    assert bypass_reason(make_request(prompt), settings) is None
    assert bypass_reason(make_request(prompt, lora_request=LoRARequest("sql", 1, str(declared))), settings) is None
    reason = bypass_reason(make_request(prompt, lora_request=LoRARequest("other", 2, str(declared))), settings)
    assert reason is not None and "undeclared" in reason
    reason = bypass_reason(make_request(prompt, lora_request=LoRARequest("sql", 1, str(copy))), settings)
    assert reason is not None and "path differs" in reason
    inplace = LoRARequest("sql", 1, str(declared), load_inplace=True)
    reason = bypass_reason(make_request(prompt, lora_request=inplace), settings)
    assert reason is not None and "in-place" in reason
    resumable = Request(
        request_id="session-1",
        prompt_token_ids=prompt,
        sampling_params=SamplingParams(max_tokens=2),
        pooling_params=None,
        block_hasher=get_request_block_hasher(BLOCK, sha256_cbor),
        resumable=True,
    )
    reason = bypass_reason(resumable, settings)
    assert reason is not None and "resumable" in reason


def test_metadata_crosses_process_boundaries_by_pickle() -> None:
    """Scheduler->worker and worker->scheduler payloads travel over vLLM's executor IPC."""
    import pickle

    from orbitkv.vllm.metadata import LoadSpec, OrbitKVConnectorMetadata, SaveSpec
    from orbitkv.vllm.worker_meta import OrbitKVWorkerMetadata

    meta = OrbitKVConnectorMetadata(
        loads=[LoadSpec("r1", b"salt", (b"\x01" * 32,), (7,))],
        saves=[SaveSpec("r2", b"", (b"\x02" * 32, b"\x03" * 32), (1, 2))],
        epoch=3,
        save_batch=9,
    )
    assert pickle.loads(pickle.dumps(meta)) == meta
    wm = OrbitKVWorkerMetadata(saved_batches={9}, stored_blocks=2)
    merged = wm.aggregate(OrbitKVWorkerMetadata(saved_batches={10}, refused_blocks=1))
    assert pickle.loads(pickle.dumps(merged)) == OrbitKVWorkerMetadata({9, 10}, 2, 1, 0)
