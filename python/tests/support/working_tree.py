"""Make an engine suite test this checkout's pure-Python packages whatever `orbitkv`
wheel is installed in the engine venv.

The installed wheel may carry older copies of `orbitkv/vllm`, `orbitkv/sglang`,
`orbitkv/engine` or `orbitkv/kvcopy`. `use_working_tree` loads the named subpackages from
the working tree explicitly (their submodules then resolve there too); the rest of
`orbitkv`, including the compiled `_native`, stays the installed one.
"""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

REPO_PYTHON = Path(__file__).resolve().parents[2]
REPO_PKG = REPO_PYTHON / "orbitkv"


def use_working_tree(*subpackages: str) -> None:
    """Load `orbitkv.<sub>` for each of `subpackages` from this checkout, dependencies first."""
    if str(REPO_PYTHON) not in sys.path:
        sys.path.append(str(REPO_PYTHON))
    import orbitkv

    for sub in subpackages:
        pkg_dir = REPO_PKG / sub
        name = f"orbitkv.{sub}"
        for mod in [m for m in sys.modules if m == name or m.startswith(name + ".")]:
            del sys.modules[mod]
        spec = importlib.util.spec_from_file_location(
            name, pkg_dir / "__init__.py", submodule_search_locations=[str(pkg_dir)]
        )
        assert spec is not None and spec.loader is not None
        module = importlib.util.module_from_spec(spec)
        sys.modules[name] = module
        spec.loader.exec_module(module)
        setattr(orbitkv, sub, module)
