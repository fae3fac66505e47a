"""Copies through the GPU's DMA copy engines (the `dma` kernel of `CopyEngine`).

The one-pass Triton kernel reads the pinned arena over PCIe from the GPU's SMs; this path
moves the bytes with `cudaMemcpyAsync` instead, the way a contiguous pinned copy does, and
does the (layer, page) placement on the device, where it costs HBM bandwidth only:

- load: per chunk of whole blocks, one `cudaMemcpyAsync` per run of adjacent arena slots
  into a device staging buffer (load stream), then per layer the Triton kernel places the
  chunk's pages from that buffer (place stream);
- save: per chunk, the Triton kernel packs the pages into a staging buffer (pack stream),
  then one `cudaMemcpyAsync` per run of adjacent slots writes it into the arena (save
  stream).

Staging buffers come from a ring per direction (`StagingRing`); the stream that fills a
buffer first waits for the stream that last emptied it (device-side events), so a batch
of any size runs through a few chunks of memory and the two halves overlap chunk by chunk.
Copy engines do not take SMs from the forward pass running beside them.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

import numpy as np
import torch

from orbitkv.kvcopy.arena import memcpy_async
from orbitkv.kvcopy.handles import LoadHandle, SaveHandle

if TYPE_CHECKING:
    from orbitkv.kvcopy.engine import CopyEngine

CHUNK_BYTES = 64 << 20  # one staging buffer: this many bytes of whole blocks (at least one block)
RING = 3  # staging buffers per direction


class StagingRing:
    """`RING` device buffers of `chunk` bytes, used in turn. `take(stream)` makes `stream`
    (the one about to fill the buffer) wait until the buffer's last reader is done; the
    caller records the returned event on the stream that empties it."""

    def __init__(self, device: torch.device, chunk: int, side: torch.cuda.Stream) -> None:
        self.buffers = [torch.empty(chunk, dtype=torch.uint8, device=device) for _ in range(RING)]
        self.free = [torch.cuda.Event() for _ in range(RING)]
        for e in self.free:  # created before any graph capture
            e.record(side)
        self._next = 0

    def take(self, filler: torch.cuda.Stream) -> tuple[torch.Tensor, torch.cuda.Event]:
        i = self._next
        self._next = (i + 1) % RING
        filler.wait_event(self.free[i])
        return self.buffers[i], self.free[i]


def slot_runs(addrs: np.ndarray, block_bytes: int) -> tuple[np.ndarray, np.ndarray]:
    """Maximal runs of adjacent slots in batch order: (first position, length) of each,
    where slot j+1 starts `block_bytes` after slot j. One memcpy per run."""
    if addrs.size == 0:
        return np.empty(0, dtype=np.int64), np.empty(0, dtype=np.int64)
    breaks = np.flatnonzero(np.diff(addrs) != block_bytes) + 1
    starts = np.concatenate(([0], breaks)).astype(np.int64)
    ends = np.concatenate((breaks, [addrs.size])).astype(np.int64)
    return starts, ends - starts


class DmaPath:
    """The `dma` kernel of one `CopyEngine` (CUDA pages; the engine has checked that the
    Triton kernel that places and packs pages can run)."""

    @staticmethod
    def ring_bytes(block_bytes: int) -> int:
        """Device memory both staging rings take for blocks of `block_bytes`."""
        return 2 * RING * max(1, CHUNK_BYTES // block_bytes) * block_bytes

    def __init__(self, engine: CopyEngine) -> None:
        self.e = engine
        bb = engine.block_bytes
        self.per_chunk = max(1, CHUNK_BYTES // bb)  # blocks per staging buffer
        self.stride = self.per_chunk + (self.per_chunk & 1)  # id positions per chunk (even)
        self.hosts = np.zeros(max(engine.arena.sizes, default=0) + 1, dtype=np.int64)
        for seg in engine.arena.sizes:
            self.hosts[seg] = engine.arena.host_address(seg)
        device = engine.device
        self.load_ring = StagingRing(device, self.per_chunk * bb, engine.load_stream)
        self.save_ring = StagingRing(device, self.per_chunk * bb, engine.save_stream)
        # staging slot j of a chunk: byte j * block_bytes of its buffer
        self.stage_slots = torch.arange(self.per_chunk, dtype=torch.int64, device=device) * bb
        self.align = bb & -bb
        engine.load_stream.synchronize()
        torch.cuda.current_stream(device).synchronize()

    def _chunks(self, n: int) -> list[slice]:
        return [slice(i, min(n, i + self.per_chunk)) for i in range(0, n, self.per_chunk)]

    def _padded(self, ids: np.ndarray, chunks: list[slice]) -> np.ndarray:
        """The block ids with chunk ci's at position ci * stride, stride even: every
        chunk's id pointer is 16-byte aligned, the alignment the kernels were compiled
        for (Triton specialises pointer arguments on it; another would compile a variant
        inside an engine step)."""
        out = np.zeros(len(chunks) * self.stride, dtype=np.int64)
        for ci, c in enumerate(chunks):
            out[ci * self.stride : ci * self.stride + (c.stop - c.start)] = ids[c]
        return out

    def _chunk_ids(self, ids_dev: torch.Tensor, ci: int, c: slice) -> torch.Tensor:
        return ids_dev[ci * self.stride : ci * self.stride + (c.stop - c.start)]

    def _memcpys(self, addrs: np.ndarray, buffer: torch.Tensor, stream: torch.cuda.Stream, *, to_arena: bool) -> None:
        """One cudaMemcpyAsync per run of adjacent slots of a chunk (`addrs`: host
        addresses, in batch order) between the arena and `buffer`, on `stream`."""
        bb = self.e.block_bytes
        base = buffer.data_ptr()
        handle = stream.cuda_stream
        starts, lengths = slot_runs(addrs, bb)
        for s, k in zip(starts.tolist(), lengths.tolist(), strict=True):
            host, dev = int(addrs[s]), base + s * bb
            if to_arena:
                memcpy_async(host, dev, k * bb, handle)
            else:
                memcpy_async(dev, host, k * bb, handle)

    def _place(self, buffer: torch.Tensor, ids: torch.Tensor, count: int, li: int, *, to_pages: bool) -> None:
        """The Triton kernel between chunk buffer `buffer` (blocks back to back) and layer
        li's pages, on the current stream."""
        e = self.e
        e._launch(li, lambda elem: buffer.view(e._dtype(elem)), self.stage_slots[:count], ids, self.align, to_pages)

    def load(self, segs: np.ndarray, offs: np.ndarray, ids: np.ndarray, check: Callable[[slice], None]) -> LoadHandle:
        e = self.e
        n_layers = e.num_layers
        ready = e._take_events(n_layers)
        gathered: list[torch.cuda.Event] = []
        dma, place = e.load_stream, e.place_stream
        place.wait_stream(torch.cuda.current_stream(e.device))  # the pages may still be read
        addrs = self.hosts[segs] + offs
        chunks = self._chunks(ids.size)
        with torch.cuda.stream(place):
            ids_dev = e._indices(self._padded(ids, chunks))
        for ci, c in enumerate(chunks):
            e._check_or_unwind(check, c, ci > 0, gathered + ready, load=True)
            buffer, free = self.load_ring.take(dma)
            self._memcpys(addrs[c], buffer, dma, to_arena=False)
            ev = e._take_events(1)[0]
            ev.record(dma)
            gathered.append(ev)
            place.wait_event(ev)
            last = ci == len(chunks) - 1
            with torch.cuda.stream(place):
                for li in range(n_layers):
                    self._place(buffer, self._chunk_ids(ids_dev, ci, c), c.stop - c.start, li, to_pages=True)
                    if last:
                        ready[li].record(place)
            free.record(place)
        if not chunks:
            for r in ready:
                r.record(place)
        handle = LoadHandle(e, gathered + ready)
        e._track(handle)
        return handle

    def save(
        self,
        segs: np.ndarray,
        offs: np.ndarray,
        ids: np.ndarray,
        after: torch.cuda.Event | None,
        check: Callable[[slice], None],
    ) -> SaveHandle:
        e = self.e
        ready, done = e._take_events(2)
        packed: list[torch.cuda.Event] = []
        pack, stream = e.pack_stream, e.save_stream
        e._wait_for_pages(pack, after, ready)
        addrs = self.hosts[segs] + offs
        chunks = self._chunks(ids.size)
        with torch.cuda.stream(pack):
            ids_dev = e._indices(self._padded(ids, chunks))
        for ci, c in enumerate(chunks):
            e._check_or_unwind(check, c, ci > 0, [ready, done, *packed], load=False)
            buffer, free = self.save_ring.take(pack)
            with torch.cuda.stream(pack):
                for li in range(e.num_layers):
                    self._place(buffer, self._chunk_ids(ids_dev, ci, c), c.stop - c.start, li, to_pages=False)
            ev = e._take_events(1)[0]
            ev.record(pack)
            packed.append(ev)
            stream.wait_event(ev)
            self._memcpys(addrs[c], buffer, stream, to_arena=True)
            free.record(stream)
        done.record(stream)
        handle = SaveHandle(e, [ready, *packed, done])
        e._track(handle)
        return handle
