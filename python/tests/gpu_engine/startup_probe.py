"""Where does a vLLM engine's start-up spend its time? Builds `LLM(...)` with the
engine core in this process (`VLLM_ENABLE_V1_MULTIPROCESSING=0`) and dumps every
thread's Python stack to STACKS every INTERVAL seconds until the engine is up, then
generates once. For diagnosing a start-up that hangs (vLLM's compile + CUDA-graph mode).

    python startup_probe.py MODEL_DIR STACKS [INTERVAL] [compile|eager] [socket-for-orbitkv]
"""

from __future__ import annotations

import faulthandler
import os
import sys
import time

os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from runner_env import set_runner_env

set_runner_env()  # V1 where the pin has it (0.31.0, 0.33.0)


def main() -> int:
    model, stacks = sys.argv[1], sys.argv[2]
    interval = float(sys.argv[3]) if len(sys.argv) > 3 else 30.0
    mode = sys.argv[4] if len(sys.argv) > 4 else "compile"
    socket = sys.argv[5] if len(sys.argv) > 5 else None
    f = open(stacks, "w")
    faulthandler.dump_traceback_later(interval, repeat=True, file=f)
    from vllm import LLM, SamplingParams
    from vllm.inputs import TokensPrompt

    kw: dict[str, object] = {}
    if socket:
        kw["kv_transfer_config"] = {
            "kv_connector": "OrbitKVConnector",
            "kv_connector_module_path": "orbitkv.vllm",
            "kv_role": "kv_both",
            "kv_connector_extra_config": {"orbitkv.socket_path": socket},
        }
    t = time.perf_counter()
    llm = LLM(
        model=model,
        skip_tokenizer_init=True,
        dtype="bfloat16",
        max_model_len=4096,
        gpu_memory_utilization=0.3,
        enforce_eager=mode == "eager",
        **kw,
    )
    print(f"probe: engine up in {time.perf_counter() - t:.1f} s ({mode})", flush=True)
    faulthandler.cancel_dump_traceback_later()
    t = time.perf_counter()
    out = llm.generate(
        [TokensPrompt(prompt_token_ids=list(range(100, 1100)))],
        SamplingParams(max_tokens=8, temperature=0, detokenize=False),
        use_tqdm=False,
    )
    print(f"probe: generated {list(out[0].outputs[0].token_ids)} in {time.perf_counter() - t:.2f} s", flush=True)
    sys.stdout.flush()
    os._exit(0)


if __name__ == "__main__":
    sys.exit(main())
