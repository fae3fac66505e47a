"""The engine-neutral layer both adapters build on (`orbitkv.vllm`, `orbitkv.sglang`).

- `blocks`: the cached block format (how a block's bytes come from the engine's pages);
- `identity`: the files a namespace fingerprint binds (LoRA adapters, model config);
- `session`: the lazily imported native module, its error classes, and the reconnect
  back-off after an unreachable Manager.

Nothing here imports an engine, torch or the native module at import time (contract O4):
the adapters import from here, never from each other.
"""
