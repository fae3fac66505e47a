"""Batched copies between arena slots and KV pages, on dedicated CUDA streams.

Every copy is a torch index op over a whole batch (`index_select` / `index_copy_`),
never one copy per block: per layer and arena segment, the arena side is the
segment viewed as rows of `unit` bytes, the page side is the layer's pages viewed
as `[num_blocks, *shape]`. See docs/gpu.md for the ordering rules.
"""

from __future__ import annotations

import functools
import importlib
import itertools
import os
import threading
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, NamedTuple

import numpy as np
import torch

from orbitkv.kvcopy.arena import ArenaView
from orbitkv.kvcopy.checks import BatchChecks
from orbitkv.kvcopy.dma import DmaPath
from orbitkv.kvcopy.errors import CopyEngineError
from orbitkv.kvcopy.handles import LoadHandle, SaveHandle, _Handle
from orbitkv.kvcopy.layout import LayerPages

if TYPE_CHECKING:
    from orbitkv.kvcopy.checks import BlockIds, Slots

UNIT_CAP = 1 << 20  # arena rows never exceed 1 MiB
CHUNK_BYTES = 64 << 20  # one index_select / index_copy_ pair moves at most this much
_DTYPES = {8: torch.int64, 4: torch.int32, 2: torch.int16, 1: torch.uint8}
KERNELS = ("auto", "torch", "triton", "dma")
KERNEL_ENV = "ORBITKV_COPY_KERNEL"  # what "auto" means when set: torch, triton or dma
# "auto" on CUDA copies blocks of at least this many bytes through the DMA copy engines, smaller
# ones with the one-pass Triton kernel. Measured on the H200 (docs/performance.md, 2026-12-05):
# with 2 MiB blocks dma serves the multi-turn trace 1.21x faster than triton (saves and loads
# no longer take SMs from the forward pass) and moves random 2 MiB slots at the same rate;
# at 512 KiB one memcpy per block reaches 0.71x of contiguous DMA (triton 0.88x), at 64 KiB 0.18x.
DMA_AUTO_MIN_BLOCK = 2 << 20
LOAD_PRIORITY = -1  # loads gate the next forward: the higher priority (lower number)
SAVE_PRIORITY = 0


def slots_array(packed: bytes) -> np.ndarray:
    """Slots packed by the native client (`Client.acquire_packed`,
    `PendingSave.packed_slots`: little-endian int64 `(segment, offset)` pairs) as an
    `[n, 2]` int64 array, zero copy. `load`/`save` take it in place of a list of tuples
    and then check a batch without touching a Python object per block."""
    if len(packed) % 16:
        raise ValueError(f"packed slots must be 16 bytes each, got {len(packed)} bytes")
    return np.frombuffer(packed, dtype="<i8").reshape(-1, 2)


def _lowbit(x: int) -> int:
    return x & -x


def _even(n: int) -> int:
    """`n` rounded up to even: int64 index arrays placed there start 16-byte aligned."""
    return n + (n & 1)


@dataclass(frozen=True)
class _Layer:
    pages: LayerPages
    offset: int  # byte offset of this layer's page inside a cached block
    elem: int  # widest element size the page side allows (alignment of base, strides, backing)


class _Batch(NamedTuple):
    """A validated load or save: its int64 arrays, the check of each of its ranges
    (`BatchChecks`) and the ranges themselves (`CopyEngine._batches`)."""

    segs: np.ndarray
    offs: np.ndarray
    ids: np.ndarray
    check: Callable[[slice], None]
    ranges: list[slice]

    def at(self, r: slice) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """The arrays of range `r`."""
        return self.segs[r], self.offs[r], self.ids[r]


def _seg_groups(segs: np.ndarray) -> list[tuple[int, np.ndarray]]:
    """(segment, positions of its slots) for each segment of a range."""
    uniq = np.unique(segs)
    if uniq.size == 1:  # the common case: no per-segment selection needed
        return [(int(uniq[0]), np.arange(segs.size))]
    return [(int(seg), np.flatnonzero(segs == seg)) for seg in uniq]


@dataclass(frozen=True)
class _Part:
    """One (layer, segment) copy of a batch: index slices into the device index tensor."""

    layer: int
    seg: int
    unit: int
    elem: int
    rows: slice  # arena row indices, slot-major
    ids: slice  # block ids, one per slot of this segment
    count: int


class CopyEngine:
    """Copies cached blocks between arena slots and the pages of `layers`.

    A cached block is the concatenation, over `layers` in the given order, of that
    layer's page bytes in logical (`shape`) order - the format of the CPU path
    (`python/tests/support/host_copier.py`). Not thread-safe: drive it from one thread.
    """

    def __init__(self, layers: Sequence[LayerPages], arena: ArenaView, *, kernel: str = "auto") -> None:
        """`kernel`: "torch" copies in two passes (index ops through a staging buffer in
        device memory), "triton" in one (a Triton kernel, arena row <-> page, CUDA only;
        refused with the reason where it cannot run), "dma" through the GPU's copy engines
        (`cudaMemcpyAsync` of whole blocks into a staging ring, the Triton kernel placing
        pages on the device: `orbitkv.kvcopy.dma`; CUDA only, refused like "triton"),
        "auto" (default) the value of $ORBITKV_COPY_KERNEL if set, else on CUDA where the
        Triton kernel can run "dma" for blocks of at least `DMA_AUTO_MIN_BLOCK` bytes and
        "triton" for smaller ones, else "torch"; the choice and its reason are in `kernel`
        and `kernel_reason`."""
        if not layers:
            raise ValueError("expected at least one layer, got 0")
        self.arena = arena
        self.device = arena.device
        self.num_layers = len(layers)
        self.block_bytes = sum(p.page_bytes for p in layers)
        self.num_blocks = min(p.blocks for p in layers)
        self._layers: list[_Layer] = []
        offset = 0
        for i, p in enumerate(layers):
            if p.backing.device != self.device:
                raise ValueError(f"layer {i} pages live on {p.backing.device}, expected the arena's {self.device}")
            self._layers.append(_Layer(p, offset, self._page_elem(p)))
            offset += p.page_bytes
        self._views: dict[tuple[int, int], torch.Tensor] = {}
        self._flat_views: dict[tuple[str, int, int], torch.Tensor] = {}
        self._cuda = self.device.type == "cuda"
        self._triton: Any = None  # the orbitkv.kvcopy.triton_copy module when selected (triton, dma)
        self._runs: list[dict[int, Any]] = []  # per layer: element size -> Runs
        self.kernel, self.kernel_reason = self._select_kernel(kernel)
        self._seg_rel: np.ndarray | None = None  # per segment: bytes from the lowest segment's start
        self._base_seg = -1
        if self.kernel == "triton":
            self._address_segments()
        self._lock = threading.Lock()
        self._free_events: list[torch.cuda.Event] = []
        self._inflight: deque[_Handle] = deque()
        self._dma: DmaPath | None = None  # the dma kernel's staging rings and memcpys
        if self._cuda:
            self.load_stream = torch.cuda.Stream(self.device, priority=LOAD_PRIORITY)
            # A load's PCIe gathers run on `load_stream`; the copies from the staging buffers
            # into the pages (HBM) run on `place_stream`, so layer l is placed while layer l+1
            # still crosses PCIe.
            self.place_stream = torch.cuda.Stream(self.device, priority=LOAD_PRIORITY)
            self.save_stream = torch.cuda.Stream(self.device, priority=SAVE_PRIORITY)
            # A save packs pages into staging (HBM) on `pack_stream` and writes the arena
            # over PCIe on `save_stream`, layer by layer, so the two overlap.
            self.pack_stream = torch.cuda.Stream(self.device, priority=SAVE_PRIORITY)
            for p in layers:  # a KV buffer freed while a copy is in flight waits for these streams
                p.backing.record_stream(self.load_stream)
                p.backing.record_stream(self.place_stream)
                p.backing.record_stream(self.save_stream)
                p.backing.record_stream(self.pack_stream)
            if self.kernel in ("triton", "dma"):
                self._warm_up_triton()
            if self.kernel == "dma":
                self._start_dma()
            # Every event a copy records exists before any graph capture: record each once here.
            events = [torch.cuda.Event() for _ in range(4 * self.num_layers + 4)]
            for e in events:
                e.record(self.load_stream)
            self._free_events.extend(events)

    def _start_dma(self) -> None:
        """Allocate the dma kernel's staging rings. Where they do not fit in device memory,
        an explicit choice of `dma` fails with the fix; `auto` takes `triton` instead and
        says why in `kernel_reason`."""
        try:
            self._dma = DmaPath(self)
        except torch.cuda.OutOfMemoryError as exc:
            need = DmaPath.ring_bytes(self.block_bytes) >> 20
            if not self.kernel_reason.startswith("auto"):
                raise CopyEngineError(
                    f"the dma copy kernel's staging rings ({need} MiB) do not fit in {self.device}'s free memory "
                    f"({exc}); leave that much more free (e.g. a lower gpu_memory_utilization) or use kernel='triton'"
                ) from exc
            self.kernel = "triton"
            self.kernel_reason = f"auto: one-pass Triton kernel (the dma staging rings, {need} MiB, did not fit: {exc})"
            self._address_segments()

    def _select_kernel(self, asked: str) -> tuple[str, str]:
        if asked not in KERNELS:
            raise ValueError(f"kernel must be one of {list(KERNELS)}, got {asked!r}")
        source = "asked"
        if asked == "auto":
            env = os.environ.get(KERNEL_ENV, "").strip()
            if env and env not in KERNELS:
                raise ValueError(f"${KERNEL_ENV} must be one of {list(KERNELS)}, got {env!r}")
            asked, source = (env, f"${KERNEL_ENV}") if env else ("auto", "auto")
        if asked == "torch":
            return "torch", f"{source}: two-pass torch index ops"
        if asked == "auto" and not self._cuda:
            return "torch", f"auto: two-pass torch index ops (pages on {self.device})"
        if asked == "dma" and not self._cuda:
            raise CopyEngineError(
                f"the dma copy kernel needs CUDA pages (these are on {self.device}); use kernel='torch'"
            )
        why = self._triton_unusable()
        dma = f"{source}: DMA copy engines through a staging ring, pages placed by the Triton kernel"
        if why is None and asked == "dma":
            return "dma", dma
        if why is None and asked == "auto" and self._cuda and self.block_bytes >= DMA_AUTO_MIN_BLOCK:
            return "dma", f"{dma} (blocks of {self.block_bytes} bytes >= {DMA_AUTO_MIN_BLOCK})"
        if why is None:
            small = (
                f" (blocks of {self.block_bytes} bytes < {DMA_AUTO_MIN_BLOCK})"
                if asked == "auto" and self._cuda
                else ""
            )
            return "triton", f"{source}: one-pass Triton kernel{small}"
        if asked in ("triton", "dma"):
            raise CopyEngineError(f"the {asked} copy kernel cannot run here: {why}; use kernel='torch'")
        return "torch", f"auto: two-pass torch index ops ({why})"

    def _address_segments(self) -> None:
        """Let the one-pass kernel reach every segment from the lowest-addressed one (all
        are mapped into the device's address space): byte distances, when all are
        multiples of 8 (page-aligned mappings always are)."""
        sizes = self.arena.sizes
        if not sizes:
            return
        ptrs = {seg: self.arena.segment(seg).data_ptr() for seg in sizes}
        base = min(ptrs, key=lambda seg: ptrs[seg])
        rel = np.zeros(max(sizes) + 1, dtype=np.int64)
        for seg, ptr in ptrs.items():
            rel[seg] = ptr - ptrs[base]
        if np.all(rel % 8 == 0):
            self._seg_rel, self._base_seg = rel, base

    def _triton_unusable(self) -> str | None:
        """Why the one-pass kernel cannot copy these pages (None: it can; it is loaded then).
        CPU pages only under Triton's interpreter (TRITON_INTERPRET=1: tests without a GPU)."""
        if not self._cuda and os.environ.get("TRITON_INTERPRET") != "1":
            return f"pages on {self.device}, the Triton kernel needs CUDA pages"
        from orbitkv.kvcopy.runs import page_runs

        runs: list[dict[int, Any]] = []
        for i, layer in enumerate(self._layers):
            shape, strides = self._page_form(layer.pages)
            by_elem = {e: r for e in (8, 4, 2, 1) if layer.elem % e == 0 and (r := page_runs(shape, strides, e))}
            if not by_elem:
                dims = f"shape {shape}, byte strides {strides}"
                return f"layer {i}'s page ({dims}) has no dense last dim or more runs than the kernel takes"
            runs.append(by_elem)
        try:
            mod = importlib.import_module("orbitkv.kvcopy.triton_copy")
        except ImportError as exc:
            return f"triton is not importable ({exc})"
        self._triton, self._runs = mod, runs
        return None

    def _warm_up_triton(self) -> None:
        """Compile the one-pass kernels now (the first copy would otherwise wait for
        Triton's compiler, seconds, inside an engine step), with each layer's arguments
        and its widest element size, the one copies from aligned slots use."""
        index = torch.zeros(1, dtype=torch.int64, device=self.device)
        seg = min(self.arena.sizes)
        segment = functools.partial(self._flat, "seg", seg)
        with torch.cuda.stream(self.load_stream):
            for li in range(self.num_layers):
                for to_pages in (True, False):
                    self._launch(li, segment, index, index, max(_DTYPES), to_pages, warm_up=True)
        self.load_stream.synchronize()

    @staticmethod
    def _page_form(p: LayerPages) -> tuple[tuple[int, ...], tuple[int, ...]]:
        """(shape, byte strides) of a page in cached byte order: one dense run, or logical."""
        if p.contiguous:
            return (p.page_bytes,), (1,)
        return p.shape, p.strides

    @staticmethod
    def _page_elem(p: LayerPages) -> int:
        shape, strides = CopyEngine._page_form(p)
        if strides[-1] != 1:
            return 1
        for e in (8, 4, 2):
            values = (p.base, p.block_stride, shape[-1], p.backing.data_ptr(), p.backing.numel(), *strides[:-1])
            if all(v % e == 0 for v in values):
                return e
        return 1

    def _page_view(self, layer: int, elem: int) -> torch.Tensor:
        """The layer's pages as `[num_blocks, *page]` in elements of `elem` bytes, the page
        dims in cached byte order."""
        key = (layer, elem)
        view = self._views.get(key)
        if view is None:
            p = self._layers[layer].pages
            shape, strides = self._page_form(p)
            flat = p.backing.view(_DTYPES[elem])
            view = flat.as_strided(
                (self.num_blocks, *shape[:-1], shape[-1] // elem),
                (p.block_stride // elem, *(s // elem for s in strides[:-1]), 1),
                flat.storage_offset() + p.base // elem,
            )
            self._views[key] = view
        return view

    def _rows(self, seg: int, unit: int, elem: int) -> torch.Tensor:
        t = self.arena.segment(seg)
        rows = t.numel() // unit
        return t[: rows * unit].view(_DTYPES[elem]).view(rows, unit // elem)

    # -- validation and index planning -------------------------------------------------

    def _prepare(self, slots: Slots, block_ids: BlockIds, *, load: bool) -> _Batch:
        """A load's or save's start: the batch as int64 arrays with the check of each of
        its ranges (`BatchChecks`), refused during CUDA graph capture."""
        checks = BatchChecks(self.arena.sizes, self.block_bytes, self.num_blocks)
        segs, offs, ids = checks.arrays(slots, block_ids)
        check = (checks.for_load if load else checks.for_save)(segs, offs, ids)
        self._check_not_capturing()
        return _Batch(segs, offs, ids, check, self._batches(ids.size))

    def _batches(self, n: int) -> list[slice]:
        """Consecutive block ranges of a batch, each at most CHUNK_BYTES per layer: a
        range is planned while the copies of the ones before it run."""
        step = max(1, CHUNK_BYTES // max(layer.pages.page_bytes for layer in self._layers))
        return [slice(i, min(n, i + step)) for i in range(0, n, step)]

    def _plan(self, segs: np.ndarray, offs: np.ndarray, ids: np.ndarray) -> tuple[list[list[_Part]], np.ndarray]:
        """Index plan of one validated range: per layer, one part per arena segment;
        the indices (arena rows and block ids) in one array."""
        parts: list[list[_Part]] = [[] for _ in self._layers]
        chunks: list[np.ndarray] = []
        cursor = 0

        def put(a: np.ndarray) -> slice:
            nonlocal cursor
            chunks.append(a)
            cursor += a.size
            return slice(cursor - a.size, cursor)

        groups = _seg_groups(segs)
        id_slices = {seg: put(ids[pos]) for seg, pos in groups}
        for li, layer in enumerate(self._layers):
            page = layer.pages.page_bytes
            for seg, pos in groups:
                starts = offs[pos] + layer.offset
                unit = _lowbit(int(np.bitwise_or.reduce(starts)) | page | UNIT_CAP)
                elem = max(e for e in _DTYPES if unit % e == 0 and layer.elem % e == 0)
                per = page // unit  # arena rows per block
                rows = put(((starts // unit)[:, None] + np.arange(per, dtype=np.int64)[None, :]).reshape(-1))
                parts[li].append(_Part(li, seg, unit, elem, rows, id_slices[seg], pos.size))
        return parts, (np.concatenate(chunks) if chunks else np.empty(0, dtype=np.int64))

    def _indices(self, host: np.ndarray) -> torch.Tensor:
        """The batch's indices on the engine device (on CUDA: issued on the current stream,
        from pinned memory, without a host synchronisation)."""
        t = torch.from_numpy(host)
        if not self._cuda:
            return t
        return t.pin_memory().to(self.device, non_blocking=True)

    def _check_not_capturing(self) -> None:
        if self._cuda and torch.cuda.is_current_stream_capturing():
            raise CopyEngineError(
                "a copy was issued during CUDA graph capture; issue loads and saves outside capture "
                "(nothing of the copy engine may be captured)"
            )

    # -- events ------------------------------------------------------------------------

    def _take_events(self, n: int) -> list[torch.cuda.Event]:
        with self._lock:
            self._reap()
            out = [self._free_events.pop() for _ in range(min(n, len(self._free_events)))]
        out.extend(torch.cuda.Event() for _ in range(n - len(out)))
        return out

    def _give_back(self, events: list[torch.cuda.Event]) -> None:
        with self._lock:
            self._free_events.extend(events)

    def _wait_for_pages(
        self, stream: torch.cuda.Stream, after: torch.cuda.Event | None, ready: torch.cuda.Event
    ) -> None:
        """A save's first stream waits for `after` (the caller's event: the pages are
        written), or with None for the current stream's work so far (recorded in `ready`)."""
        if after is None:
            ready.record(torch.cuda.current_stream(self.device))
            stream.wait_event(ready)
        else:
            stream.wait_event(after)

    def _track(self, handle: _Handle) -> None:
        """Remember a handle until its copy completes (its events then return to the pool)."""
        with self._lock:
            self._inflight.append(handle)

    @staticmethod
    def _dtype(elem: int) -> torch.dtype:
        return _DTYPES[elem]

    def _reap(self) -> None:
        """Forget handles whose copies completed (their events return to the pool)."""
        while self._inflight and self._inflight[0]._poll():
            self._inflight.popleft()

    # -- copies ------------------------------------------------------------------------

    def load(self, slots: Slots, block_ids: BlockIds) -> LoadHandle:
        """Arena slots -> pages of `block_ids`, layer by layer on the load stream, an event
        per layer. On CUDA the copy is ordered after the work already queued on the current
        stream (which may still read the destination pages)."""
        batch = self._prepare(slots, block_ids, load=True)
        if not self._cuda:
            self._copy_on_cpu(batch, self._load_part, to_pages=True)
            return LoadHandle(self, None)
        if self._dma is not None:
            return self._dma.load(batch.segs, batch.offs, batch.ids, batch.check)
        if self.kernel == "triton":
            return self._load_one_pass(batch)
        n = self.num_layers
        ready = self._take_events(n)  # one per layer, recorded once its pages hold the bytes
        gathered: list[torch.cuda.Event] = []  # one per part (load stream)
        load, place = self.load_stream, self.place_stream
        place.wait_stream(torch.cuda.current_stream(self.device))  # the pages may still be read
        plans: list[tuple[list[list[_Part]], torch.Tensor]] = []
        for li in range(n):
            for bi, b in enumerate(batch.ranges):
                if li == 0:  # checked and planned here, while the earlier ranges' copies run
                    self._check_or_unwind(batch.check, b, bi > 0, gathered + ready, load=True)
                    by_layer, host = self._plan(*batch.at(b))
                    with torch.cuda.stream(load):
                        idx = self._indices(host)
                    idx.record_stream(place)
                    plans.append((by_layer, idx))
                by_layer, idx = plans[bi]
                for part in by_layer[li]:
                    self._relay(part, idx, gathered, load, self._gather_part, place, self._place_part)
            ready[li].record(place)
        handle = LoadHandle(self, gathered + ready)
        self._track(handle)
        return handle

    def _check_or_unwind(
        self, check: Callable[[slice], None], r: slice, issued: bool, events: list[torch.cuda.Event], *, load: bool
    ) -> None:
        """Check range `r` of a batch; on an error, first wait for the copies of the ranges
        already issued (none may outlive the call that failed: the caller then releases its
        lease or aborts its save, and reuses the pages), then raise it."""
        try:
            check(r)
        except ValueError:
            if issued:
                streams = (self.load_stream, self.place_stream) if load else (self.pack_stream, self.save_stream)
                for stream in streams:
                    stream.synchronize()
            self._give_back(events)
            raise

    def _relay(
        self,
        part: _Part,
        idx: torch.Tensor,
        events: list[torch.cuda.Event],
        first: torch.cuda.Stream,
        stage: Callable[[_Part, torch.Tensor], torch.Tensor],
        second: torch.cuda.Stream,
        unstage: Callable[[_Part, torch.Tensor, torch.Tensor], None],
    ) -> None:
        """One part through a staging buffer: `stage` fills it on stream `first` (an event,
        appended to `events`, recorded after), `unstage` empties it on stream `second` once
        that event is reached."""
        ev = self._take_events(1)[0]
        events.append(ev)
        with torch.cuda.stream(first):
            staging = stage(part, idx)
            ev.record(first)
        second.wait_event(ev)
        with torch.cuda.stream(second):
            staging.record_stream(second)  # not reused by the first stream before emptied
            unstage(part, idx, staging)

    def _copy_on_cpu(
        self,
        batch: _Batch,
        copy_part: Callable[[_Part, torch.Tensor], None],
        *,
        to_pages: bool,
    ) -> None:
        """CPU pages: every range checked first (nothing is copied if one fails), then each
        planned and copied part by part, synchronously (the Triton kernel here only under
        its interpreter)."""
        for b in batch.ranges:
            batch.check(b)
        if self.kernel == "triton":
            for b in batch.ranges:
                groups, host = self._plan_one_pass(*batch.at(b))
                idx = torch.from_numpy(host)
                for li in range(self.num_layers):
                    self._copy_layer_one_pass(li, groups, idx, to_pages=to_pages)
            return
        for b in batch.ranges:
            by_layer, host = self._plan(*batch.at(b))
            idx = torch.from_numpy(host)
            for part in itertools.chain.from_iterable(by_layer):
                copy_part(part, idx)

    def _load_part(self, part: _Part, idx: torch.Tensor) -> None:
        self._place_part(part, idx, self._gather_part(part, idx))

    def _gather_part(self, part: _Part, idx: torch.Tensor) -> torch.Tensor:
        rows = self._rows(part.seg, part.unit, part.elem)
        return torch.index_select(rows, 0, idx[part.rows])  # arena -> device, slot-major

    def _place_part(self, part: _Part, idx: torch.Tensor, staging: torch.Tensor) -> None:
        pages = self._page_view(part.layer, part.elem)
        pages.index_copy_(0, idx[part.ids], staging.view((part.count, *pages.shape[1:])))

    def save(
        self,
        block_ids: BlockIds,
        slots: Slots,
        *,
        after: torch.cuda.Event | None = None,
    ) -> SaveHandle:
        """Pages of `block_ids` -> arena slots on the save stream, after `after` (an event the
        caller recorded once the pages were written; None: the current stream's work so far).
        The caller must not overwrite the pages, nor commit the slots, before the handle's
        `query()` is True."""
        batch = self._prepare(slots, block_ids, load=False)
        if not self._cuda:
            self._copy_on_cpu(batch, self._save_part, to_pages=False)
            return SaveHandle(self, None)
        if self._dma is not None:
            return self._dma.save(batch.segs, batch.offs, batch.ids, after, batch.check)
        if self.kernel == "triton":
            return self._save_one_pass(batch, after)
        ready, done = self._take_events(2)
        packed: list[torch.cuda.Event] = []  # one per part (pack stream)
        pack, stream = self.pack_stream, self.save_stream
        self._wait_for_pages(pack, after, ready)
        for bi, b in enumerate(batch.ranges):  # checked and planned while the earlier ranges' copies run
            self._check_or_unwind(batch.check, b, bi > 0, [ready, done, *packed], load=False)
            by_layer, host = self._plan(*batch.at(b))
            with torch.cuda.stream(pack):
                idx = self._indices(host)
            idx.record_stream(stream)
            for part in itertools.chain.from_iterable(by_layer):
                self._relay(part, idx, packed, pack, self._pack_part, stream, self._write_part)
        done.record(stream)
        handle = SaveHandle(self, [ready, *packed, done])
        self._track(handle)
        return handle

    # -- the one-pass (Triton) kernel -------------------------------------------------

    def _flat(self, kind: str, key: int, elem: int) -> torch.Tensor:
        """A whole arena segment ("seg") or a layer's backing ("layer") as 1-D `elem`-byte
        elements (the Triton kernel's pointers)."""
        view = self._flat_views.get((kind, key, elem))
        if view is None:
            t = self.arena.segment(key) if kind == "seg" else self._layers[key].pages.backing
            view = t[: t.numel() // elem * elem].view(_DTYPES[elem])
            self._flat_views[(kind, key, elem)] = view
        return view

    def _plan_one_pass(
        self, segs: np.ndarray, offs: np.ndarray, ids: np.ndarray
    ) -> tuple[list[tuple[int, int, slice, slice]], np.ndarray]:
        """Groups of a range, each (segment the kernel addresses from, alignment of its
        slots, slot slice, id slice) into one host index array shared by every layer: one
        group whose slots are byte offsets from the lowest-addressed segment (so one launch
        per layer covers every segment), else one group per segment."""
        if self._seg_rel is not None:  # one group: slots as byte offsets from the lowest segment
            rel = self._seg_rel[segs] + offs
            align = _lowbit(int(np.bitwise_or.reduce(rel)) | 8) if rel.size else 8
            at = _even(rel.size)  # the ids' pointer 16-byte aligned, as the kernels were compiled
            host = np.zeros(at + ids.size, dtype=np.int64)
            host[: rel.size], host[at:] = rel, ids
            return [(self._base_seg, align, slice(0, rel.size), slice(at, at + ids.size))], host
        groups = _seg_groups(segs)
        out: list[tuple[int, int, slice, slice]] = []
        chunks: list[np.ndarray] = []
        cursor = 0
        pad = np.zeros(1, dtype=np.int64)
        for seg, pos in groups:  # every slice starts at an even position (a 16-byte aligned pointer)
            so = offs[pos]
            align = _lowbit(int(np.bitwise_or.reduce(so)) | 8)
            odd = [pad] if pos.size & 1 else []
            chunks += [so, *odd, ids[pos], *odd]
            at = cursor + _even(pos.size)
            out.append((seg, align, slice(cursor, cursor + pos.size), slice(at, at + pos.size)))
            cursor = at + _even(pos.size)
        return out, np.concatenate(chunks)

    def _copy_layer_one_pass(
        self, li: int, groups: list[tuple[int, int, slice, slice]], idx: torch.Tensor, *, to_pages: bool
    ) -> None:
        for seg, align, slot_sl, id_sl in groups:
            segment = functools.partial(self._flat, "seg", seg)
            self._launch(li, segment, idx[slot_sl], idx[id_sl], align, to_pages)

    def _launch(
        self,
        li: int,
        arena: Callable[[int], torch.Tensor],
        slots: torch.Tensor,
        ids: torch.Tensor,
        align: int,
        to_pages: bool,
        *,
        warm_up: bool = False,
    ) -> None:
        """One launch of the one-pass kernel for layer li, on the current stream: blocks at
        byte offsets `slots` of `arena(elem)` (slots aligned to `align`) <-> pages `ids`,
        in the widest element size both sides allow (`warm_up`: the kernel compiled, nothing
        moved)."""
        layer = self._layers[li]
        runs = self._runs[li]
        elem = max(e for e in runs if align % e == 0 and layer.offset % e == 0)
        self._triton.copy_runs(
            arena(elem),
            self._flat("layer", li, elem),
            slots,
            ids,
            layer_off=layer.offset,
            page_base=layer.pages.base,
            block_stride=layer.pages.block_stride,
            runs=runs[elem],
            elem=elem,
            to_pages=to_pages,
            warm_up=warm_up,
        )

    def _load_one_pass(self, batch: _Batch) -> LoadHandle:
        """Arena -> pages on the load stream, layer by layer (a "ready" event each)."""
        ready = self._take_events(self.num_layers)
        load = self.load_stream
        load.wait_stream(torch.cuda.current_stream(self.device))  # the pages may still be read
        plans: list[tuple[list[tuple[int, int, slice, slice]], torch.Tensor]] = []
        with torch.cuda.stream(load):
            for li in range(self.num_layers):
                for bi, b in enumerate(batch.ranges):
                    if li == 0:  # checked and planned here, while the earlier ranges' copies run
                        self._check_or_unwind(batch.check, b, bi > 0, ready, load=True)
                        groups, host = self._plan_one_pass(*batch.at(b))
                        plans.append((groups, self._indices(host)))
                    groups, idx = plans[bi]
                    self._copy_layer_one_pass(li, groups, idx, to_pages=True)
                ready[li].record(load)
        handle = LoadHandle(self, ready)
        self._track(handle)
        return handle

    def _save_one_pass(self, batch: _Batch, after: torch.cuda.Event | None) -> SaveHandle:
        """Pages -> arena on the save stream, after `after` (or the current stream's work)."""
        ready, done = self._take_events(2)
        stream = self.save_stream
        self._wait_for_pages(stream, after, ready)
        with torch.cuda.stream(stream):
            for bi, b in enumerate(batch.ranges):  # checked and planned while the earlier ranges' copies run
                self._check_or_unwind(batch.check, b, bi > 0, [ready, done], load=False)
                groups, host = self._plan_one_pass(*batch.at(b))
                idx = self._indices(host)
                for li in range(self.num_layers):
                    self._copy_layer_one_pass(li, groups, idx, to_pages=False)
        done.record(stream)
        handle = SaveHandle(self, [ready, done])
        self._track(handle)
        return handle

    def _save_part(self, part: _Part, idx: torch.Tensor) -> None:
        self._write_part(part, idx, self._pack_part(part, idx))

    def _pack_part(self, part: _Part, idx: torch.Tensor) -> torch.Tensor:
        pages = self._page_view(part.layer, part.elem)
        return pages.index_select(0, idx[part.ids])  # pages -> contiguous staging, logical order

    def _write_part(self, part: _Part, idx: torch.Tensor, staging: torch.Tensor) -> None:
        rows = self._rows(part.seg, part.unit, part.elem)
        rows.index_copy_(0, idx[part.rows], staging.view(-1, rows.shape[1]))

    def wait_saves(self, stream: torch.cuda.Stream | None = None) -> None:
        """Make `stream` (default: the current stream) wait until every save issued so far
        has read its pages - a device-side wait, no host synchronisation. For pages the
        engine is about to reuse while saves may still read them (vLLM preemption). A
        no-op on CPU, where saves complete inside `save()`."""
        if not self._cuda:
            return
        s = stream if stream is not None else torch.cuda.current_stream(self.device)
        # pages are read only on the pack stream (torch and dma kernels) or the save stream (triton)
        s.wait_stream(self.save_stream if self.kernel == "triton" else self.pack_stream)

    def drain(self) -> None:
        """Wait (host) for every copy this engine issued; the close/shutdown path."""
        if not self._cuda:
            return
        for stream in (self.load_stream, self.place_stream, self.pack_stream, self.save_stream):
            stream.synchronize()
        with self._lock:
            self._reap()
