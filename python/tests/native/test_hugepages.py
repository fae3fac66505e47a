"""`--hugepages 2MiB`: the arena on reserved 2 MiB pages, in the Manager and in every
client that maps it; too few free pages is a clear start-up error, never a fallback."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from orbitkv_testing import eventually

from orbitkv import _native

pytestmark = pytest.mark.native
HUGE = 2 << 20
FREE = Path("/sys/kernel/mm/hugepages/hugepages-2048kB/free_hugepages")
BB = 256 * 1024
FP = b"\x44" * 32


def free_huge_pages() -> int:
    if not FREE.exists():
        pytest.skip(f"this kernel has no 2 MiB hugetlb pages ({FREE} is missing)")
    return int(FREE.read_text())


def test_too_few_huge_pages_is_a_clear_startup_error(tmp_path) -> None:  # type: ignore[no-untyped-def]
    need = free_huge_pages() + 1
    r = subprocess.run(
        [sys.executable, "-m", "orbitkv", "serve", "--socket", str(tmp_path / "m.sock"), "--metrics-addr", "off",
         "--hugepages", "2MiB", "--dram-size", str(need * HUGE), "--segment-size", "2MiB"],
        capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert r.returncode != 0
    assert f"2 MiB huge pages: {need} pages must be free" in r.stderr and "vm.nr_hugepages" in r.stderr, r.stderr
    assert not (tmp_path / "m.sock").exists(), "nothing was served"


def test_huge_page_arena_is_shared_byte_exact_and_mapped_huge(manager_factory) -> None:  # type: ignore[no-untyped-def]
    free = free_huge_pages()
    if free < 8:
        pytest.skip(f"{free} free 2 MiB huge pages; 8 are needed (reserve with `sysctl vm.nr_hugepages`)")
    m = manager_factory("--hugepages", "2MiB", "--dram-size", "16MiB", "--segment-size", "8MiB")
    hs = [bytes([i]) * 32 for i in range(1, 9)]
    data = [bytes([i]) * (BB // 2) + bytes([255 - i]) * (BB // 2) for i in range(1, 9)]
    with _native.Client(m.socket) as a, _native.Client(m.socket) as b:
        assert a.stats()["dram_page_bytes"] == HUGE
        assert a.save(a.register_namespace(FP, BB), hs, data).stored == 8
        ns = b.register_namespace(FP, BB)
        lease = b.lookup(ns, hs)
        out = bytearray(8 * BB)
        b.restore(lease, out)
        b.release(lease)
        assert bytes(out) == b"".join(data)
    # A separate client process maps the arena on 2 MiB pages too.
    code = """
        import sys
        from orbitkv import _native
        c = _native.Client(sys.argv[1])
        sizes, inside = [], False
        for line in open("/proc/self/smaps"):
            if "-" in line.split()[0]:
                inside = "orbitkv-arena" in line
            elif inside and line.startswith("KernelPageSize:"):
                sizes.append(line.split()[1])
        print(" ".join(sizes))
        c.close()
        """
    r = subprocess.run([sys.executable, "-c", textwrap.dedent(code), m.socket], capture_output=True, text=True,
                       check=True)  # fmt: skip
    assert r.stdout.split() == ["2048", "2048"], r.stdout


def test_ssd_blocks_stage_byte_exact_into_a_huge_page_arena(manager_factory, tmp_path) -> None:  # type: ignore[no-untyped-def]
    """O_DIRECT reads from the SSD tier land in hugetlb arena slots, verified."""
    free = free_huge_pages()
    if free < 8:
        pytest.skip(f"{free} free 2 MiB huge pages; 8 are needed (reserve with `sysctl vm.nr_hugepages`)")
    m = manager_factory("--hugepages", "2MiB", "--dram-size", "16MiB", "--segment-size", "8MiB",
                        "--ssd-dir", str(tmp_path / "ssd"), "--ssd-capacity", "64MiB", "--ssd-mode", "direct",
                        "--ssd-write-policy", "eager")  # fmt: skip
    with _native.Client(m.socket) as c:
        ns = c.register_namespace(FP, BB)
        hs = [bytes([7, i]) + bytes(30) for i in range(128)]  # 32 MiB: twice the arena
        data = {h: bytes([h[1]]) * (BB // 2) + h * (BB // 64) for h in hs}
        for i in range(0, len(hs), 8):
            c.save(ns, hs[i : i + 8], [data[h] for h in hs[i : i + 8]])
            eventually(lambda n=i + 8: m.stats()["ssd_spilled_blocks_total"] >= n, "write-behind kept up")
        exact = 0
        for h in hs:
            lease = c.lookup(ns, [h])
            if lease.hit_blocks:
                buf = bytearray(BB)
                c.restore(lease, buf)
                c.release(lease)
                assert bytes(buf) == data[h], "a restored block differs"
                exact += 1
        st = c.stats()
        assert st["dram_page_bytes"] == HUGE and st["ssd_stage_failures_total"] == 0
        assert st["ssd_staged_blocks_total"] > 0 and exact >= 64, (exact, st["ssd_staged_blocks_total"])
