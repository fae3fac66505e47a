"""One engine process with vLLM's default flags (run by test_defaults.py, twice).

The VllmConfig comes from vLLM's own `EngineArgs` given only the model and the
`--kv-transfer-config` JSON, as `vllm serve <model> --kv-transfer-config '{...}'`
builds it (VLLM_USE_V2_MODEL_RUNNER=0 comes from vllm_env). Requests are hashed as
vLLM's EngineCore hashes them: `get_hash_fn_by_name(prefix_caching_hash_algo)`,
`init_none_hash`, `get_request_block_hasher`. The released Scheduler and a worker-role
connector over real CPU pages run the prompt; the process prints one JSON line.

    python default_flags_engine.py MODEL_DIR SOCKET save|hit PROMPT_SEED
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import vllm_env  # noqa: F401 - environment and the working-tree adapter first
import vllm_harness
from vllm.engine.arg_utils import EngineArgs
from vllm.utils.hashing import get_hash_fn_by_name
from vllm.v1.core.kv_cache_utils import init_none_hash
from vllm.v1.request import RequestStatus
from vllm_harness import Engine, make_request, prompt_tokens


def main() -> None:
    model_dir, socket_path, mode, seed = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4])
    kv_transfer_config = {
        "kv_connector": "OrbitKVConnector",
        "kv_connector_module_path": "orbitkv.vllm",
        "kv_role": "kv_both",
        "kv_connector_extra_config": {"orbitkv.socket_path": socket_path},
    }
    args = EngineArgs(model=model_dir, skip_tokenizer_init=True, kv_transfer_config=kv_transfer_config)  # type: ignore[arg-type]
    cfg = args.create_engine_config()
    cache = cfg.cache_config
    # The platform's default block size (128 on CPU, 16 on CUDA): the emulated engine
    # pages, hashes and checks blocks of that size.
    vllm_harness.BLOCK = cache.block_size
    if cfg.cache_config.kv_cache_layout is None:
        cfg.cache_config.kv_cache_layout = "LBNHC"  # what vLLM resolves when none is requested
    hash_fn = get_hash_fn_by_name(cache.prefix_caching_hash_algo)
    init_none_hash(hash_fn)  # as vLLM's EngineCore does before hashing requests
    engine = Engine.build(cfg)
    block = cache.block_size
    prompt = prompt_tokens(3 * block + 4, seed=seed)  # 3 full blocks + 4 tokens
    r = make_request(prompt, hash_fn=hash_fn)
    engine.scheduler.add_request(r)
    full = len(prompt) // block

    def prefilled() -> bool:
        return r.status == RequestStatus.RUNNING and r.num_computed_tokens >= len(prompt)

    engine.run_until(prefilled, what="prefill")
    engine.check_pages(r, len(prompt))  # byte-exact, whether computed or loaded
    engine.run_to_completion([r.request_id])
    engine.run_until_drained()
    side = engine.connector.scheduler_side
    out = {
        "mode": mode,
        "hash_algo": cache.prefix_caching_hash_algo,
        "block_size": block,
        "kv_load_failure_policy": cfg.kv_transfer_config.kv_load_failure_policy if cfg.kv_transfer_config else None,
        "recompute_kv_load_failures": engine.scheduler.recompute_kv_load_failures,
        "block_hashes": [bytes(h).hex() for h in r.block_hashes[:full]],
        "fingerprint": engine.connector.fingerprint.hex(),
        "counters": dict(side.counters),
        "failed": sorted(engine.failed),
        "finished": sorted(engine.finished),
    }
    engine.shutdown()
    print("RESULT " + json.dumps(out))


if __name__ == "__main__":
    main()
