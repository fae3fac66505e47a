"""Arena segments as 1-D uint8 tensors: zero-copy CPU tensors, or CUDA tensors over the
same host memory after `cudaHostRegister` (unified virtual addressing).

CUDA runtime calls go through ctypes to the `libcudart` that torch itself loaded (found in
/proc/self/maps once CUDA is initialised; else in torch's lib directory or the `nvidia`
CUDA runtime package next to it): `torch.cuda.cudart()` exposes `cudaHostRegister` and
`cudaHostUnregister` but not `cudaHostGetDevicePointer`, and one runtime library for all
three calls keeps their error state in one place.
"""

from __future__ import annotations

import ctypes
import glob
import os
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch

from orbitkv.kvcopy.errors import CopyEngineError

CUDA_HOST_REGISTER_PORTABLE = 1
CUDA_HOST_REGISTER_MAPPED = 2
_FLAGS = CUDA_HOST_REGISTER_PORTABLE | CUDA_HOST_REGISTER_MAPPED
_MEMLOCK_FIX = (
    "pinning needs the segment's pages locked in RAM: raise RLIMIT_MEMLOCK (ulimit -l unlimited; "
    "in a container --ulimit memlock=-1) and make sure the container's memory limit covers the arena"
)


@dataclass
class _Registration:
    size: int
    device_ptr: int
    device: torch.device
    users: int


_lock = threading.Lock()
_registry: dict[int, _Registration] = {}  # host address -> registration, process-wide
_cudart: ctypes.CDLL | None = None


def pinned_segments() -> dict[int, tuple[int, int]]:
    """The process-wide pin registry: host address -> (size, number of ArenaViews using it)."""
    with _lock:
        return {addr: (r.size, r.users) for addr, r in _registry.items()}


def _find_cudart() -> str:
    try:
        with open("/proc/self/maps") as maps:
            for line in maps:
                path = line.rsplit(None, 1)[-1]
                if "/libcudart.so" in path and os.path.exists(path):
                    return path
    except OSError:
        pass
    torch_dir = os.path.dirname(torch.__file__)
    patterns = [
        os.path.join(torch_dir, "lib", "libcudart.so*"),
        os.path.join(os.path.dirname(torch_dir), "nvidia", "*", "lib", "libcudart.so*"),
    ]
    for pattern in patterns:
        found = sorted(glob.glob(pattern))
        if found:
            return found[-1]
    raise CopyEngineError(
        "cannot find the CUDA runtime library (libcudart) torch uses: it is neither loaded in this process "
        f"nor under {patterns}; install torch with its CUDA runtime (the nvidia CUDA runtime package)"
    )


def _runtime() -> ctypes.CDLL:
    global _cudart
    if _cudart is None:
        lib = ctypes.CDLL(_find_cudart())
        lib.cudaHostRegister.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_uint]
        lib.cudaHostUnregister.argtypes = [ctypes.c_void_p]
        lib.cudaHostGetDevicePointer.argtypes = [ctypes.POINTER(ctypes.c_void_p), ctypes.c_void_p, ctypes.c_uint]
        ptr, size = ctypes.c_void_p, ctypes.c_size_t
        lib.cudaMemcpyAsync.argtypes = [ptr, ptr, size, ctypes.c_int, ptr]
        lib.cudaGetErrorString.argtypes = [ctypes.c_int]
        lib.cudaGetErrorString.restype = ctypes.c_char_p
        fns = (lib.cudaHostRegister, lib.cudaHostUnregister, lib.cudaHostGetDevicePointer, lib.cudaMemcpyAsync)
        for fn in (*fns, lib.cudaGetLastError):
            fn.restype = ctypes.c_int
        _cudart = lib
    return _cudart


def _check(rc: int, call: str, fix: str) -> None:
    if rc == 0:
        return
    lib = _runtime()
    lib.cudaGetLastError()  # clear the sticky last error so torch's next launch check does not report ours
    name = (lib.cudaGetErrorString(rc) or b"?").decode(errors="replace")
    raise CopyEngineError(f"{call} failed: CUDA error {rc} ({name}); {fix}")


CUDA_MEMCPY_DEFAULT = 4  # the direction follows from the pointers (unified virtual addressing)


def memcpy_async(dst: int, src: int, nbytes: int, stream: int) -> None:
    """`cudaMemcpyAsync(dst, src, nbytes, cudaMemcpyDefault, stream)`: between pinned host
    memory (an ArenaView's segments, by host address) and device memory, on the GPU's copy
    engines; `stream` is a `torch.cuda.Stream.cuda_stream` handle."""
    _check(
        _runtime().cudaMemcpyAsync(dst, src, nbytes, CUDA_MEMCPY_DEFAULT, stream),
        f"cudaMemcpyAsync(0x{dst:x}, 0x{src:x}, {nbytes})",
        "report this: both ends must be pinned host memory or device memory of the engine's GPU",
    )


class _DeviceArray:
    """`__cuda_array_interface__` (v3) over a device pointer; torch keeps this object alive
    as long as the tensor it makes."""

    def __init__(self, ptr: int, nbytes: int) -> None:
        self.__cuda_array_interface__ = {"shape": (nbytes,), "typestr": "|u1", "data": (ptr, False), "version": 3}


def _register(seg: int, addr: int, size: int, device: torch.device, progress: Callable[[str], None] | None) -> int:
    with _lock:
        reg = _registry.get(addr)
        if reg is not None:
            if reg.size != size or reg.device != device:
                raise CopyEngineError(
                    f"arena segment {seg} at 0x{addr:x} ({size} bytes, {device}) overlaps a registration of "
                    f"{reg.size} bytes for {reg.device}: close every ArenaView before its Client, and use one "
                    "CUDA device per process"
                )
            reg.users += 1
            if progress is not None:
                progress(f"arena segment {seg} ({size} bytes) already pinned in this process; reusing it")
            return reg.device_ptr
        lib = _runtime()
        start = time.monotonic()
        with torch.cuda.device(device):
            _check(
                lib.cudaHostRegister(addr, size, _FLAGS),
                f"cudaHostRegister(0x{addr:x}, {size}, Portable|Mapped) for arena segment {seg}",
                _MEMLOCK_FIX,
            )
            dptr = ctypes.c_void_p()
            try:
                _check(
                    lib.cudaHostGetDevicePointer(ctypes.byref(dptr), addr, 0),
                    f"cudaHostGetDevicePointer(0x{addr:x}) for arena segment {seg}",
                    f"{device} must support mapped host memory (canMapHostMemory)",
                )
            except CopyEngineError:
                lib.cudaHostUnregister(addr)
                raise
        if not dptr.value:
            lib.cudaHostUnregister(addr)
            raise CopyEngineError(f"cudaHostGetDevicePointer returned NULL for arena segment {seg}")
        _registry[addr] = _Registration(size, int(dptr.value), device, 1)
        if progress is not None:
            progress(f"pinned arena segment {seg} ({size} bytes) for {device} in {time.monotonic() - start:.2f} s")
        return int(dptr.value)


def _unregister(addr: int) -> None:
    with _lock:
        reg = _registry.get(addr)
        if reg is None:
            return
        reg.users -= 1
        if reg.users > 0:
            return
        del _registry[addr]
        # A copy still reading or writing the segment would fault once it is unpinned.
        torch.cuda.synchronize(reg.device)
        _check(
            _runtime().cudaHostUnregister(addr),
            f"cudaHostUnregister(0x{addr:x})",
            "the segment was unmapped before its ArenaView was closed: close views before their Client",
        )


def _normalise(device: torch.device | str) -> torch.device:
    d = torch.device(device)
    if d.type == "cuda":
        if not torch.cuda.is_available():
            raise CopyEngineError(
                f"ArenaView on {d} needs CUDA, but torch.cuda.is_available() is False here; "
                "use device='cpu' for CPU pages"
            )
        if d.index is None:
            d = torch.device("cuda", torch.cuda.current_device())
    elif d.type != "cpu":
        raise CopyEngineError(f"ArenaView supports cpu and cuda devices, not {d}")
    return d


class ArenaView:
    """The arena segments mapped by one arena-mapped Client, as 1-D uint8 tensors on `device`.

    Valid while the Client is open: close the view (after draining every engine using it)
    before the Client. On CUDA each segment is pinned once per process; `progress` hears,
    per segment, how long pinning took or that an earlier pin is reused.
    """

    def __init__(self, client: Any, device: torch.device | str, *, progress: Callable[[str], None] | None = None):
        if getattr(client, "control_only", False):
            raise CopyEngineError("the Client was opened with map_arena=False; open it with map_arena=True")
        self.device = _normalise(device)
        self._tensors: dict[int, torch.Tensor] = {}
        self._sizes: dict[int, int] = {}
        self._hosts: dict[int, int] = {}
        self._pinned: list[int] = []
        try:
            for seg, _ in client.segments():
                addr, size = client.segment_address(seg)
                self._sizes[seg] = int(size)
                self._hosts[seg] = int(addr)
                if self.device.type == "cpu":
                    raw = (ctypes.c_uint8 * size).from_address(addr)
                    self._tensors[seg] = torch.frombuffer(raw, dtype=torch.uint8)
                    continue
                dptr = _register(seg, addr, size, self.device, progress)
                self._pinned.append(addr)
                with torch.cuda.device(self.device):
                    t = torch.as_tensor(_DeviceArray(dptr, size), device=self.device)
                if t.data_ptr() != dptr or t.device != self.device or t.numel() != size:
                    raise CopyEngineError(
                        f"torch did not wrap arena segment {seg} in place on {self.device} (got {t.device}, "
                        f"0x{t.data_ptr():x} for 0x{dptr:x}); use one CUDA device per process"
                    )
                self._tensors[seg] = t
        except BaseException:
            self.close()
            raise

    @property
    def sizes(self) -> dict[int, int]:
        """Segment id -> size in bytes."""
        return dict(self._sizes)

    def segment(self, seg_id: int) -> torch.Tensor:
        t = self._tensors.get(seg_id)
        if t is None:
            raise ValueError(f"unknown arena segment {seg_id}; this view has segments {sorted(self._tensors)}")
        return t

    def host_address(self, seg_id: int) -> int:
        """The segment's address in this process (pinned on CUDA: DMA reaches it there)."""
        self.segment(seg_id)  # the unknown-segment error
        return self._hosts[seg_id]

    def close(self) -> None:
        """Drop the tensors; unpin each segment once no view in this process uses it. Drain
        every CopyEngine over this view first."""
        self._tensors.clear()
        pinned, self._pinned = self._pinned, []
        for addr in pinned:
            _unregister(addr)

    def __enter__(self) -> ArenaView:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
