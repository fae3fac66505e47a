"""A KV page as runs of contiguous elements: what the one-pass kernel walks."""

from __future__ import annotations

from dataclasses import dataclass
from math import prod

MAX_OUTER = 3  # outer dims a page may keep after merging; more -> the torch kernel
MAX_RUNS = 65535  # runs per page (a grid dimension)


@dataclass(frozen=True)
class Runs:
    """A page as `outer` dims (sizes, element strides; padded to MAX_OUTER) of a dense
    run of `run` elements."""

    sizes: tuple[int, int, int]
    strides: tuple[int, int, int]
    run: int

    @property
    def count(self) -> int:
        return self.sizes[0] * self.sizes[1] * self.sizes[2]


def page_runs(shape: tuple[int, ...], strides: tuple[int, ...], elem: int) -> Runs | None:
    """The runs of a page of byte `shape`/`strides` (last dim dense bytes) in elements of
    `elem` bytes, adjacent dims merged; None if more than MAX_OUTER outer dims remain or
    the last dim is not dense."""
    if strides[-1] != 1 or shape[-1] % elem:
        return None
    dims = [(n, s) for n, s in zip(shape[:-1], strides[:-1], strict=True) if n > 1]
    run = shape[-1]
    while dims and dims[-1][1] == run:  # the innermost outer dim continues the run
        run *= dims.pop()[0]
    merged: list[tuple[int, int]] = []
    for n, s in dims:
        if merged and merged[-1][1] == n * s:
            merged[-1] = (merged[-1][0] * n, s)
        else:
            merged.append((n, s))
    if len(merged) > MAX_OUTER or any(s % elem for _, s in merged) or run % elem:
        return None
    if prod(n for n, _ in merged) > MAX_RUNS:
        return None
    merged = [(1, 0)] * (MAX_OUTER - len(merged)) + merged
    sizes = tuple(n for n, _ in merged)
    elem_strides = tuple(s // elem for _, s in merged)
    return Runs(sizes, elem_strides, run // elem)  # type: ignore[arg-type]
