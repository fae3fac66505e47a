"""The GPU engine suite's processes: a seeded local model, real Managers, and one
`engine_driver.py` process per role, each a fresh released-vLLM engine.

Roles of one suite run (one vLLM mode):
- `ref`: vLLM alone (no connector). Each prompt cold, then again: the second run is
  vLLM's own prefix-cache hit, the reference every OrbitKV hit is compared with.
- `saver`: vLLM with OrbitKVConnector; computes the prompts cold and saves them.
- `reader*`: fresh vLLM processes with OrbitKVConnector; their hits come from the
  Manager (the prefix is not in their HBM), compared bit for bit with `ref`.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from runner_env import set_runner_env

HERE = Path(__file__).resolve().parent
DRIVER = HERE / "engine_driver.py"


def _default_block_size() -> int:
    """vLLM's default block size on CUDA for the installed release: 64 from 0.34.0, else 16."""
    from importlib.metadata import PackageNotFoundError, version

    try:
        return 64 if version("vllm") == "0.34.0" else 16
    except PackageNotFoundError:
        return 16


BLOCK = _default_block_size()  # the engines run with vLLM's default; each result names it

# Prompts as [seed, length] segments (engine_driver.prompt_tokens).
FULL = [[[100 + i, 1000]] for i in range(3)]  # full hits in a fresh process
PARTIAL_BASE = [[[110 + i, 1000]] for i in range(3)]  # saved whole, read as a prefix
PARTIAL = [[[110 + i, 1000], [210 + i, 240]] for i in range(3)]
LONG = [[[300 + i, 3000]] for i in range(2)]  # abort / Manager killed mid-load
FILLER = [[[400 + i, 1000]] for i in range(8)]  # evicts a small HBM cache
CONCURRENT = [[[500, 512], [600 + j, 64]] for j in range(32)]  # 32 requests, one shared prefix
# 8 decodes of PREEMPT_DECODE tokens in SMALL_HBM_BLOCKS: vLLM admits 5, and their decodes
# need blocks the cache lacks, so it preempts. 16-token blocks (0.31.0, 0.33.0; run on the
# H200): 900-token prompts take 57 blocks and grow to 60 in 300 blocks. 64-token blocks
# (0.34.0): a 900-token prompt's 48 decodes stay in its 15th block and nothing is preempted
# (seen on the H200), so 1,000-token prompts (16 blocks, growing to 17) in 83 blocks
# (5 x 16 + the null block + 2: not yet run on a GPU).
PREEMPT_LEN, SMALL_HBM_BLOCKS = (900, 300) if BLOCK == 16 else (1000, 83)
PREEMPT_DECODE = 48
PREEMPT = [[[700 + i, PREEMPT_LEN]] for i in range(8)]


TP_MODES = ("tp2", "tp4")  # vLLM's default compile + CUDA graphs, one GPU per rank


def tp_of(mode: str) -> int:
    """The tensor-parallel size of a mode (1 unless `tpN`)."""
    return int(mode[2:]) if mode in TP_MODES else 1


def hit_tokens(segments: list[list[int]], cached_prefix_tokens: int | None = None) -> int:
    """Tokens a prefix hit covers: whole blocks, never the prompt's last token."""
    n = sum(length for _, length in segments)
    full = (n - 1) // BLOCK * BLOCK
    return full if cached_prefix_tokens is None else min(full, cached_prefix_tokens // BLOCK * BLOCK)


def build_model(path: Path) -> Path:
    """A small Llama with seeded random weights, written once (no download)."""
    if (path / "config.json").exists() and any(path.glob("*.safetensors")):
        return path
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    cfg = LlamaConfig(
        vocab_size=32000,
        hidden_size=512,
        intermediate_size=1408,
        num_hidden_layers=4,
        num_attention_heads=8,
        num_key_value_heads=2,
        max_position_embeddings=8192,
        torch_dtype="bfloat16",
    )
    torch.manual_seed(0)
    tmp = path.with_name(path.name + ".tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    LlamaForCausalLM(cfg).to(torch.bfloat16).save_pretrained(tmp)
    tmp.rename(path)
    return path


def stop_process(proc: subprocess.Popen[bytes], sig: int, timeout: float = 60.0) -> None:
    """`sig`, then SIGKILL if the process is still there after `timeout` s."""
    if proc.poll() is None:
        proc.send_signal(sig)
        try:
            proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


class Manager:
    """`python -m orbitkv serve` on a private socket in a short directory."""

    def __init__(self, log: Path, *flags: str) -> None:
        from orbitkv.launch import serve_command

        self.dir = Path(tempfile.mkdtemp(prefix="okv-gpu-"))
        os.chmod(self.dir, 0o700)
        self.socket = str(self.dir / "m.sock")
        self._log = open(log, "ab")
        self.proc = subprocess.Popen(serve_command(self.socket, *flags), stdout=self._log, stderr=subprocess.STDOUT)
        deadline = time.monotonic() + 120  # a large arena is populated at start
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"Manager exited with {self.proc.returncode}; see {log}")
            if self.ready():
                return
            time.sleep(0.1)
        self.stop()
        raise RuntimeError(f"Manager did not come up in 120 s; see {log}")

    def ready(self) -> bool:
        from orbitkv import _native

        try:
            with _native.Client(self.socket, timeout_ms=2000, map_arena=False) as c:
                c.stats()
            return True
        except Exception:
            return False

    def stats(self) -> dict[str, Any]:
        from orbitkv import _native

        with _native.Client(self.socket, timeout_ms=5000, map_arena=False) as c:
            return dict(c.stats())

    def settled_stats(self, timeout: float = 10.0) -> dict[str, Any]:
        """The stats once no lease or save is live (the engines' processes have exited and
        the Manager dropped what their sessions held), or as they are at the deadline."""
        deadline = time.monotonic() + timeout
        st = self.stats()
        while (st.get("live_leases") or st.get("live_saves")) and time.monotonic() < deadline:
            time.sleep(0.1)
            st = self.stats()
        return st

    def stop(self) -> int | None:
        stop_process(self.proc, signal.SIGTERM)
        self._log.close()
        shutil.rmtree(self.dir, ignore_errors=True)
        return self.proc.returncode


def connector_config(socket: str, **extra: Any) -> dict[str, Any]:
    return {
        "kv_connector": "OrbitKVConnector",
        "kv_connector_module_path": "orbitkv.vllm",
        "kv_role": "kv_both",
        "kv_connector_extra_config": {"orbitkv.socket_path": socket, **extra},
    }


def engine_env(extra: dict[str, str] | None = None) -> dict[str, str]:
    env = dict(os.environ)
    set_runner_env(env)  # V1 where the pin has it (0.31.0, 0.33.0)
    env.setdefault("VLLM_USE_FLASHINFER_SAMPLER", "0")  # flashinfer is optional; not needed here
    env.update(extra or {})
    return env


def run_driver(
    plan: dict[str, Any], out_dir: Path, name: str, env: dict[str, str] | None = None, timeout: float = 600.0
) -> dict[str, Any]:
    """One engine process; its JSON result (raises with the log's tail if it failed)."""
    plan = dict(plan, out=str(out_dir / f"{name}.json"))
    plan_path = out_dir / f"{name}.plan.json"
    plan_path.write_text(json.dumps(plan, indent=1))
    log = out_dir / f"{name}.log"
    t = time.monotonic()
    with open(log, "wb") as f:
        proc = subprocess.run(
            [sys.executable, str(DRIVER), str(plan_path)],
            stdout=f,
            stderr=subprocess.STDOUT,
            env=engine_env(env),
            timeout=timeout,
            check=False,
        )
    res_path = Path(plan["out"])
    result = json.loads(res_path.read_text()) if res_path.exists() else {"ok": False, "error": "no result"}
    result["wall_s"] = time.monotonic() - t
    if proc.returncode != 0 or not result.get("ok"):
        tail = log.read_text(errors="replace")[-6000:]
        raise RuntimeError(f"engine role {name} failed (rc {proc.returncode}): {result.get('error')}\n{tail}")
    return result


def gen(tag: str, prompts: list[Any], **kw: Any) -> dict[str, Any]:
    return {"op": "generate", "tag": tag, "prompts": prompts, **kw}


@dataclass
class SuiteRun:
    """Every role's result of one mode, by role name, and by phase tag inside."""

    mode: str
    out_dir: Path
    model: Path
    roles: dict[str, dict[str, Any]] = field(default_factory=dict)
    errors: dict[str, str] = field(default_factory=dict)

    def phase(self, role: str, tag: str) -> dict[str, Any]:
        if role in self.errors:
            raise AssertionError(f"role {role} of mode {self.mode} failed: {self.errors[role]}")
        for ph in self.roles[role]["phases"]:
            if ph["tag"] == tag:
                return ph  # type: ignore[no-any-return]
        raise KeyError(f"{role} has no phase {tag}")

    def outputs(self, role: str, tag: str) -> list[dict[str, Any]]:
        return self.phase(role, tag)["outputs"]  # type: ignore[no-any-return]


def llm_kwargs(mode: str, **extra: Any) -> dict[str, Any]:
    kw: dict[str, Any] = {
        "dtype": "bfloat16",
        "max_model_len": 4096,
        "gpu_memory_utilization": 0.3,
        "seed": 0,
        "enable_prefix_caching": True,
        "enforce_eager": mode in ("eager", "batch_invariant"),
        "max_num_batched_tokens": 8192,  # explicit: `LLM` and `vllm serve` default differently
        "max_num_seqs": 256,
    }
    if tp_of(mode) > 1:
        kw["tensor_parallel_size"] = tp_of(mode)
    kw.update(extra)
    return kw


@dataclass
class Role:
    """One engine process of a suite run: its phases, the `LLM` keyword arguments beyond
    `llm_kwargs(mode)`, its environment, whether it runs with OrbitKVConnector and with
    which settings beyond the socket."""

    name: str
    phases: list[dict[str, Any]]
    llm: dict[str, Any] = field(default_factory=dict)
    env: dict[str, str] = field(default_factory=dict)
    connector: bool = True
    settings: dict[str, Any] = field(default_factory=dict)  # further orbitkv.* connector settings


MANAGER_PID = "<the Manager's pid>"  # filled in once the Manager runs


def reference(long: bool) -> Role:
    """vLLM alone: each prompt cold, then its own prefix-cache hit (the LONG prompts too
    when a fault case compares with them)."""
    long_phases = [gen("long_cold", LONG), gen("long_hit", LONG)] if long else []
    phases = [
        gen("full_cold", FULL),
        gen("full_hit", FULL),
        gen("partial_base", PARTIAL_BASE),
        gen("partial_hit", PARTIAL),
    ]
    return Role("ref", phases + long_phases, connector=False)


def roles_for(mode: str) -> list[Role]:
    """Every role of one mode, in order: `ref` (no connector) first, then the roles that
    share one Manager (the saver first)."""
    settle = {"op": "settle", "tag": "settle"}
    small_hbm = {"num_gpu_blocks_override": SMALL_HBM_BLOCKS}
    if tp_of(mode) > 1:
        # TP with query control: one Manager lookup per request, each rank redeems its
        # shard. The last rank's worker is killed mid-load in a reader of its own (the
        # engine core in its process, so the driver reaches the executor's workers).
        kill = {"op": "kill_worker_mid_load", "tag": "kill_worker", "prompts": [LONG[0]], "rank": tp_of(mode) - 1}
        return [
            reference(long=True),
            Role("saver", [gen("full", FULL), gen("partial_base", PARTIAL_BASE), gen("long", LONG), settle]),
            Role(
                "reader",
                [gen("full", FULL, per_prompt_counters=True), gen("partial", PARTIAL, per_prompt_counters=True)],
            ),
            Role("reader_kill", [kill], env={"VLLM_ENABLE_V1_MULTIPROCESSING": "0"}),
        ]
    if mode == "batch_invariant":
        return [
            Role(
                "ref",
                [
                    gen("concurrent_cold", CONCURRENT, together=True),
                    gen("concurrent_hit", CONCURRENT, together=True),
                    *[gen(f"preempt_{i}", [p, p], max_tokens=PREEMPT_DECODE) for i, p in enumerate(PREEMPT)],
                ],
                connector=False,
            ),
            Role("saver", [gen("concurrent", CONCURRENT, together=True), gen("preempt", PREEMPT), settle]),
            # The concurrent readers get vLLM's full HBM cache: a request vLLM preempts
            # resumes from blocks another process computed in a full prefill (the Manager's
            # copy of the prompt's last whole block), where the reference's hit computed
            # that block after its own hit, so its later logprobs may differ in the last
            # bits with exact KV (seen on 0.33.0 with both phases in 300 blocks).
            Role("reader", [gen("concurrent", CONCURRENT, together=True)]),
            Role("reader_small", [gen("preempt", PREEMPT, together=True, max_tokens=PREEMPT_DECODE)], llm=small_hbm),
        ]
    eager = mode == "eager"
    roles = [
        reference(long=eager),
        Role(
            "saver",
            [gen("full", FULL), gen("partial_base", PARTIAL_BASE), *([gen("long", LONG)] if eager else []), settle],
            # compile mode saves and restores through the GPU's copy engines (the dma kernel)
            env={} if eager else {"ORBITKV_COPY_KERNEL": "dma"},
        ),
    ]
    if eager:
        # the second copy kernel, with a small HBM cache: hits, eviction, hits again
        roles.append(
            Role(
                "reader_torch",
                [
                    gen("full", FULL, per_prompt_counters=True),
                    gen("filler", FILLER),
                    gen("full_after_eviction", FULL, per_prompt_counters=True),
                ],
                llm=small_hbm,
                env={"ORBITKV_COPY_KERNEL": "torch"},
            )
        )
    faults = (
        [
            {"op": "abort_mid_load", "tag": "abort", "prompts": [LONG[0]]},
            gen("after_abort", [LONG[0]]),
            {"op": "kill_manager_mid_load", "tag": "kill", "prompts": [LONG[1]], "manager_pid": MANAGER_PID},
        ]
        if eager
        else []
    )
    if not eager:
        # loads reported in the step that starts them (orbitkv.load_wait_us): the worker
        # waits for the copy before it reports, under CUDA graphs
        roles.append(
            Role(
                "reader_wait",
                [gen("full", FULL, per_prompt_counters=True), gen("partial", PARTIAL, per_prompt_counters=True)],
                env={"ORBITKV_COPY_KERNEL": "dma"},
                settings={"orbitkv.load_wait_us": 200_000},
            )
        )
    roles.append(
        Role(
            "reader",
            [
                gen("full", FULL, per_prompt_counters=True),
                gen("partial", PARTIAL, per_prompt_counters=True),
                *faults,
            ],
            env={
                "ORBITKV_COPY_KERNEL": "triton" if eager else "dma",
                # the abort and kill phases step the engine core in this process
                "VLLM_ENABLE_V1_MULTIPROCESSING": "0" if eager else "1",
            },
        )
    )
    return roles


def run_mode(mode: str, model: Path, out_dir: Path) -> SuiteRun:
    """All roles of one mode: `eager`, `compile` (vLLM's default: torch.compile + CUDA
    graphs), `batch_invariant` (eager with VLLM_BATCH_INVARIANT=1, for the cases whose
    batches differ between the reference and the reader) or `tp2` / `tp4` (compile, TP
    with query control on the Manager and the connector). A role that fails is recorded;
    the tests that need it fail naming it."""
    out_dir.mkdir(parents=True, exist_ok=True)
    run = SuiteRun(mode, out_dir, model)
    env = {"VLLM_BATCH_INVARIANT": "1"} if mode == "batch_invariant" else {}
    tp = tp_of(mode)
    qc: dict[str, Any] = {"orbitkv.query_control": True} if tp > 1 else {}
    if tp > 1:
        env["NCCL_NVLS_ENABLE"] = "0"  # NVLink multicast stays off on the lent machines
    ref, *shared = roles_for(mode)

    def start(r: Role, m: Manager | None) -> None:
        plan: dict[str, Any] = {
            "model": str(model),
            "metrics": True,
            "phases": r.phases,
            "llm": llm_kwargs(mode, **r.llm),
        }
        if m is not None:
            plan["socket"] = m.socket
            plan["llm"]["kv_transfer_config"] = connector_config(m.socket, **qc, **r.settings)
            plan["phases"] = [
                ph | {"manager_pid": m.proc.pid} if ph.get("manager_pid") == MANAGER_PID else ph for ph in r.phases
            ]
        try:
            run.roles[r.name] = run_driver(plan, out_dir, r.name, env | r.env)
        except Exception as exc:
            run.errors[r.name] = str(exc)

    start(ref, None)
    m = Manager(out_dir / "manager.log", "--dram-size", "4GiB", *(["--enable-query-control"] if tp > 1 else []))
    try:
        for r in shared:
            start(r, m)
            if r.name == "saver":
                run.roles["manager_after_saver"] = {"phases": [], "stats": m.stats()}
        if m.proc.poll() is None:
            run.roles["manager_after"] = {"phases": [], "stats": m.settled_stats()}
    finally:
        m.stop()
    return run


def run_model_dir(run: SuiteRun) -> Path:
    return run.model


def settle_commits(m: Manager, quiet: float = 1.0, timeout: float = 30.0) -> int:
    """The Manager's committed-block count once it stopped changing for `quiet` s."""
    last, since = m.stats()["blocks_committed_total"], time.monotonic()
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        time.sleep(0.1)
        now = m.stats()["blocks_committed_total"]
        if now != last:
            last, since = now, time.monotonic()
        elif time.monotonic() - since >= quiet:
            break
    return int(last)


class VllmServer:
    """`vllm serve MODEL` with the connector JSON on a loopback port, vLLM's default
    compile + CUDA-graph mode, the same engine limits as the suite's `LLM` roles."""

    def __init__(self, model: Path, kv_transfer_config: dict[str, Any], log: Path) -> None:
        import socket

        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            self.port = s.getsockname()[1]
        self.model = str(model)
        self.args = [
            sys.executable,
            "-m",
            "vllm.entrypoints.cli.main",
            "serve",
            self.model,
            "--host",
            "127.0.0.1",
            "--port",
            str(self.port),
            "--skip-tokenizer-init",
            "--dtype",
            "bfloat16",
            "--max-model-len",
            "4096",
            "--gpu-memory-utilization",
            "0.3",
            "--seed",
            "0",
            "--max-num-batched-tokens",
            "8192",
            "--max-num-seqs",
            "256",
            "--enable-prompt-tokens-details",
            "--kv-transfer-config",
            json.dumps(kv_transfer_config),
        ]
        self.log = log

    def __enter__(self) -> VllmServer:
        self._log = open(self.log, "wb")
        self.proc = subprocess.Popen(self.args, stdout=self._log, stderr=subprocess.STDOUT, env=engine_env())
        deadline = time.monotonic() + 600
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"vllm serve exited with {self.proc.returncode}: {self.log.read_text()[-4000:]}")
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{self.port}/health", timeout=2) as r:
                    if r.status == 200:
                        return self
            except OSError:
                pass
            time.sleep(1)
        self.__exit__(None, None, None)
        raise RuntimeError("vllm serve did not become healthy in 600 s")

    def complete(self, tokens: list[int], max_tokens: int) -> dict[str, Any]:
        body = {
            "model": self.model,
            "prompt": tokens,
            "max_tokens": max_tokens,
            "temperature": 0.0,
            "logprobs": 1,
            "return_tokens_as_token_ids": True,
            "return_token_ids": True,
            "ignore_eos": True,
        }
        req = urllib.request.Request(
            f"http://127.0.0.1:{self.port}/v1/completions",
            data=json.dumps(body).encode(),
            headers={"Content-Type": "application/json"},
        )
        with urllib.request.urlopen(req, timeout=120) as r:
            answer = json.loads(r.read())
        choice = answer["choices"][0]
        details = (answer.get("usage") or {}).get("prompt_tokens_details") or {}
        return {
            "tokens": list(choice["token_ids"]),
            "logprobs": [float(x) for x in choice["logprobs"]["token_logprobs"]],
            "num_cached_tokens": details.get("cached_tokens"),
        }

    def __exit__(self, *exc: object) -> None:
        stop_process(self.proc, signal.SIGINT)
        self._log.close()
