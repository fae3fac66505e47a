"""Checks of a copy batch: slots inside known arena segments, block ids in range,
distinct load destinations, disjoint save slots. Numpy only; every check of a range is
O(range) against marks the earlier ranges of the batch left, so the engine checks each
range just before planning it, while the copies of the ranges before it run."""

from __future__ import annotations

import itertools
from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any, TypeAlias

import numpy as np

if TYPE_CHECKING:
    import numpy.typing as npt

    # A batch's slots: (segment, offset) pairs, or an [n, 2] integer array (`slots_array`).
    Slots: TypeAlias = Sequence[tuple[int, int]] | npt.NDArray[np.integer[Any]]
    # A batch's destination or source block ids: ints, or an integer array.
    BlockIds: TypeAlias = Sequence[int] | npt.NDArray[np.integer[Any]]

BUCKETS_PER_SLOT = 8  # a save's overlap check uses buckets up to this many per slot, else a sort


class BatchChecks:
    """The checks of one batch of `block_bytes` blocks over arena segments `sizes`
    (segment id -> bytes) and pages `[0, num_blocks)`. Errors are `ValueError`s naming
    expected and actual, and positions in the whole batch."""

    def __init__(self, sizes: Mapping[int, int], block_bytes: int, num_blocks: int) -> None:
        self.sizes = dict(sizes)
        self.block_bytes = block_bytes
        self.num_blocks = num_blocks
        self._seg_size = np.full(max(self.sizes, default=-1) + 1, -1, dtype=np.int64)
        for seg, size in self.sizes.items():
            self._seg_size[seg] = size

    def arrays(self, slots: Slots, block_ids: BlockIds) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Segments, offsets and block ids as int64 arrays (shapes checked, values not)."""
        if len(slots) != len(block_ids):
            raise ValueError(f"expected one slot per block id: {len(block_ids)} block ids, {len(slots)} slots")
        segs, offs = self._slot_arrays(slots)
        return segs, offs, np.asarray(block_ids, dtype=np.int64).reshape(-1)

    def for_load(self, segs: np.ndarray, offs: np.ndarray, ids: np.ndarray) -> Callable[[slice], None]:
        """The check of a load's range: its slots and ids, and no destination block loaded
        twice in the batch (a mark per destination block)."""
        marks: np.ndarray | None = None  # per destination block: 1 + the position that loads it

        def check(r: slice) -> None:
            nonlocal marks
            i = ids[r]
            self.check_range(segs[r], offs[r], i, r.start)
            if marks is None:
                marks = np.zeros(self.num_blocks, dtype=np.int64)
            pos = np.arange(r.start + 1, r.start + 1 + i.size, dtype=np.int64)
            if np.any(marks[i]):  # loaded by an earlier range
                self._duplicates(ids)
            marks[i] = pos
            if np.any(marks[i] != pos):  # twice in this range
                self._duplicates(ids)

        return check

    def for_save(self, segs: np.ndarray, offs: np.ndarray, ids: np.ndarray) -> Callable[[slice], None]:
        """Slots are `block_bytes` long, so two overlap iff they start in the same
        `block_bytes` bucket of a segment or in neighbouring ones: a mark per bucket (1 +
        the position of the slot starting there). Where buckets far outnumber the slots, the
        whole batch is sorted once instead."""
        bb, n = self.block_bytes, segs.size
        sizes = self.sizes
        per = {seg: size // bb + 1 for seg, size in sizes.items()}  # starts lie in [0, size // bb)
        total = 1 + sum(per.values())  # bucket 0 and each segment's last bucket stay empty
        if total > BUCKETS_PER_SLOT * n + (BUCKETS_PER_SLOT << 13):
            self.check_range(segs, offs, ids, 0)
            clash = self._overlap_by_sort(segs, offs) if n > 1 else None
            if clash is not None:
                self._overlapping(segs, offs, *clash)
            return lambda r: None
        first = np.zeros(max(sizes, default=0) + 1, dtype=np.int64)
        cursor = 1
        for seg in sorted(per):
            first[seg] = cursor
            cursor += per[seg]
        marks: np.ndarray | None = None

        def check(r: slice) -> None:
            nonlocal marks
            s, o = segs[r], offs[r]
            self.check_range(s, o, ids[r], r.start)
            if marks is None:
                marks = np.zeros(total, dtype=np.int64)
            key = first[s] + o // bb
            pos = np.arange(r.start + 1, r.start + 1 + s.size, dtype=np.int64)
            prev = marks[key]
            hit = np.flatnonzero(prev)
            if hit.size:  # same bucket as a slot of an earlier range
                self._overlapping(segs, offs, int(prev[hit[0]]) - 1, r.start + int(hit[0]))
            marks[key] = pos
            back = marks[key]
            hit = np.flatnonzero(back != pos)
            if hit.size:  # same bucket as another slot of this range
                j = int(hit[0])
                self._overlapping(segs, offs, *sorted((int(back[j]) - 1, r.start + j)))
            for near in (key - 1, key + 1):  # neighbouring buckets (never another segment's)
                m = marks[near]
                has = m > 0
                other = np.where(has, m - 1, 0)
                hit = np.flatnonzero(has & (np.abs(offs[other] - o) < bb))
                if hit.size:
                    j = int(hit[0])
                    self._overlapping(segs, offs, *sorted((int(other[j]), r.start + j)))

        return check

    def _overlapping(self, segs: np.ndarray, offs: np.ndarray, a: int, b: int) -> None:
        sa, sb = (int(segs[a]), int(offs[a])), (int(segs[b]), int(offs[b]))
        raise ValueError(
            f"destination slots {a} {sa} and {b} {sb} overlap; expected disjoint {self.block_bytes}-byte slots"
        )

    def check_range(self, segs: np.ndarray, offs: np.ndarray, ids: np.ndarray, start: int) -> None:
        """Slots and block ids of positions start.. of a batch (errors name batch positions)."""
        self._check_slots(segs, offs, start)
        bad = np.flatnonzero((ids < 0) | (ids >= self.num_blocks))
        if bad.size:
            i = int(bad[0])
            raise ValueError(
                f"block id {int(ids[i])} (position {start + i}) outside the expected range [0, {self.num_blocks})"
            )

    @staticmethod
    def _duplicates(ids: np.ndarray) -> None:
        dup = np.flatnonzero(np.bincount(ids) > 1)
        raise ValueError(f"duplicate destination block ids {dup.tolist()}; expected distinct ids")

    def _overlap_by_sort(self, segs: np.ndarray, offs: np.ndarray) -> tuple[int, int] | None:
        # One int64 key per slot (segment in the high bits) sorts faster than two keys.
        fits = int(offs.max()) < (1 << 40) and int(segs.max()) < (1 << 22)
        order = np.argsort((segs << 40) | offs) if fits else np.lexsort((offs, segs))
        s, o = segs[order], offs[order]
        clash = np.flatnonzero((s[1:] == s[:-1]) & (o[1:] < o[:-1] + self.block_bytes))
        if clash.size:
            a, b = int(order[clash[0]]), int(order[clash[0] + 1])
            return (a, b) if a < b else (b, a)
        return None

    def _slot_arrays(self, slots: Slots) -> tuple[np.ndarray, np.ndarray]:
        """Segments and offsets of `slots` as arrays (vectorised: a batch of tens of
        thousands of slots costs milliseconds, not a Python loop per slot); checked later."""
        if len(slots) == 0:
            return np.empty(0, dtype=np.int64), np.empty(0, dtype=np.int64)
        if isinstance(slots, np.ndarray):
            if slots.ndim != 2 or slots.shape[1] != 2 or not np.issubdtype(slots.dtype, np.integer):
                raise ValueError(f"expected an [n, 2] integer array of slots, got {slots.dtype} {slots.shape}")
            return slots[:, 0].astype(np.int64), slots[:, 1].astype(np.int64)
        try:  # flattening with fromiter is twice as fast as asarray on a list of tuples
            flat = np.fromiter(itertools.chain.from_iterable(slots), dtype=np.int64)
        except (TypeError, ValueError, OverflowError):
            flat = None
        arr = flat.reshape(-1, 2) if flat is not None and flat.size == 2 * len(slots) else None
        if arr is None:
            for i, slot in enumerate(slots):  # slow path, only to name the bad entry
                if slot is None or len(slot) != 2:
                    raise ValueError(f"slot {i}: expected (segment, offset), got {slot!r}")
            raise ValueError("expected a sequence of (segment, offset) slots")
        return arr[:, 0], arr[:, 1]

    def _check_slots(self, segs: np.ndarray, offs: np.ndarray, start: int) -> None:
        """Slots of positions start.. inside known segments."""
        sizes, table = self.sizes, self._seg_size
        known = (segs >= 0) & (segs < table.size)
        seg_size = np.where(known, table[np.clip(segs, 0, max(table.size - 1, 0))], -1)
        unknown = np.flatnonzero(seg_size < 0)
        if unknown.size:
            i = int(unknown[0])
            raise ValueError(f"slot {start + i}: unknown arena segment {int(segs[i])}; expected one of {sorted(sizes)}")
        outside = np.flatnonzero((offs < 0) | (offs + self.block_bytes > seg_size))
        if outside.size:
            i = int(outside[0])
            raise ValueError(
                f"slot {start + i}: offset {int(offs[i])} + block_bytes {self.block_bytes} lies outside segment "
                f"{int(segs[i])} of {int(seg_size[i])} bytes"
            )
