"""The modules of the `orbitkv` package import each other without a circle (ARCHITECTURE.md).
Checked on the source: every `import` / `from ... import` of an `orbitkv` module outside an
`if TYPE_CHECKING:` block is an edge (imports inside functions included); a failure names
one cycle."""

from __future__ import annotations

import ast
from pathlib import Path

PKG = Path(__file__).resolve().parents[2] / "orbitkv"


def module_name(path: Path) -> str:
    parts = list(path.relative_to(PKG.parent).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def imported(path: Path, me: str, modules: set[str]) -> set[str]:
    tree = ast.parse(path.read_text())
    typing_only = {
        id(n)
        for node in ast.walk(tree)
        if isinstance(node, ast.If) and getattr(node.test, "id", "") == "TYPE_CHECKING"
        for n in ast.walk(node)
    }
    package = me if path.name == "__init__.py" else me.rpartition(".")[0]
    out: set[str] = set()
    for node in ast.walk(tree):
        if id(node) in typing_only:
            continue
        if isinstance(node, ast.ImportFrom):
            base = package.split(".")[: len(package.split(".")) - (node.level - 1)] if node.level else []
            target = ".".join([*base, node.module] if node.module else base) if node.level else node.module or ""
            out |= {t for t in [target, *(f"{target}.{a.name}" for a in node.names)] if t in modules}
        elif isinstance(node, ast.Import):
            out |= {a.name for a in node.names if a.name in modules}
    out.discard(me)
    return out


def graph() -> dict[str, set[str]]:
    paths = {module_name(p): p for p in PKG.rglob("*.py")}
    return {m: imported(p, m, set(paths)) for m, p in paths.items()}


def cycle(g: dict[str, set[str]]) -> list[str] | None:
    done: set[str] = set()

    def visit(v: str, path: list[str]) -> list[str] | None:
        if v in path:
            return [*path[path.index(v) :], v]
        if v in done:
            return None
        for w in sorted(g.get(v, ())):
            if (c := visit(w, [*path, v])) is not None:
                return c
        done.add(v)
        return None

    return next((c for v in sorted(g) if (c := visit(v, [])) is not None), None)


def test_the_orbitkv_modules_import_without_a_circle() -> None:
    g = graph()
    assert "orbitkv.vllm.worker_jobs" in g["orbitkv.vllm.worker"], "the reader misses edges"
    c = cycle(g)
    assert c is None, "import circle: " + " -> ".join(c or [])


def test_the_cycle_finder_finds_one() -> None:
    assert cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]
    assert cycle({"a": {"b"}, "b": {"c"}, "c": set()}) is None
