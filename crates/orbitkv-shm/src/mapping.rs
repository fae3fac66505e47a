use std::os::fd::{AsFd, OwnedFd};
use std::ptr::NonNull;

use rustix::fs::{MemfdFlags, SealFlags};
use rustix::mm::{MapFlags, ProtFlags};

#[derive(Debug, thiserror::Error)]
pub enum ShmError {
    #[error("memfd_create: {0}")]
    Create(rustix::io::Errno),
    #[error("sizing the segment to {size} bytes: {err}")]
    Truncate { size: u64, err: rustix::io::Errno },
    #[error("sealing the segment: {0}")]
    Seal(rustix::io::Errno),
    #[error("mmap of {size} bytes: {err}")]
    Map { size: u64, err: rustix::io::Errno },
    #[error("fstat: {0}")]
    Stat(rustix::io::Errno),
    #[error("segment fd holds {actual} bytes, expected {expected}")]
    SizeMismatch { expected: u64, actual: u64 },
    #[error("range [{offset}, {offset}+{len}) is outside the {size}-byte segment")]
    OutOfBounds { offset: u64, len: u64, size: u64 },
    #[error(
        "a {len}-byte buffer at {addr:#x} overlaps the arena mapping itself; copy arena bytes \
         to or from memory outside the arena"
    )]
    Overlap { addr: usize, len: usize },
    #[error("a segment of {size} bytes is not a whole number of {page} pages")]
    Unaligned { size: u64, page: PageSize },
    #[error(
        "{size} bytes on {page} huge pages: {needed} pages must be free, the system has {free} free \
         ({path}); reserve them, e.g. `sysctl vm.nr_hugepages=<total>` (2 MiB) or at boot \
         (1 GiB), or run without huge pages"
    )]
    HugePages {
        size: u64,
        page: PageSize,
        needed: u64,
        free: u64,
        path: String,
    },
}

/// Page size backing a segment. Huge pages (hugetlbfs) cut page-table entries
/// 512-fold (2 MiB) and TLB misses on every copy; they must be reserved by the
/// operator beforehand (`vm.nr_hugepages`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum PageSize {
    /// The kernel's base pages (4 KiB on x86-64).
    #[default]
    Base,
    Huge2MiB,
    Huge1GiB,
}

impl PageSize {
    pub fn bytes(self) -> u64 {
        match self {
            PageSize::Base => 4096,
            PageSize::Huge2MiB => 2 << 20,
            PageSize::Huge1GiB => 1 << 30,
        }
    }

    /// The sysfs file with this size's free huge pages (None for base pages).
    pub fn free_pages_path(self) -> Option<String> {
        match self {
            PageSize::Base => None,
            huge => Some(format!(
                "/sys/kernel/mm/hugepages/hugepages-{}kB/free_hugepages",
                huge.bytes() >> 10
            )),
        }
    }

    /// Free huge pages of this size now (None for base pages or when unreadable).
    pub fn free_pages(self) -> Option<u64> {
        let text = std::fs::read_to_string(self.free_pages_path()?).ok()?;
        text.trim().parse().ok()
    }
}

impl std::fmt::Display for PageSize {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            PageSize::Base => "4 KiB",
            PageSize::Huge2MiB => "2 MiB",
            PageSize::Huge1GiB => "1 GiB",
        })
    }
}

/// A memfd segment owned by the Manager. Its size is sealed, so a client can
/// neither shrink it (which would fault the Manager) nor grow it.
#[derive(Debug)]
pub struct Segment {
    fd: OwnedFd,
    mapping: Mapping,
    page: PageSize,
}

impl Segment {
    /// Create, size, seal and populate a segment of `size` bytes backed by
    /// `page`-sized pages. Huge pages must be reserved: too few free ones is a
    /// clear error ([`ShmError::HugePages`]), never a silent fallback.
    pub fn create(name: &str, size: u64, page: PageSize) -> Result<Segment, ShmError> {
        let mut one = Self::create_arena(name, &[size], page, 1)?;
        one.pop().ok_or(ShmError::Unaligned { size, page })
    }

    /// Create every segment of an arena (`{name}-{i}`), then allocate and write
    /// all of their pages at once on `threads` threads, so start-up runs at the
    /// host's parallel first-touch rate whatever the segment sizes. Huge pages
    /// must be reserved: too few free ones is a clear error
    /// ([`ShmError::HugePages`]), never a silent fallback.
    pub fn create_arena(
        name: &str,
        sizes: &[u64],
        page: PageSize,
        threads: usize,
    ) -> Result<Vec<Segment>, ShmError> {
        let mut out = Vec::with_capacity(sizes.len());
        for (i, &size) in sizes.iter().enumerate() {
            let name = if sizes.len() == 1 {
                name.to_owned()
            } else {
                format!("{name}-{i}")
            };
            out.push(Self::create_unpopulated(&name, size, page)?);
        }
        let maps: Vec<&Mapping> = out.iter().map(|s| &s.mapping).collect();
        write_every_page(&maps, threads, page.bytes() as usize);
        Ok(out)
    }

    fn create_unpopulated(name: &str, size: u64, page: PageSize) -> Result<Segment, ShmError> {
        if size == 0 || !size.is_multiple_of(page.bytes()) {
            return Err(ShmError::Unaligned { size, page });
        }
        let mut flags = MemfdFlags::CLOEXEC | MemfdFlags::ALLOW_SEALING;
        match page {
            PageSize::Base => {}
            PageSize::Huge2MiB => flags |= MemfdFlags::HUGETLB | MemfdFlags::HUGE_2MB,
            PageSize::Huge1GiB => flags |= MemfdFlags::HUGETLB | MemfdFlags::HUGE_1GB,
        }
        let shortage = |page: PageSize| ShmError::HugePages {
            size,
            page,
            needed: size / page.bytes(),
            free: page.free_pages().unwrap_or(0),
            path: page.free_pages_path().unwrap_or_default(),
        };
        let fd = rustix::fs::memfd_create(name, flags).map_err(ShmError::Create)?;
        rustix::fs::ftruncate(&fd, size).map_err(|err| ShmError::Truncate { size, err })?;
        rustix::fs::fcntl_add_seals(&fd, SealFlags::SHRINK | SealFlags::GROW | SealFlags::SEAL)
            .map_err(ShmError::Seal)?;
        // A shared hugetlb mapping reserves its pages when it is mapped: ENOMEM
        // here means too few are free. The pages themselves are allocated by
        // `write_every_page`, in parallel across the whole arena.
        let mapping = match Mapping::map(&fd, size, false) {
            Err(ShmError::Map {
                err: rustix::io::Errno::NOMEM,
                ..
            }) if page != PageSize::Base => return Err(shortage(page)),
            other => other?,
        };
        Ok(Segment { fd, mapping, page })
    }

    pub fn page_size(&self) -> PageSize {
        self.page
    }

    pub fn fd(&self) -> &OwnedFd {
        &self.fd
    }

    pub fn mapping(&self) -> &Mapping {
        &self.mapping
    }

    pub fn size(&self) -> u64 {
        self.mapping.len() as u64
    }
}

/// A shared read-write mapping of a segment.
///
/// Bytes in the mapping are shared with other mappings of the same segment, in
/// this process and in every client, all read-write. The cache protocol
/// (leases, invisible slots until commit, quarantine), not this type, decides
/// who may write a range at a time. What this type guarantees:
///
/// - The safe copies ([`Mapping::write_at`], [`Mapping::read_at`]) check bounds
///   and refuse a caller buffer that overlaps this mapping; they access the
///   mapping only through raw pointers, never through references, so no Rust
///   reference to arena bytes exists unless a caller creates one.
/// - [`Mapping::slice`] and [`Mapping::slice_mut`] do create references, and are
///   `unsafe`: their callers must hold the cache-protocol right that makes the
///   range immutable (or exclusive) for the slice's lifetime. They take `&self`
///   because a mapping is shared by all session threads; exclusivity cannot be
///   expressed by `&mut self` and is the caller's obligation.
///
/// A client that breaks the cache protocol can change bytes under a copy or a
/// slice; the Manager treats arena bytes as opaque payload (never as lengths,
/// pointers or offsets it acts on) and verifies SSD reads by checksum, so such a
/// client corrupts cache contents, not the Manager's control state.
#[derive(Debug)]
pub struct Mapping {
    ptr: NonNull<u8>,
    len: usize,
}

// SAFETY: `Mapping` owns a process-wide mmap region with no thread affinity;
// moving it to another thread only moves the pointer and the munmap in `Drop`.
unsafe impl Send for Mapping {}
// SAFETY: the `&self` methods that touch bytes are the raw-pointer copies
// (`write_at`, `read_at`, `read_to_ptr`, `write_from_ptr`) and `prefault`; the
// region is shared memory that other processes may write concurrently anyway,
// and which ranges are written or read when is settled by the cache protocol.
// The methods that hand out references (`slice`, `slice_mut`) are `unsafe` and
// make their callers responsible for immutability or exclusivity across threads.
unsafe impl Sync for Mapping {}

impl Mapping {
    /// Map `size` bytes of `fd` shared and read-write. Checks that the file
    /// really is that large, so later accesses cannot fault. `populate` fills
    /// the page tables up front (costs ~80 ms per GiB at map time; the Manager
    /// uses it for huge pages, and writes base pages instead); clients map
    /// without it and take cheap minor faults on first touch of a page.
    pub fn map(fd: impl AsFd, size: u64, populate: bool) -> Result<Mapping, ShmError> {
        let st = rustix::fs::fstat(&fd).map_err(ShmError::Stat)?;
        let actual = u64::try_from(st.st_size).unwrap_or(0);
        if actual < size || size == 0 {
            return Err(ShmError::SizeMismatch {
                expected: size,
                actual,
            });
        }
        let len = usize::try_from(size).map_err(|_| ShmError::SizeMismatch {
            expected: size,
            actual,
        })?;
        // SAFETY: a fresh mapping at a kernel-chosen address (null hint), so it
        // cannot overlap any Rust-owned memory; the fd is valid for the call.
        let ptr = unsafe {
            rustix::mm::mmap(
                std::ptr::null_mut(),
                len,
                ProtFlags::READ | ProtFlags::WRITE,
                if populate {
                    MapFlags::SHARED | MapFlags::POPULATE
                } else {
                    MapFlags::SHARED
                },
                &fd,
                0,
            )
        }
        .map_err(|err| ShmError::Map { size, err })?;
        let ptr = NonNull::new(ptr.cast::<u8>()).ok_or(ShmError::Map {
            size,
            err: rustix::io::Errno::INVAL,
        })?;
        Ok(Mapping { ptr, len })
    }

    pub fn len(&self) -> usize {
        self.len
    }

    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Base address, for registering the mapping with a GPU runtime.
    pub fn as_ptr(&self) -> *mut u8 {
        self.ptr.as_ptr()
    }

    /// Refuse caller memory `[addr, addr+len)` that overlaps this mapping's
    /// addresses. (Another mapping of the same segment aliases the same pages
    /// at other addresses; copying between two mappings is not refused, and the
    /// cache protocol never asks for it.)
    fn check_disjoint(&self, addr: *const u8, len: usize) -> Result<(), ShmError> {
        let (a, base) = (addr as usize, self.ptr.as_ptr() as usize);
        let overlaps = len > 0 && a < base.saturating_add(self.len) && base < a.saturating_add(len);
        if overlaps {
            return Err(ShmError::Overlap { addr: a, len });
        }
        Ok(())
    }

    fn check(&self, offset: u64, len: usize) -> Result<usize, ShmError> {
        let end = offset.checked_add(len as u64);
        match end {
            Some(end) if end <= self.len as u64 => Ok(offset as usize),
            _ => Err(ShmError::OutOfBounds {
                offset,
                len: len as u64,
                size: self.len as u64,
            }),
        }
    }

    /// Copy `src` into the mapping at `offset`. `src` must lie outside the
    /// mapping ([`ShmError::Overlap`] otherwise).
    pub fn write_at(&self, offset: u64, src: &[u8]) -> Result<(), ShmError> {
        let off = self.check(offset, src.len())?;
        self.check_disjoint(src.as_ptr(), src.len())?;
        // SAFETY: `check` proved [off, off+len) lies inside the live mapping,
        // which is valid for writes; `src` is valid for reads of its length and
        // `check_disjoint` proved it does not overlap the mapping, so the two
        // regions are disjoint as `copy_nonoverlapping` requires.
        unsafe {
            std::ptr::copy_nonoverlapping(src.as_ptr(), self.ptr.as_ptr().add(off), src.len());
        }
        Ok(())
    }

    /// Copy from the mapping at `offset` into `dst`. `dst` must lie outside
    /// the mapping ([`ShmError::Overlap`] otherwise).
    pub fn read_at(&self, offset: u64, dst: &mut [u8]) -> Result<(), ShmError> {
        let off = self.check(offset, dst.len())?;
        self.check_disjoint(dst.as_ptr(), dst.len())?;
        // SAFETY: bounds proved by `check`, so the source is inside the live
        // mapping; `dst` is exclusively borrowed, valid for writes of its
        // length, and `check_disjoint` proved it does not overlap the mapping.
        unsafe {
            std::ptr::copy_nonoverlapping(self.ptr.as_ptr().add(off), dst.as_mut_ptr(), dst.len());
        }
        Ok(())
    }

    /// Fault in page-table entries for `[offset, offset+len)` as if written,
    /// without changing any byte (`MADV_POPULATE_WRITE`, Linux ≥ 5.14), so
    /// later copies take no first-touch faults. An optimisation only: callers
    /// may ignore the error on kernels without it.
    pub fn prefault(&self, offset: u64, len: usize) -> Result<(), ShmError> {
        let off = self.check(offset, len)?;
        // SAFETY: the range lies inside our live mapping; MADV_POPULATE_WRITE
        // only populates page tables and never modifies memory contents.
        unsafe {
            rustix::mm::madvise(
                self.ptr.as_ptr().add(off).cast(),
                len,
                rustix::mm::Advice::LinuxPopulateWrite,
            )
        }
        .map_err(|err| ShmError::Map {
            size: len as u64,
            err,
        })
    }

    /// Borrow `[offset, offset+len)` of the shared mapping as a slice.
    ///
    /// # Safety
    /// No one may write the range while the slice lives — not this process
    /// (through `write_at`, `slice_mut` or another mapping of the segment) and
    /// not a client: the caller must hold the cache-protocol right that freezes
    /// it (a committed block is never written again; a slot being spilled
    /// cannot be freed or reallocated). The slice borrows `self`, so it cannot
    /// outlive the mapping.
    pub unsafe fn slice(&self, offset: u64, len: usize) -> Result<&[u8], ShmError> {
        let off = self.check(offset, len)?;
        // SAFETY: `check` proved the range lies inside the live mapping, which
        // is readable and stays mapped while `&self` is borrowed; that nobody
        // writes it while the slice lives is the caller's obligation.
        Ok(unsafe { std::slice::from_raw_parts(self.ptr.as_ptr().add(off), len) })
    }

    /// Borrow `[offset, offset+len)` of the shared mapping mutably, from a
    /// shared `&self` (the mapping is shared by threads; see the type docs).
    ///
    /// # Safety
    /// For the slice's lifetime nothing else may read or write the range: no
    /// other slice over it (from this or any mapping of the segment), no copy
    /// through `read_at`/`write_at`, and no client. The caller must hold the
    /// cache-protocol right that makes it exclusive (e.g. a slot allocated for
    /// staging, whose location no client has been given). The slice borrows
    /// `self`, so it cannot outlive the mapping.
    #[allow(clippy::mut_from_ref)]
    pub unsafe fn slice_mut(&self, offset: u64, len: usize) -> Result<&mut [u8], ShmError> {
        let off = self.check(offset, len)?;
        // SAFETY: `check` proved the range lies inside the live mapping, which
        // is writable and stays mapped while `&self` is borrowed; exclusive
        // access for the slice's lifetime is the caller's obligation.
        Ok(unsafe { std::slice::from_raw_parts_mut(self.ptr.as_ptr().add(off), len) })
    }

    /// Copy from the mapping into raw memory owned by the caller. `dst` must
    /// lie outside the mapping ([`ShmError::Overlap`] otherwise).
    ///
    /// # Safety
    /// `dst` must be valid for writes of `len` bytes, and no Rust reference to
    /// those bytes may be in use during the call.
    pub unsafe fn read_to_ptr(&self, offset: u64, dst: *mut u8, len: usize) -> Result<(), ShmError> {
        let off = self.check(offset, len)?;
        self.check_disjoint(dst, len)?;
        // SAFETY: the source is inside the live mapping (`check`); `dst` is
        // valid for `len` writes (caller) and disjoint from the mapping
        // (`check_disjoint`), as `copy_nonoverlapping` requires.
        unsafe { std::ptr::copy_nonoverlapping(self.ptr.as_ptr().add(off), dst, len) };
        Ok(())
    }

    /// Copy raw caller memory into the mapping. `src` must lie outside the
    /// mapping ([`ShmError::Overlap`] otherwise).
    ///
    /// # Safety
    /// `src` must be valid for reads of `len` bytes, and nothing may write
    /// those bytes during the call.
    pub unsafe fn write_from_ptr(&self, offset: u64, src: *const u8, len: usize) -> Result<(), ShmError> {
        let off = self.check(offset, len)?;
        self.check_disjoint(src, len)?;
        // SAFETY: the destination is inside the live mapping (`check`); `src`
        // is valid for `len` reads (caller) and disjoint from the mapping
        // (`check_disjoint`), as `copy_nonoverlapping` requires.
        unsafe { std::ptr::copy_nonoverlapping(src, self.ptr.as_ptr().add(off), len) };
        Ok(())
    }
}

impl Drop for Mapping {
    fn drop(&mut self) {
        // SAFETY: ptr/len are exactly what mmap returned, unmapped once here.
        // Every slice from `slice`/`slice_mut` borrows `self` and the copies
        // complete before returning, so no reference into the region survives
        // this `&mut self`.
        let _ = unsafe { rustix::mm::munmap(self.ptr.as_ptr().cast(), self.len) };
    }
}

/// Threads the Manager populates its arena with: every core (first touch is
/// page-fault bound and scales with cores until memory bandwidth), at most 64.
pub fn populate_threads() -> usize {
    std::thread::available_parallelism()
        .map_or(1, |n| n.get())
        .clamp(1, 64)
}

/// Allocate and write every page of fresh mappings, on `threads` threads
/// taking chunks of 64 MiB, or of one page where pages are larger, from one
/// shared counter. On 1 GiB pages the kernel zeroes each page in one fault, so
/// a chunk is a whole page: threads fault different pages at once instead of
/// waiting on the same one (measured on the 16-core GPU host, 32 GiB: 8.5 s
/// with 64 MiB chunks).
///
/// `MAP_POPULATE` (and `MADV_POPULATE_WRITE`) allocate a shared mapping's
/// pages, but on some virtual machines the first store from user space to
/// each page still costs about a microsecond (measured on the GPU hosts:
/// 256 MiB took 72 ms to write the first time; a peer fill into never
/// written slots ran at half the speed of one into slots written before).
/// Writing the zeros the pages already hold pays that once, at start-up,
/// instead of in the first save, fill or staging that lands in each slot.
/// Only for mappings no one else can see yet (`Segment::create_arena`).
fn write_every_page(maps: &[&Mapping], threads: usize, page: usize) {
    let chunk = page.max(64 << 20);
    let chunks: Vec<(usize, usize)> = maps
        .iter()
        .flat_map(|m| {
            let (base, len) = (m.ptr.as_ptr() as usize, m.len);
            (0..len.div_ceil(chunk)).map(move |c| (base + c * chunk, chunk.min(len - c * chunk)))
        })
        .collect();
    let next = std::sync::atomic::AtomicUsize::new(0);
    let write = || {
        while let Some(&(at, n)) = chunks.get(next.fetch_add(1, std::sync::atomic::Ordering::Relaxed)) {
            // SAFETY: `[at, at + n)` lies inside one live, writable mapping
            // made by `Segment::create_unpopulated` and not yet visible to
            // anyone (no fd handed out, no slice borrowed); the shared counter
            // hands each chunk to exactly one thread. The pages hold zeros (a
            // fresh memfd) and are written with zeros.
            unsafe { std::ptr::write_bytes(at as *mut u8, 0, n) };
        }
    };
    let threads = threads.clamp(1, chunks.len().max(1));
    std::thread::scope(|scope| {
        for _ in 1..threads {
            let w = &write;
            if std::thread::Builder::new()
                .name("orbitkv-arena-init".into())
                .spawn_scoped(scope, w)
                .is_err()
            {
                break; // fewer threads: the others take its chunks
            }
        }
        write();
    });
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn segment_is_shared_between_mappings_and_sealed() {
        let seg = Segment::create("orbitkv-test", 1 << 16, PageSize::Base).expect("create");
        let other = Mapping::map(seg.fd(), 1 << 16, false).expect("map");
        seg.mapping().write_at(4096, b"hello").expect("write");
        let mut out = [0u8; 5];
        other.read_at(4096, &mut out).expect("read");
        assert_eq!(&out, b"hello");
        assert!(other.write_at((1 << 16) - 2, b"abc").is_err());
        assert!(other.read_at(u64::MAX, &mut out).is_err());
        // The size is sealed: shrinking must fail.
        assert!(rustix::fs::ftruncate(seg.fd(), 4096).is_err());
        assert!(
            Mapping::map(seg.fd(), 1 << 17, false).is_err(),
            "mapping past the end is refused"
        );
    }

    /// A base-page segment is allocated in full by `create` (written on
    /// several threads in 64 MiB chunks, the last one partial) and reads as
    /// zeros everywhere, chunk edges included.
    #[test]
    fn a_created_segment_is_allocated_and_zeroed_across_chunks() {
        let size: u64 = (2 * 64 + 3) << 20;
        let seg = Segment::create("orbitkv-test", size, PageSize::Base).expect("create");
        let st = rustix::fs::fstat(seg.fd()).expect("fstat");
        let allocated = u64::try_from(st.st_blocks).expect("blocks") * 512;
        assert!(
            allocated >= size,
            "{allocated} of {size} bytes allocated after create"
        );
        let m = seg.mapping();
        for off in [0, (64 << 20) - 1, 64 << 20, (128 << 20) + 7, size - 1] {
            let mut b = [9u8];
            m.read_at(off, &mut b).expect("read");
            assert_eq!(b[0], 0, "byte {off}");
        }
        // SAFETY: the segment is this test's own; no other slice or client.
        let all = unsafe { m.slice(0, size as usize) }.expect("slice");
        assert!(all.iter().all(|&b| b == 0));
    }

    /// A caller buffer inside the arena mapping is refused, not copied with
    /// `copy_nonoverlapping` over itself.
    #[test]
    fn copies_refuse_buffers_that_overlap_the_mapping() {
        let seg = Segment::create("orbitkv-test", 1 << 16, PageSize::Base).expect("create");
        let m = seg.mapping();
        m.write_at(0, &[7; 64]).expect("write");
        // SAFETY: nothing writes [0, 64) while `src` lives: the only writes
        // below go to [32, 96) and are refused before touching memory.
        let src = unsafe { m.slice(0, 64) }.expect("slice");
        for (offset, what) in [(4096u64, "elsewhere in the mapping"), (32, "overlapping range")] {
            let e = m.write_at(offset, src).expect_err(what);
            assert!(matches!(e, ShmError::Overlap { len: 64, .. }), "{what}: {e}");
        }
        // SAFETY: the range is inside the mapping and not otherwise borrowed.
        let dst = unsafe { m.slice_mut(8192, 64) }.expect("slice");
        let e = m.read_at(0, dst).expect_err("dst in the mapping");
        assert!(e.to_string().contains("overlaps the arena mapping"), "{e}");
        let (base, end) = (m.as_ptr(), m.as_ptr().wrapping_add(m.len()));
        // SAFETY: both pointers are in or at the end of the mapping; the calls
        // are refused before any byte is copied.
        unsafe {
            assert!(m.read_to_ptr(0, base.wrapping_add(100), 10).is_err());
            assert!(m.write_from_ptr(0, end.wrapping_sub(1), 1).is_err());
        }
        // A buffer outside the mapping (here on the stack) is copied as usual.
        let other = Mapping::map(seg.fd(), 1 << 16, false).expect("map");
        let mut out = [0u8; 64];
        other
            .read_at(0, &mut out)
            .expect("a stack buffer is outside the mapping");
        assert_eq!(out, [7; 64]);
    }

    #[test]
    fn huge_segment_sizes_must_be_whole_pages() {
        for (size, page) in [
            (4096, PageSize::Huge2MiB),
            (3 << 20, PageSize::Huge2MiB),
            (0, PageSize::Base),
        ] {
            assert!(matches!(
                Segment::create("orbitkv-test", size, page),
                Err(ShmError::Unaligned { .. })
            ));
        }
    }

    /// With free 2 MiB pages: a huge segment is shared, sealed and prefaultable
    /// from a second mapping. Asking for more pages than are free is always a
    /// clear `HugePages` error, never a silent base-page fallback.
    #[test]
    fn huge_segments_work_or_fail_clearly() {
        let page = PageSize::Huge2MiB;
        let Some(free) = page.free_pages() else {
            let e = Segment::create("orbitkv-test", page.bytes(), page).expect_err("no hugetlb support");
            assert!(
                matches!(e, ShmError::Create(_) | ShmError::HugePages { .. }),
                "{e}"
            );
            return;
        };
        let e = Segment::create("orbitkv-test", (free + 1) * page.bytes(), page).expect_err("too many");
        match &e {
            ShmError::HugePages { needed, .. } => assert_eq!(*needed, free + 1),
            other => panic!("expected a HugePages error, got {other}"),
        }
        assert!(e.to_string().contains("vm.nr_hugepages"), "{e}");
        if free < 2 {
            return; // the happy path runs in python/tests/native/test_hugepages.py, or skips there visibly
        }
        let size = 2 * page.bytes();
        let seg = Segment::create("orbitkv-test", size, page).expect("create");
        assert_eq!(seg.page_size(), page);
        let other = Mapping::map(seg.fd(), size, false).expect("map");
        other
            .prefault(0, size as usize)
            .expect("MADV_POPULATE_WRITE on hugetlb");
        other
            .write_at(page.bytes() - 2, b"span")
            .expect("write across the page boundary");
        let mut out = [0u8; 4];
        seg.mapping().read_at(page.bytes() - 2, &mut out).expect("read");
        assert_eq!(&out, b"span");
        assert!(rustix::fs::ftruncate(seg.fd(), page.bytes()).is_err(), "sealed");
    }
}
