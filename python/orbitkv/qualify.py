"""`orbitkv qualify`: check and measure, on the host where OrbitKV is to run, what it needs.

Each item prints a verdict (`ok`, `warn`, `fail`, `skip`), what was found or measured
and, unless it is ok, the fix. Every measurement runs against its baseline in the same
run, through a real Manager started in a private temporary directory with the sizing
flags given here (nothing of a running Manager is touched):

  socket_dir    the directory of the production socket: the Manager's own rules (a
                private directory of this uid, not a symlink, not writable by others);
  memlock       RLIMIT_MEMLOCK against the arena (GPU engines pin it: cudaHostRegister);
  hugepages     free huge pages against --hugepages;
  ssd_direct_io O_DIRECT reads of --ssd-dir vs plain (page-cache) reads of the same file;
  manager       a Manager with these flags starts (its own refusal otherwise: every
                start-up limit of docs/operations.md), the SSD tier's I/O engine;
  arena_copy    save and restore through that Manager vs memcpy of the same bytes;
  gpu_pin       cudaHostRegister of the whole arena (the engine worker's first step);
  copy_engine   the copy engine the vLLM worker uses (arena slots -> KV pages) vs one
                contiguous copy of the same bytes from pinned memory (on --device).

Exit status: 0 when no item failed, 1 when one did, 2 for bad arguments.
"""

from __future__ import annotations

import argparse
import ctypes
import json
import mmap
import os
import resource
import shutil
import stat
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from orbitkv.launch import ManagerStartError, serve_command, stop_process, wait_until_serving

GIB = 1 << 30
MIB = 1 << 20
_UNITS = {"": 1, "b": 1, "k": 1 << 10, "kib": 1 << 10, "kb": 1 << 10, "m": MIB, "mib": MIB, "mb": MIB}
_UNITS |= {"g": GIB, "gib": GIB, "gb": GIB, "t": 1 << 40, "tib": 1 << 40, "tb": 1 << 40}
# Below these shares of the same run's baseline an item warns (docs/performance.md: the
# DRAM path's goal is 0.9x memcpy; the copy engine measured 0.86-0.92x pinned DMA).
ARENA_COPY_WARN = 0.9
COPY_ENGINE_WARN = 0.8
SSD_DIRECT_WARN = 0.5
CAP_IPC_LOCK = 14


def parse_size(s: str) -> int:
    """Bytes of a size as `orbitkv serve` reads it: an integer and an optional unit (K, KiB,
    M, MiB, G, GiB, T, TiB; binary multiples)."""
    t = s.strip()
    digits = len(t) - len(t.lstrip("0123456789"))
    unit = t[digits:].strip().lower()
    if digits == 0 or unit not in _UNITS:
        raise ValueError(f"invalid size {s!r} (expected e.g. 4GiB, 512MiB, 65536)")
    return int(t[:digits]) * _UNITS[unit]


def _size(n: float) -> str:
    return f"{n / GIB:.2f} GiB" if n >= GIB else f"{n / MIB:.1f} MiB"


@dataclass
class Item:
    name: str
    verdict: str  # ok | warn | fail | skip
    found: str
    fix: str | None = None
    data: dict[str, Any] = field(default_factory=dict)


@dataclass
class Plan:
    dram_bytes: int
    flags: list[str]  # the sizing flags the temporary Manager starts with
    hugepages: str
    socket: str
    ssd_dir: str | None
    ssd_bytes: int
    block_bytes: int
    copy_bytes: int
    device: str
    reps: int
    progress: Callable[[str], None]


# ---------------------------------------------------------------------------------------
# Host checks (no Manager)
# ---------------------------------------------------------------------------------------


def check_socket_dir(socket: str) -> Item:
    """The Manager's rules for the socket's directory (server.rs `private_dir`)."""
    d = Path(socket).parent
    private = "choose a --socket in a directory of your own that only you can write (mode 0700)"
    try:
        m = os.lstat(d)
    except FileNotFoundError:
        return Item("socket_dir", "ok", f"{d} does not exist yet: the Manager creates it with mode 0700")
    except OSError as e:
        return Item("socket_dir", "fail", f"{d}: {e.strerror}", private)
    mode = stat.S_IMODE(m.st_mode)
    data = {"dir": str(d), "mode": f"{mode:04o}", "uid": m.st_uid}
    if stat.S_ISLNK(m.st_mode):
        return Item(
            "socket_dir", "fail", f"{d} is a symbolic link", f"name the real directory in --socket, or {private}"
        )
    if not stat.S_ISDIR(m.st_mode):
        return Item("socket_dir", "fail", f"{d} is not a directory", private, data)
    if mode & 0o022 and mode & 0o1000:
        return Item("socket_dir", "fail", f"{d} is a shared directory (mode {mode:04o}, like /tmp)", private, data)
    if m.st_uid != os.geteuid():
        return Item(
            "socket_dir",
            "fail",
            f"{d} is owned by uid {m.st_uid}, not by this uid {os.geteuid()}",
            f"remove it (check what it holds first) or {private}",
            data,
        )
    if mode & 0o022:
        return Item(
            "socket_dir", "fail", f"{d} is writable by group or others (mode {mode:04o})", f"chmod 700 {d}", data
        )
    return Item("socket_dir", "ok", f"{d} is private to uid {m.st_uid} (mode {mode:04o})", None, data)


def _has_cap_ipc_lock() -> bool:
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("CapEff:"):
                return bool(int(line.split()[1], 16) >> CAP_IPC_LOCK & 1)
    except OSError:
        pass
    return False


def gpu_host() -> bool:
    """An NVIDIA driver with at least one GPU is loaded (no torch needed to tell)."""
    try:
        return any(Path("/proc/driver/nvidia/gpus").iterdir())
    except OSError:
        return False


def check_memlock(dram_bytes: int) -> Item:
    soft, hard = resource.getrlimit(resource.RLIMIT_MEMLOCK)
    shown = "unlimited" if soft == resource.RLIM_INFINITY else _size(soft)
    data = {"soft": soft, "hard": hard, "arena_bytes": dram_bytes, "cap_ipc_lock": _has_cap_ipc_lock()}
    if soft == resource.RLIM_INFINITY or soft >= dram_bytes:
        return Item("memlock", "ok", f"RLIMIT_MEMLOCK {shown} covers the {_size(dram_bytes)} arena", None, data)
    if data["cap_ipc_lock"]:
        return Item("memlock", "ok", f"RLIMIT_MEMLOCK {shown}, but this process holds CAP_IPC_LOCK", None, data)
    found = f"RLIMIT_MEMLOCK {shown} is below the {_size(dram_bytes)} arena"
    fix = (
        "engine processes pin the whole arena (cudaHostRegister) to copy to and from the GPU: raise the limit "
        "for them (ulimit -l unlimited; systemd LimitMEMLOCK=infinity; a container --ulimit memlock=-1)"
    )
    if gpu_host():
        return Item("memlock", "warn", found, fix, data)
    return Item("memlock", "ok", found + " (no GPU here: only GPU engines pin the arena)", None, data)


def check_hugepages(hugepages: str, dram_bytes: int) -> Item:
    sizes = {}
    for d in sorted(Path("/sys/kernel/mm/hugepages").glob("hugepages-*kB")):
        kib = int(d.name.removeprefix("hugepages-").removesuffix("kB"))
        sizes[kib << 10] = int((d / "free_hugepages").read_text())
    data: dict[str, Any] = {"free_pages": {str(k): v for k, v in sizes.items()}, "hugepages": hugepages}
    if hugepages == "off":
        offer = ", ".join(f"{n} free of {_size(k)}" for k, n in sizes.items() if n) or "none reserved"
        return Item(
            "hugepages",
            "ok",
            f"off (4 KiB pages); huge pages: {offer}. Restores run faster on huge pages (--hugepages 2MiB, "
            "docs/operations.md)",
            None,
            data,
        )
    page = parse_size(hugepages)
    need = -(-dram_bytes // page)
    free = sizes.get(page)
    data |= {"page_bytes": page, "needed": need, "free": free}
    if free is None:
        return Item(
            "hugepages", "fail", f"this kernel offers no {hugepages} huge pages", "use --hugepages 2MiB or off", data
        )
    if free < need:
        sysfs = f"/sys/kernel/mm/hugepages/hugepages-{page >> 10}kB/nr_hugepages"
        fix = (
            f"reserve {need - free} more: echo $(( $(cat {sysfs}) + {need - free} )) > {sysfs}"
            if page < GIB
            else f"1 GiB pages are reserved at boot: hugepagesz=1G hugepages={need} on the kernel command line"
        )
        return Item("hugepages", "fail", f"the arena needs {need} free {hugepages} pages, {free} are free", fix, data)
    return Item("hugepages", "ok", f"{free} free {hugepages} pages cover the arena's {need}", None, data)


def check_ssd_direct_io(ssd_dir: str, nbytes: int, block: int, reps: int) -> Item:
    """Write `nbytes` with O_DIRECT into a scratch file under `ssd_dir`, then read it with
    O_DIRECT and with plain reads after dropping its cached pages (the same file)."""
    base = Path(ssd_dir)
    if not base.is_dir():
        return Item("ssd_direct_io", "fail", f"--ssd-dir {ssd_dir} is not a directory", "create it first")
    fs = fs_type(base)
    if fs in ("tmpfs", "ramfs"):
        return Item(
            "ssd_direct_io",
            "fail",
            f"{ssd_dir} is on {fs}: memory, not an SSD; the SSD tier refuses it in --ssd-mode direct",
            "put --ssd-dir on a local filesystem on the SSD (ext4, xfs)",
            {"filesystem": fs},
        )
    scratch = base / f".orbitkv-qualify-{os.getpid()}"
    buf = mmap.mmap(-1, block)  # page-aligned, as O_DIRECT needs
    buf.write(os.urandom(block))
    n = max(1, nbytes // block)
    try:
        try:
            fd = os.open(scratch, os.O_CREAT | os.O_WRONLY | os.O_TRUNC | os.O_DIRECT, 0o600)
        except OSError as e:
            return Item(
                "ssd_direct_io",
                "fail",
                f"{ssd_dir} refuses O_DIRECT ({e.strerror}): the SSD tier's default --ssd-mode direct cannot use it",
                "put --ssd-dir on a local filesystem on the SSD (ext4, xfs), or run with --ssd-mode kernel "
                "(reads then go through the page cache)",
            )
        try:
            t0 = time.perf_counter()
            for _ in range(n):
                os.write(fd, buf)
            os.fsync(fd)
            write_s = time.perf_counter() - t0
        finally:
            os.close(fd)
        direct, plain = [], []
        for _ in range(reps):
            direct.append(_read_all(scratch, os.O_DIRECT, buf, n))
            os.posix_fadvise(_fd := os.open(scratch, os.O_RDONLY), 0, 0, os.POSIX_FADV_DONTNEED)
            os.close(_fd)
            plain.append(_read_all(scratch, 0, buf, n))
    except OSError as e:
        return Item("ssd_direct_io", "fail", f"I/O on {scratch} failed: {e}", "check the filesystem and free space")
    finally:
        buf.close()
        scratch.unlink(missing_ok=True)
    total = n * block
    d_gbps, p_gbps = total / statistics.median(direct) / 1e9, total / statistics.median(plain) / 1e9
    ratio = d_gbps / p_gbps
    data: dict[str, Any] = {
        "bytes": total,
        "block_bytes": block,
        "write_direct_gbps": total / write_s / 1e9,
        "read_direct_gbps": d_gbps,
        "read_plain_gbps": p_gbps,
        "ratio": ratio,
    }
    found = (
        f"O_DIRECT works; {_size(total)} in {_size(block)} reads: direct {d_gbps:.2f} GB/s vs plain {p_gbps:.2f} "
        f"GB/s ({ratio:.2f}x), direct writes {data['write_direct_gbps']:.2f} GB/s (one stream; the SSD tier keeps "
        "several I/Os in flight)"
    )
    data["filesystem"] = fs
    if ratio < SSD_DIRECT_WARN:
        return Item(
            "ssd_direct_io",
            "warn",
            found,
            "direct reads far below plain ones point at a filesystem that handles O_DIRECT poorly (network, "
            "overlay): use a local filesystem on the SSD, or --ssd-mode kernel",
            data,
        )
    return Item("ssd_direct_io", "ok", found, None, data)


def fs_type(path: Path) -> str | None:
    """The filesystem type of the mount holding `path` (/proc/self/mountinfo)."""
    real = os.path.realpath(path)
    best, kind = -1, None
    try:
        lines = Path("/proc/self/mountinfo").read_text().splitlines()
    except OSError:
        return None
    for line in lines:
        pre, _, post = line.partition(" - ")
        fields = pre.split()
        if len(fields) < 5 or not post:
            continue
        mnt = fields[4].replace("\\040", " ")
        inside = real == mnt or real.startswith(mnt.rstrip("/") + "/")
        if inside and len(mnt) >= best:  # the last of equal mount points is the one on top
            best, kind = len(mnt), post.split()[0]
    return kind


def _read_all(path: Path, flags: int, buf: mmap.mmap, n: int) -> float:
    fd = os.open(path, os.O_RDONLY | flags)
    try:
        t0 = time.perf_counter()
        for _ in range(n):
            if os.readv(fd, [buf]) != len(buf):
                raise OSError(f"short read from {path}")
        return time.perf_counter() - t0
    finally:
        os.close(fd)


# ---------------------------------------------------------------------------------------
# Through a temporary Manager
# ---------------------------------------------------------------------------------------


@contextmanager
def temporary_manager(plan: Plan, items: list[Item]) -> Iterator[str | None]:
    """A Manager with the plan's sizing flags on a private socket; yields its socket, or
    None (after appending the `manager` item that says why) when it did not start."""
    tmp = tempfile.mkdtemp(prefix="orbitkv-qualify-")
    sock = os.path.join(tmp, "manager.sock")
    flags = list(plan.flags)
    if plan.ssd_dir:
        flags += ["--ssd-dir", os.path.join(plan.ssd_dir, f".orbitkv-qualify-ssd-{os.getpid()}")]
    log_path = os.path.join(tmp, "manager.log")
    proc = None
    try:
        plan.progress(f"starting a Manager: {' '.join(flags)}")
        with open(log_path, "wb") as log:
            t0 = time.monotonic()
            proc = subprocess.Popen(serve_command(sock, *flags), stdout=log, stderr=log)
            try:
                wait_until_serving(proc, sock, timeout_s=300)
            except ManagerStartError as e:
                proc.wait(timeout=30)
                said = _last_error(Path(log_path).read_text(errors="replace")) or str(e)
                items.append(
                    Item(
                        "manager",
                        "fail",
                        f"a Manager with {' '.join(flags)} did not start: {said}",
                        "its message names the flag or the limit to change (docs/operations.md, Limits)",
                    )
                )
                yield None
                return
            started = time.monotonic() - t0
        items.append(_manager_item(sock, flags, started))
        yield sock
    finally:
        stop_process(proc)
        shutil.rmtree(tmp, ignore_errors=True)
        if plan.ssd_dir:
            shutil.rmtree(os.path.join(plan.ssd_dir, f".orbitkv-qualify-ssd-{os.getpid()}"), ignore_errors=True)


def _last_error(log: str) -> str | None:
    lines = [ln.strip() for ln in log.splitlines() if ln.strip()]
    for ln in reversed(lines):
        if "error" in ln.lower():
            return ln
    return lines[-1] if lines else None


def _manager_item(sock: str, flags: list[str], started_s: float) -> Item:
    from orbitkv import _native

    with _native.Client(sock, map_arena=False) as c:
        st = c.stats()
    segs = st["segment_sizes"]
    data = {
        "start_seconds": started_s,
        "segments": len(segs),
        "arena_bytes": st["dram_capacity_bytes"],
        "page_bytes": st["dram_page_bytes"],
    }
    found = (
        f"started in {started_s:.1f} s: {_size(st['dram_capacity_bytes'])} arena in {len(segs)} segment(s) "
        f"on {st['dram_page_bytes'] >> 10} KiB pages"
    )
    ssd = st.get("ssd", {})
    if ssd.get("enabled"):
        data["ssd"] = {"engine": ssd.get("engine"), "mode": ssd.get("mode"), "fallback": ssd.get("fallback_reason")}
        found += f"; SSD tier {ssd.get('mode')} mode on {ssd.get('engine')}"
        if ssd.get("fallback_reason"):
            return Item(
                "manager",
                "warn",
                found + f" (io_uring unavailable: {ssd['fallback_reason']})",
                "the pread/pwrite pool keeps fewer I/Os in flight: allow io_uring (sysctl kernel.io_uring_disabled=0; "
                "a container's seccomp profile may block io_uring_setup)",
                data,
            )
    return Item("manager", "ok", found, None, data)


def check_arena_copy(sock: str, plan: Plan) -> Item:
    """Save and restore through the Manager (begin_save + copy + commit; lookup + copy +
    release) against memcpy of the same bytes, median of `reps` rounds each."""
    from orbitkv import _native

    block = plan.block_bytes
    n = max(1, min(plan.copy_bytes, plan.dram_bytes // (plan.reps + 1)) // block)
    total = n * block
    src = bytearray(os.urandom(block)) * n
    dst = bytearray(total)
    mv_dst, mv_src = memoryview(dst), memoryview(src)
    mv_dst[:] = mv_src  # fault both in
    saves, restores, copies = [], [], []
    with _native.Client(sock) as c:
        ns = c.register_namespace(os.urandom(32), block)
        for _ in range(plan.reps):
            hashes = [os.urandom(32) for _ in range(n)]
            t0 = time.perf_counter()
            r = c.save(ns, hashes, src)
            saves.append(time.perf_counter() - t0)
            if r.stored != n:
                return Item(
                    "arena_copy",
                    "fail",
                    f"the Manager stored {r.stored} of {n} blocks ({r.refused} refused)",
                    "a larger --dram-size, or a smaller --copy-bytes",
                )
            ctypes.memset((ctypes.c_char * total).from_buffer(dst), 0, total)  # the restore must fill it
            t0 = time.perf_counter()
            lease = c.lookup(ns, hashes)
            got = c.restore(lease, dst)
            c.release(lease)
            restores.append(time.perf_counter() - t0)
            if lease.hit_blocks != n or got != total or dst != src:
                return Item(
                    "arena_copy",
                    "fail",
                    f"restored {lease.hit_blocks} of {n} blocks, {got} bytes, equal: {dst == src}",
                    "report this: a saved block must restore byte for byte",
                )
            t0 = time.perf_counter()
            mv_dst[:] = mv_src
            copies.append(time.perf_counter() - t0)
    gb = total / 1e9
    save_gbps, restore_gbps, memcpy_gbps = (gb / statistics.median(v) for v in (saves, restores, copies))
    data = {
        "bytes": total,
        "block_bytes": block,
        "save_gbps": save_gbps,
        "restore_gbps": restore_gbps,
        "memcpy_gbps": memcpy_gbps,
        "save_vs_memcpy": save_gbps / memcpy_gbps,
        "restore_vs_memcpy": restore_gbps / memcpy_gbps,
    }
    found = (
        f"{_size(total)} in {_size(block)} blocks: save {save_gbps:.1f} GB/s ({data['save_vs_memcpy']:.2f}x), "
        f"restore {restore_gbps:.1f} GB/s ({data['restore_vs_memcpy']:.2f}x) vs memcpy {memcpy_gbps:.1f} GB/s"
    )
    if min(data["save_vs_memcpy"], data["restore_vs_memcpy"]) < ARENA_COPY_WARN:
        return Item(
            "arena_copy",
            "warn",
            found,
            f"below {ARENA_COPY_WARN}x memcpy: other load on the host's cores or memory (measure again when idle); "
            "huge pages (--hugepages 2MiB) raise both (docs/performance.md, DRAM path)",
            data,
        )
    return Item("arena_copy", "ok", found, None, data)


def check_gpu(sock: str, plan: Plan) -> list[Item]:
    """`gpu_pin` and `copy_engine` on the plan's device (see the module docs)."""
    reason = _torch_device_reason(plan.device)
    if reason is not None:
        return [Item("gpu_pin", "skip", reason), Item("copy_engine", "skip", reason)]
    import torch

    from orbitkv import _native
    from orbitkv.kvcopy import ArenaView, CopyEngine, CopyEngineError, LayerPages

    device = torch.device("cuda" if plan.device == "auto" else plan.device)
    if device.type == "cuda" and device.index is None:
        device = torch.device("cuda", torch.cuda.current_device())
    items: list[Item] = []
    with _native.Client(sock) as c:
        t0 = time.perf_counter()
        try:
            view = ArenaView(c, device, progress=plan.progress)
        except CopyEngineError as e:
            return [Item("gpu_pin", "fail", str(e), None), Item("copy_engine", "skip", "the arena could not be pinned")]
        pin_s = time.perf_counter() - t0
        arena = sum(view.sizes.values())
        if device.type == "cuda":
            items.append(
                Item(
                    "gpu_pin",
                    "ok",
                    f"{_size(arena)} arena pinned for {device} in {pin_s:.2f} s ({arena / pin_s / 1e9:.1f} GB/s)",
                    None,
                    {"seconds": pin_s, "arena_bytes": arena, "device": str(device)},
                )
            )
        else:
            items.append(Item("gpu_pin", "skip", f"--device {device}: nothing to pin on a CPU"))
        try:
            items.append(_copy_engine_item(c, view, device, plan, CopyEngine, LayerPages))
        finally:
            view.close()
    return items


def _torch_device_reason(device: str) -> str | None:
    """None when `device` can be measured here, else why not."""
    try:
        import torch
    except ImportError:
        return "torch is not installed in this Python: install the engine's torch to qualify the GPU path"
    if device == "cpu":
        return None
    if not torch.cuda.is_available():
        why = "no GPU on this host" if not gpu_host() else "torch sees no CUDA device (CUDA_VISIBLE_DEVICES, driver)"
        return f"{why}; --device cpu measures the copy engine on CPU pages"
    return None


def _copy_engine_item(c: Any, view: Any, device: Any, plan: Plan, engine_cls: Any, pages_cls: Any) -> Item:
    import torch

    block = plan.block_bytes
    n = max(1, min(plan.copy_bytes, plan.dram_bytes // 2) // block)
    total = n * block
    ns = c.register_namespace(os.urandom(32), block)
    hashes = [os.urandom(32) for _ in range(n)]
    src = bytearray(os.urandom(block)) * n
    if c.save(ns, hashes, src).stored != n:
        return Item("copy_engine", "fail", f"the Manager did not store {n} blocks", "a larger --dram-size")
    backing = torch.empty(total, dtype=torch.uint8, device=device)
    pages = pages_cls(backing, 0, block, (block,), (1,), block, n)
    engine = engine_cls([pages], view)
    pinned = torch.empty(total, dtype=torch.uint8, pin_memory=device.type == "cuda")
    pinned.copy_(torch.frombuffer(src, dtype=torch.uint8))
    rng = torch.Generator().manual_seed(0)
    order = torch.randperm(n, generator=rng).tolist()  # random block ids, as an engine's pages are

    def sync() -> None:
        if device.type == "cuda":
            torch.cuda.synchronize(device)

    def load() -> None:
        engine.load(slots, order).synchronize()

    loads, copies = [], []
    lease = c.lookup(ns, hashes)
    try:
        slots = c.acquire(lease)
        for _ in range(plan.reps):
            sync()
            t0 = time.perf_counter()
            load()
            loads.append(time.perf_counter() - t0)
            t0 = time.perf_counter()
            backing.copy_(pinned, non_blocking=True)
            sync()
            copies.append(time.perf_counter() - t0)
        backing.zero_()
        sync()
        load()
        got = backing.view(n, block).cpu()
        want = torch.frombuffer(src, dtype=torch.uint8).view(n, block)
        equal = bool(torch.equal(got[order], want))
        engine.drain()
    finally:
        c.release(lease)
    if not equal:
        return Item("copy_engine", "fail", "restored pages differ from the saved bytes", "report this with the JSON")
    load_gbps, copy_gbps = (total / statistics.median(v) / 1e9 for v in (loads, copies))
    ratio = load_gbps / copy_gbps
    baseline = "contiguous pinned DMA" if device.type == "cuda" else "one contiguous copy"
    data = {
        "device": str(device),
        "kernel": engine.kernel,
        "bytes": total,
        "block_bytes": block,
        "load_gbps": load_gbps,
        "baseline_gbps": copy_gbps,
        "ratio": ratio,
    }
    found = (
        f"{engine.kernel} kernel on {device}: {n} random {_size(block)} blocks {load_gbps:.1f} GB/s vs {baseline} "
        f"{copy_gbps:.1f} GB/s ({ratio:.2f}x), pages verified"
    )
    if device.type == "cpu":
        found += (
            " (vLLM on CPU pages copies through the native client by default, measured by arena_copy; this is the "
            "opt-in orbitkv.copy_engine = 'torch' path)"
        )
    elif ratio < COPY_ENGINE_WARN:
        return Item(
            "copy_engine",
            "warn",
            found,
            f"below {COPY_ENGINE_WARN}x: check the GPU's PCIe link (nvidia-smi -q: link width and generation) "
            "and that the process runs on the GPU's NUMA node (docs/gpu.md)",
            data,
        )
    return Item("copy_engine", "ok", found, None, data)


# ---------------------------------------------------------------------------------------
# The command
# ---------------------------------------------------------------------------------------


def run(plan: Plan) -> list[Item]:
    items = [
        check_socket_dir(plan.socket),
        check_memlock(plan.dram_bytes),
        check_hugepages(plan.hugepages, plan.dram_bytes),
    ]
    if plan.ssd_dir is None:
        items.append(Item("ssd_direct_io", "skip", "no --ssd-dir given"))
    else:
        plan.progress(f"ssd_direct_io: {_size(plan.ssd_bytes)} under {plan.ssd_dir}")
        items.append(check_ssd_direct_io(plan.ssd_dir, plan.ssd_bytes, plan.block_bytes, plan.reps))
    with temporary_manager(plan, items) as sock:
        if sock is None:
            why = "the Manager did not start (see the manager item)"
            items += [Item(n, "skip", why) for n in ("arena_copy", "gpu_pin", "copy_engine")]
        else:
            plan.progress(f"arena_copy: {plan.reps} rounds of save + restore vs memcpy")
            items.append(check_arena_copy(sock, plan))
            items.extend(check_gpu(sock, plan))
    return items


def verdict(items: list[Item]) -> str:
    for v in ("fail", "warn"):
        if any(i.verdict == v for i in items):
            return v
    return "ok"


def main(argv: list[str]) -> int:
    from orbitkv import _native

    p = argparse.ArgumentParser(
        prog="orbitkv qualify",
        description="Check and measure what OrbitKV needs on this host; a verdict per item, with the fix.",
    )
    p.add_argument("--dram-size", default="1GiB", help="the arena you will run (as `orbitkv serve`) [1GiB]")
    p.add_argument("--segment-size", help="as `orbitkv serve` [auto]")
    p.add_argument("--hugepages", default="off", help="off, 2MiB or 1GiB, as `orbitkv serve` [off]")
    p.add_argument("--socket", help="the socket path you will serve on [the per-user default]")
    p.add_argument("--ssd-dir", help="the SSD tier's directory, to measure direct I/O there")
    p.add_argument("--ssd-bytes", default="1GiB", help="bytes written and read under --ssd-dir [1GiB]")
    p.add_argument("--ssd-capacity", help="the SSD tier capacity you will run, as `orbitkv serve` [its default, 16GiB]")
    p.add_argument("--block-size", default="2MiB", help="block size of every transfer [2MiB]")
    p.add_argument("--copy-bytes", default="256MiB", help="bytes per round of the copy measurements [256MiB]")
    p.add_argument("--device", default="auto", help="auto (CUDA if torch sees it), cpu, cuda or cuda:N [auto]")
    p.add_argument("--reps", type=int, default=3, help="rounds per measurement; medians reported [3]")
    p.add_argument("--json", action="store_true", help="print one JSON document instead of the table")
    a = p.parse_args(argv)
    try:
        dram = parse_size(a.dram_size)
        block, copy_bytes, ssd_bytes = parse_size(a.block_size), parse_size(a.copy_bytes), parse_size(a.ssd_bytes)
        hp = a.hugepages.lower()
        if hp not in ("off", "2mib", "1gib"):
            raise ValueError(f"--hugepages {a.hugepages!r} must be off, 2MiB or 1GiB")
        if block <= 0 or block % 4096:
            raise ValueError(f"--block-size {a.block_size} must be a positive multiple of 4 KiB (O_DIRECT)")
        if a.reps < 1:
            raise ValueError(f"--reps {a.reps} must be at least 1")
        if a.device not in ("auto", "cpu", "cuda") and not a.device.startswith("cuda:"):
            raise ValueError(f"--device {a.device!r} must be auto, cpu, cuda or cuda:N")
    except ValueError as e:
        print(f"orbitkv qualify: {e}", file=sys.stderr)
        return 2
    flags = ["--dram-size", a.dram_size, "--hugepages", a.hugepages]
    if a.segment_size:
        flags += ["--segment-size", a.segment_size]
    if a.ssd_capacity:
        if not a.ssd_dir:
            print("orbitkv qualify: --ssd-capacity needs --ssd-dir (the SSD tier's directory)", file=sys.stderr)
            return 2
        flags += ["--ssd-capacity", a.ssd_capacity]

    def progress(msg: str) -> None:
        print(f"orbitkv qualify: {msg}", file=sys.stderr, flush=True)

    plan = Plan(
        dram_bytes=dram,
        flags=flags,
        hugepages={"off": "off", "2mib": "2MiB", "1gib": "1GiB"}[hp],
        socket=a.socket or _native.default_socket_path(),
        ssd_dir=a.ssd_dir,
        ssd_bytes=ssd_bytes,
        block_bytes=block,
        copy_bytes=copy_bytes,
        device=a.device,
        reps=a.reps,
        progress=progress,
    )
    items = run(plan)
    v = verdict(items)
    if a.json:
        doc = {"verdict": v, "host": os.uname().nodename, "dram_bytes": dram, "items": [asdict(i) for i in items]}
        print(json.dumps(doc, indent=2))
    else:
        for i in items:
            print(f"{i.verdict:5} {i.name:14} {i.found}")
            if i.fix:
                print(f"{'':20} fix: {i.fix}")
        counts = {k: sum(i.verdict == k for i in items) for k in ("fail", "warn", "skip")}
        print(f"verdict: {v} ({counts['fail']} fail, {counts['warn']} warn, {counts['skip']} skipped)")
    return 1 if v == "fail" else 0
