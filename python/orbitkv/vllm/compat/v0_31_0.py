"""vLLM 0.31.0: the first qualified pin. Its `KVConnectorBase_V1` has no sleep-mode
hooks and no per-tier hit reporting, so `ConnectorHooks` adds nothing."""

from __future__ import annotations

from typing import TYPE_CHECKING

from orbitkv.vllm.errors import UnsupportedProfileError

if TYPE_CHECKING:
    from vllm.config import VllmConfig

VERSION = "0.31.0"

SAVES_BEFORE_NEXT_STEP = False


class ConnectorHooks:
    """No release-specific hooks in 0.31.0."""


def check_profile(vllm_config: VllmConfig) -> None:
    require_v1_runner(vllm_config)
    if vllm_config.model_config.enable_sleep_mode:
        # 0.31.0 releases (and remaps) the KV cache on sleep without telling the
        # connector, while OrbitKV copies into and out of those pages off the step.
        raise UnsupportedProfileError(
            "OrbitKVConnector rejects sleep mode on vllm 0.31.0 (--enable-sleep-mode): this "
            "release gives connectors no hook before the KV cache memory is released, so a copy "
            "in flight could touch it; vllm 0.33.0 has the hook (unregister_kv_caches) and is "
            "supported with sleep mode"
        )


def require_v1_runner(vllm_config: VllmConfig) -> None:
    """The V1 model runner (0.31.0, 0.33.0): Model Runner V2 passes other start_load_kv
    arguments and orders the connector's calls differently on these releases."""
    if vllm_config.use_v2_model_runner:
        raise UnsupportedProfileError(
            "OrbitKVConnector requires the V1 model runner on this vLLM release: set "
            "VLLM_USE_V2_MODEL_RUNNER=0 (Model Runner V2 passes different start_load_kv arguments "
            "and metadata ordering that this adapter does not qualify before vllm 0.34.0)"
        )
