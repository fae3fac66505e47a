"""A CPU engine loop around the released vLLM Scheduler (0.31.0 / 0.33.0 / 0.34.0) and OrbitKV's worker role.

`Engine` builds the real `Scheduler` (OrbitKV as its connector, constructed by vLLM's
own factory) plus a worker-role `OrbitKVConnector` with real CPU KV pages allocated by
vLLM's own `allocate_kv_cache` in the requested `KVCacheLayout`. `Engine.step()` runs
one scheduler step and then the worker-side connector calls in the order of
`KVConnectorModelRunnerMixin._get_kv_connector_output` (bind, start_load_kv,
"forward", wait_for_save, get_transfer_results, get_block_ids_with_load_errors,
build_connector_worker_meta, clear). The "forward" writes, for every scheduled token
position, KV bytes that are a pure function of the token prefix, layer, head and
content index - so a restored page can be compared byte for byte with what the model
would have computed.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

import numpy as np
import torch
from engine_manager import stop_all_threads  # noqa: F401 - the suite's tests import it from here
from vllm import SamplingParams
from vllm.config import (
    CacheConfig,
    DeviceConfig,
    KVTransferConfig,
    LoRAConfig,
    ModelConfig,
    SchedulerConfig,
    VllmConfig,
)
from vllm.distributed.kv_transfer.kv_connector.factory import KVConnectorFactory
from vllm.distributed.kv_transfer.kv_connector.v1.base import KVConnectorRole
from vllm.lora.request import LoRARequest
from vllm.utils.hashing import sha256_cbor
from vllm.v1.core.kv_cache_utils import get_request_block_hasher, init_none_hash
from vllm.v1.core.sched.output import SchedulerOutput
from vllm.v1.core.sched.scheduler import Scheduler
from vllm.v1.engine import FinishReason
from vllm.v1.kv_cache_interface import (
    FullAttentionSpec,
    KVCacheConfig,
    KVCacheGroupSpec,
    KVCacheTensor,
    compute_layout_strides,
)
from vllm.v1.kv_cache_layout import KVCacheLayout
from vllm.v1.outputs import KVConnectorOutput, ModelRunnerOutput
from vllm.v1.request import Request, RequestStatus
from vllm.v1.structured_output import StructuredOutputManager
from vllm.v1.worker.utils import allocate_kv_cache

BLOCK = 16
NUM_KV_HEADS = 2
HEAD_SIZE = 8
LAYERS = ["model.layers.0.self_attn.attn", "model.layers.1.self_attn.attn"]
EOS = 2

init_none_hash(sha256_cbor)
# vLLM 0.34 dropped `ModelRunnerOutput.req_id_to_index` (0.31 / 0.33 require it).
_RUNNER_OUTPUT_HAS_INDEX = "req_id_to_index" in {f.name for f in dataclasses.fields(ModelRunnerOutput)}


def kv_connector_output(w: Any, so: SchedulerOutput) -> KVConnectorOutput:
    """What the V1 runner reports after a step, in the release's call order:
    transfer results, load errors, connector stats, worker metadata, then unbind."""
    results = w.get_transfer_results(so.finished_req_ids)
    out = KVConnectorOutput(
        finished_sending=results.finished_sending,
        finished_recving=results.finished_recving,
        failed_recving=results.failed_recving,
        invalid_block_ids=w.get_block_ids_with_load_errors(),
        kv_connector_stats=w.get_kv_connector_stats(),
        kv_connector_worker_meta=w.build_connector_worker_meta(),
    )
    w.clear_connector_metadata()
    return out


_T = TypeVar("_T")


def run_worker_step(w: Any, so: SchedulerOutput, forward: Callable[[], _T]) -> tuple[_T, KVConnectorOutput]:
    """The worker-role connector's side of one step around `forward` (the model), in the
    V1 runner's order: bind the metadata, start loads (before the forward when they are
    synchronous), wait for saves; returns the forward's result and the step's output."""
    meta = so.kv_connector_metadata
    w.handle_preemptions(meta)
    w.bind_connector_metadata(meta)
    if so.has_sync_kv_loads:
        w.start_load_kv(None)
    result = forward()
    if not so.has_sync_kv_loads:
        w.start_load_kv(None)
    w.wait_for_save()
    return result, kv_connector_output(w, so)


def runner_output(req_ids: list[str], sampled: list[list[int]], kv_connector_output: Any = None) -> ModelRunnerOutput:
    """The `ModelRunnerOutput` a model runner would return for one step."""
    index = {"req_id_to_index": {r: i for i, r in enumerate(req_ids)}} if _RUNNER_OUTPUT_HAS_INDEX else {}
    return ModelRunnerOutput(
        req_ids=req_ids,
        **index,
        sampled_token_ids=sampled,
        logprobs=None,
        prompt_logprobs_dict={},
        pooler_output=None,
        kv_connector_output=kv_connector_output,
    )


def write_tiny_model(path: Path) -> Path:
    """A local model directory holding only a tiny Llama `config.json` (no weights)."""
    path.mkdir(parents=True, exist_ok=True)
    cfg = {
        "architectures": ["LlamaForCausalLM"],
        "model_type": "llama",
        "hidden_size": NUM_KV_HEADS * HEAD_SIZE * 2,
        "num_attention_heads": NUM_KV_HEADS * 2,
        "num_key_value_heads": NUM_KV_HEADS,
        "head_dim": HEAD_SIZE,
        "num_hidden_layers": len(LAYERS),
        "intermediate_size": 64,
        "vocab_size": 1024,
        "max_position_embeddings": 4096,
        "torch_dtype": "float16",
        "bos_token_id": 1,
        "eos_token_id": EOS,
    }
    (path / "config.json").write_text(json.dumps(cfg))
    return path


def write_peft_adapter(path: Path, weights: bytes) -> Path:
    path.mkdir(parents=True, exist_ok=True)
    (path / "adapter_config.json").write_text(
        json.dumps({"peft_type": "LORA", "r": 8, "lora_alpha": 16, "target_modules": ["q_proj", "v_proj"]})
    )
    (path / "adapter_model.safetensors").write_bytes(weights)
    return path


def make_vllm_config(
    model_dir: Path,
    *,
    socket_path: str | None = None,
    extra: dict[str, Any] | None = None,
    layout: str = "LBNHC",
    hash_algo: str = "sha256_cbor",
    kv_connector: str | None = "OrbitKVConnector",
    module_path: str | None = "orbitkv.vllm",
    failure_policy: str = "fail",
    lora: bool = False,
    max_num_batched_tokens: int = 1024,
    max_num_seqs: int = 16,
    scheduler: dict[str, Any] | None = None,
) -> VllmConfig:
    """`scheduler`: further `SchedulerConfig` fields (e.g. vLLM 0.34's
    `max_num_inflight_kv_loads`)."""
    model_config = ModelConfig(model=str(model_dir), skip_tokenizer_init=True, dtype="float16", seed=0)
    scheduler_config = SchedulerConfig(
        max_num_seqs=max_num_seqs,
        max_num_batched_tokens=max_num_batched_tokens,
        max_model_len=2048,
        enable_chunked_prefill=True,
        is_encoder_decoder=False,
        **(scheduler or {}),
    )
    cache_config = CacheConfig(block_size=BLOCK, enable_prefix_caching=True, prefix_caching_hash_algo=hash_algo)
    cache_config.kv_cache_layout = layout  # resolved before connectors are built
    extra_config = dict(extra or {})
    if socket_path is not None:
        extra_config.setdefault("orbitkv.socket_path", socket_path)
    kv_transfer_config = (
        KVTransferConfig(
            kv_connector=kv_connector,
            kv_connector_module_path=module_path,
            kv_role="kv_both",
            kv_connector_extra_config=extra_config,
            kv_load_failure_policy=failure_policy,
        )
        if kv_connector is not None
        else None
    )
    return VllmConfig(
        model_config=model_config,
        scheduler_config=scheduler_config,
        cache_config=cache_config,
        kv_transfer_config=kv_transfer_config,
        device_config=DeviceConfig("cpu"),
        lora_config=LoRAConfig(max_lora_rank=8, max_loras=2) if lora else None,
    )


def make_kv_cache_config(
    num_blocks: int,
    layout: str,
    *,
    num_kv_heads: int = NUM_KV_HEADS,
    head_size: int = HEAD_SIZE,
    layers: list[str] | None = None,
) -> KVCacheConfig:
    layers = list(layers or LAYERS)
    spec = FullAttentionSpec(block_size=BLOCK, num_kv_heads=num_kv_heads, head_size=head_size, dtype=torch.float16)
    page = spec.page_size_bytes
    lay = KVCacheLayout[layout]
    # Mirror vllm.v1.core.kv_cache_utils (single group): strides from the layout.
    layer_stride, block_stride, _, _, _ = compute_layout_strides(
        spec,
        num_blocks,
        len(layers),
        lay,
        fixed_strides=(None, page * len(layers) if lay.is_block_outermost else None, None, None, None),
    )
    tensor = KVCacheTensor(
        size=page * num_blocks * len(layers),
        layers=layers,
        layer_stride=layer_stride,
        block_stride=block_stride,
    )
    return KVCacheConfig(
        num_blocks=num_blocks,
        kv_cache_tensors=[tensor],
        kv_cache_groups=[KVCacheGroupSpec(layers, spec)],
        kv_cache_layout=layout,
    )


def kv_bytes(prefix: Iterable[int], layer: int) -> bytes:
    """KV content (all heads, K and V) of the last token of `prefix` in `layer`."""
    n = NUM_KV_HEADS * 2 * HEAD_SIZE * 2  # heads * (K+V) * head_size * fp16 bytes
    seed = hashlib.sha256(repr((tuple(prefix), layer)).encode()).digest()
    out = bytearray()
    counter = 0
    while len(out) < n:
        out += hashlib.sha256(seed + counter.to_bytes(4, "little")).digest()
        counter += 1
    return bytes(out[:n])


_req_counter = iter(range(1, 1 << 30))


def make_request(
    prompt: list[int],
    *,
    max_tokens: int = 4,
    cache_salt: str | None = None,
    lora_request: LoRARequest | None = None,
    req_id: str | None = None,
    hash_fn: Any = sha256_cbor,
    kv_transfer_params: dict[str, Any] | None = None,
) -> Request:
    params = SamplingParams(max_tokens=max_tokens, ignore_eos=True)
    params.update_from_generation_config({}, EOS)
    if kv_transfer_params is not None:
        # Where vLLM's API servers put a request's `kv_transfer_params`.
        params.extra_args = {**(params.extra_args or {}), "kv_transfer_params": kv_transfer_params}
    return Request(
        request_id=req_id or f"req-{next(_req_counter)}",
        prompt_token_ids=list(prompt),
        sampling_params=params,
        pooling_params=None,
        mm_features=None,
        lora_request=lora_request,
        cache_salt=cache_salt,
        block_hasher=get_request_block_hasher(BLOCK, hash_fn),
    )


def prompt_tokens(n: int, seed: int) -> list[int]:
    rng = np.random.default_rng(seed)
    return [int(x) for x in rng.integers(3, 1000, size=n)]


def make_scheduler(vllm_config: VllmConfig, kv_cache_config: KVCacheConfig) -> Scheduler:
    return Scheduler(
        vllm_config=vllm_config,
        kv_cache_config=kv_cache_config,
        log_stats=True,
        structured_output_manager=StructuredOutputManager(vllm_config),
        block_size=BLOCK,
    )


def scheduled_requests(scheduler: Scheduler, so: SchedulerOutput) -> list[tuple[Request, int, int, list[int]]]:
    """(request, start, end, block ids) for each request `so` schedules: positions
    [start, end) are computed by this step's forward."""
    out = []
    for req_id, n in so.num_scheduled_tokens.items():
        request = scheduler.requests[req_id]
        end = request.num_computed_tokens  # already advanced by schedule()
        (block_ids,) = scheduler.kv_cache_manager.get_block_ids(req_id)
        out.append((request, end - n, end, list(block_ids)))
    return out


def sampled_tokens(request: Request, end: int) -> list[int]:
    """A token is sampled once the whole prompt (and prior outputs) is computed."""
    return [5 + len(request.output_token_ids) % 7] if end >= request.num_tokens else []


def record_finished(engine_outputs: Any, finished: set[str], failed: set[str]) -> None:
    """Add the requests `engine_outputs` finish to `finished` (and those that failed to `failed`)."""
    for eco in engine_outputs.values():
        for o in eco.outputs:
            if o.finish_reason is not None:
                finished.add(o.request_id)
                if o.finish_reason == FinishReason.ERROR:
                    failed.add(o.request_id)


def per_layer_storage_views(kv_caches: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """The same views, each layer over a storage of its own holding only its pages, at the
    addresses they had: what vLLM 0.34's extensible KV cache registers on CUDA (one virtual
    reservation; each layer's committed segment a separate storage, `committed_views`).
    Under block-outermost layouts the layers' regions interleave, so these storages overlap
    (which `block_geometry` refuses)."""
    flat = next(iter(kv_caches.values())).untyped_storage()
    buffer = torch.empty(0, dtype=torch.uint8).set_(flat, 0, (flat.nbytes(),), (1,)).numpy()
    out = {}
    for name, t in kv_caches.items():
        item = t.element_size()
        start = t.storage_offset() * item
        reach = item + sum((d - 1) * s * item for d, s in zip(t.shape, t.stride(), strict=True))
        segment = torch.from_numpy(buffer[start : start + reach]).view(t.dtype)  # its own storage
        out[name] = segment.as_strided(t.shape, t.stride(), 0)
    return out


@dataclass
class StepResult:
    scheduler_output: SchedulerOutput
    kv_output: KVConnectorOutput
    engine_outputs: Any


@dataclass
class Engine:
    vllm_config: VllmConfig
    kv_cache_config: KVCacheConfig
    scheduler: Scheduler
    worker: Any  # worker-role OrbitKVConnector (or MultiConnector)
    kv_caches: dict[str, torch.Tensor]
    finished: set[str] = field(default_factory=set)
    failed: set[str] = field(default_factory=set)

    @classmethod
    def build(cls, vllm_config: VllmConfig, num_blocks: int = 128, *, per_layer_storages: bool = False) -> Engine:
        layout = vllm_config.cache_config.kv_cache_layout
        assert layout is not None
        kv_cache_config = make_kv_cache_config(num_blocks, layout)
        vllm_config.cache_config.num_gpu_blocks = num_blocks
        scheduler = make_scheduler(vllm_config, kv_cache_config)
        if vllm_config.kv_transfer_config is None:  # no connector: the bare Scheduler
            return cls(vllm_config, kv_cache_config, scheduler, None, {})
        worker = KVConnectorFactory.create_connector(vllm_config, KVConnectorRole.WORKER, kv_cache_config)
        kv_caches = allocate_kv_cache(kv_cache_config, torch.device("cpu"), KVCacheLayout[layout])
        if per_layer_storages:
            kv_caches = per_layer_storage_views(kv_caches)
        worker.register_kv_caches(kv_caches)
        return cls(vllm_config, kv_cache_config, scheduler, worker, kv_caches)

    @property
    def connector(self) -> Any:
        return self.scheduler.connector

    def submit(self, prompt: list[int], **kw: Any) -> Request:
        """Add a new request for `prompt` (`make_request`'s keywords) to the scheduler."""
        r = make_request(prompt, **kw)
        self.scheduler.add_request(r)
        return r

    # ---- the emulated model ----------------------------------------------------------

    def _slot(self, layer: str, block_id: int, offset: int) -> torch.Tensor:
        """Bytes of one token slot (all heads) of `layer`, logical [H, C] order."""
        view = self.kv_caches[layer].view(torch.uint8)  # [B, H, N, C_bytes]
        return view[block_id, :, offset, :]

    def write_token(self, request: Request, pos: int, block_ids: list[int]) -> None:
        prefix = request.all_token_ids[: pos + 1]
        block_id = block_ids[pos // BLOCK]
        for li, layer in enumerate(LAYERS):
            data = torch.frombuffer(bytearray(kv_bytes(prefix, li)), dtype=torch.uint8)
            self._slot(layer, block_id, pos % BLOCK).copy_(data.view(NUM_KV_HEADS, -1))

    def check_pages(self, request: Request, num_tokens: int) -> None:
        """Assert positions [0, num_tokens) of `request` hold the model's KV bytes."""
        (block_ids,) = self.scheduler.kv_cache_manager.get_block_ids(request.request_id)
        for pos in range(num_tokens):
            prefix = request.all_token_ids[: pos + 1]
            for li, layer in enumerate(LAYERS):
                got = bytes(self._slot(layer, block_ids[pos // BLOCK], pos % BLOCK).contiguous().numpy().tobytes())
                want = kv_bytes(prefix, li)
                assert got == want, f"{request.request_id}: KV mismatch at position {pos}, layer {layer}"

    def _forward(self, so: SchedulerOutput) -> ModelRunnerOutput:
        req_ids: list[str] = []
        sampled: list[list[int]] = []
        for request, start, end, block_ids in scheduled_requests(self.scheduler, so):
            for pos in range(start, end):
                self.write_token(request, pos, block_ids)
            req_ids.append(request.request_id)
            sampled.append(sampled_tokens(request, end))
        return runner_output(req_ids, sampled)

    # ---- one engine step ------------------------------------------------------------

    def step(self) -> StepResult:
        return self.execute(self.scheduler.schedule())

    def execute(self, so: SchedulerOutput) -> StepResult:
        """Run the worker side of one step for `so`, then feed the scheduler."""
        assert so.kv_connector_metadata is not None
        out, kv_output = run_worker_step(self.worker, so, lambda: self._forward(so))
        out.kv_connector_output = kv_output
        engine_outputs = self.scheduler.update_from_output(so, out)
        record_finished(engine_outputs, self.finished, self.failed)
        return StepResult(so, kv_output, engine_outputs)

    def schedule_admitting(self, request: Request, max_steps: int = 200) -> SchedulerOutput:
        """`schedule()` until the step in which `request` leaves WAITING (or PREEMPTED):
        admitted to run, or parked for its load; return that step's output unexecuted. The
        connector answers a probable hit from a background lookup: until it lands,
        `get_num_new_matched_tokens` returns None and vLLM skips the request, so the
        steps before are executed (they schedule nothing for it)."""
        for _ in range(max_steps):
            so = self.scheduler.schedule()
            if request.status not in (RequestStatus.WAITING, RequestStatus.PREEMPTED):
                return so
            self.execute(so)
            if not so.num_scheduled_tokens:
                time.sleep(0.002)  # let the background lookup land
        raise AssertionError(f"{request.request_id} not admitted after {max_steps} steps")

    def run_until(self, pred: Any, max_steps: int = 200, what: str = "condition") -> list[StepResult]:
        steps: list[StepResult] = []
        for _ in range(max_steps):
            if pred():
                return steps
            steps.append(self.step())
            if not steps[-1].scheduler_output.num_scheduled_tokens:
                time.sleep(0.002)  # let background loads progress
        raise AssertionError(f"{what} not reached after {max_steps} steps")

    def run_to_completion(self, req_ids: Iterable[str], max_steps: int = 400) -> list[StepResult]:
        ids = set(req_ids)
        return self.run_until(lambda: ids <= self.finished, max_steps, f"completion of {sorted(ids)}")

    def status(self, req_id: str) -> RequestStatus | None:
        r = self.scheduler.requests.get(req_id)
        return None if r is None else r.status

    def assert_drained(self) -> None:
        """No request, no held block, no tracked OrbitKV owner (leak check)."""
        s = self.scheduler
        assert not s.requests and not s.waiting and not s.running
        assert not s.finished_recving_kv_req_ids and not s._inflight_prefills
        pool = s.kv_cache_manager.block_pool
        assert pool.free_block_queue.num_free_blocks == pool.num_gpu_blocks - 1
        assert all(b.ref_cnt == 0 for b in pool.blocks)
        side = self.connector.scheduler_side
        assert side.tracked_requests == 0 and side.sending_requests == 0

    def run_until_drained(self, max_steps: int = 200) -> list[StepResult]:
        """Step until no request is left, finished ones whose blocks wait for
        finished_sending (asynchronous saves) included."""
        return self.run_until(lambda: not self.scheduler.requests, max_steps, "drain of every request")

    def shutdown(self) -> None:
        self.worker.shutdown()
        if self.scheduler.connector is not None:
            self.scheduler.connector.shutdown()
