"""What differs between the qualified vLLM releases: one module per pin.

`current()` reads `vllm.__version__` once and returns that release's module; every
other adapter module is written against what the pins share. A release module holds:

* `VERSION`: the pin it describes;
* `ConnectorHooks`: a mixin of the `KVConnectorBase_V1` hooks that exist only in that
  release (`OrbitKVConnector` derives from it ahead of the base class);
* `check_profile(vllm_config)`: the release's own profile guards (contract V3);
* `SAVES_BEFORE_NEXT_STEP`: whether each step's saves must be ordered before the next
  step's device work (a runner that rewrites blocks before it reports preemptions).

An unknown version is rejected with `UnsupportedProfileError` naming the pins: the
adapter moves with the pins, there are no cross-version fallbacks. Importing this
package imports no vLLM (O4); `current()` does.
"""

from __future__ import annotations

import importlib
from types import ModuleType

from orbitkv.vllm.errors import UnsupportedProfileError

# pin -> module; scripts/vllm-venv.sh QUALIFIED_PINS lists the same pins.
RELEASES: dict[str, str] = {
    "0.31.0": "orbitkv.vllm.compat.v0_31_0",
    "0.33.0": "orbitkv.vllm.compat.v0_33_0",
    "0.34.0": "orbitkv.vllm.compat.v0_34_0",
}
SUPPORTED_PINS: tuple[str, ...] = tuple(RELEASES)

_current: ModuleType | None = None


def select(version: str) -> ModuleType:
    """The release module for `version`; `UnsupportedProfileError` for any other."""
    module = RELEASES.get(version)
    if module is None:
        raise UnsupportedProfileError(
            f"orbitkv.vllm is qualified against vllm {', '.join(SUPPORTED_PINS)}, found {version}; "
            "install one of those pins (the adapter moves with the pins, no cross-version fallbacks)"
        )
    return importlib.import_module(module)


def current() -> ModuleType:
    """The module of the installed vLLM release (selected once per process)."""
    global _current
    if _current is None:
        import vllm

        _current = select(vllm.__version__)
    return _current
