//! The only module with `unsafe`: aligned buffers and the two I/O engines
//! (io_uring rings on dedicated threads, and a pread/pwrite thread pool).
//!
//! Callers hand in borrowed buffers through [`Engine::submit`], which blocks until every
//! request has completed, so the borrows outlive all kernel access to them. If a worker
//! thread dies while a request may still be in flight the process aborts rather than
//! return buffers the kernel could still write to.
#![allow(unsafe_code)]

use std::alloc::{Layout, alloc_zeroed, dealloc};
use std::io;
use std::os::fd::{AsRawFd, BorrowedFd, RawFd};
use std::ptr::NonNull;
use std::sync::mpsc;
use std::thread::JoinHandle;

use io_uring::{IoUring, opcode, types};

/// Alignment of [`AlignedBuf`] (O_DIRECT needs logical-block alignment; 4 KiB covers all disks).
pub(crate) const ALIGN: usize = 4096;

/// A zero-initialised heap buffer aligned to [`ALIGN`], length a multiple of [`ALIGN`].
pub(crate) struct AlignedBuf {
    ptr: NonNull<u8>,
    len: usize,
}

// SAFETY: AlignedBuf owns its allocation exclusively, like a Box<[u8]>.
unsafe impl Send for AlignedBuf {}
// SAFETY: shared references only give out &[u8].
unsafe impl Sync for AlignedBuf {}

impl AlignedBuf {
    /// Allocate at least `len` bytes (rounded up to [`ALIGN`], minimum one sector).
    pub(crate) fn zeroed(len: usize) -> io::Result<AlignedBuf> {
        let cap = len
            .max(1)
            .checked_next_multiple_of(ALIGN)
            .ok_or_else(|| io::Error::from(io::ErrorKind::OutOfMemory))?;
        let layout =
            Layout::from_size_align(cap, ALIGN).map_err(|_| io::Error::from(io::ErrorKind::OutOfMemory))?;
        // SAFETY: layout has non-zero size (cap >= ALIGN).
        let raw = unsafe { alloc_zeroed(layout) };
        let ptr = NonNull::new(raw).ok_or_else(|| io::Error::from(io::ErrorKind::OutOfMemory))?;
        Ok(AlignedBuf { ptr, len: cap })
    }

    pub(crate) fn as_slice(&self) -> &[u8] {
        // SAFETY: ptr is a live allocation of len initialised (zeroed) bytes owned by self.
        unsafe { std::slice::from_raw_parts(self.ptr.as_ptr(), self.len) }
    }

    pub(crate) fn as_mut_slice(&mut self) -> &mut [u8] {
        // SAFETY: as above, and &mut self guarantees exclusive access.
        unsafe { std::slice::from_raw_parts_mut(self.ptr.as_ptr(), self.len) }
    }
}

impl Drop for AlignedBuf {
    fn drop(&mut self) {
        // The layout was valid at allocation time with the same values.
        if let Ok(layout) = Layout::from_size_align(self.len, ALIGN) {
            // SAFETY: ptr came from alloc_zeroed with exactly this layout.
            unsafe { dealloc(self.ptr.as_ptr(), layout) };
        }
    }
}

/// Buffers of one request: up to two segments (header sector, payload).
pub(crate) enum Bufs<'a> {
    Write(&'a [u8], &'a [u8]),
    Read(&'a mut [u8], &'a mut [u8]),
}

/// One positional vectored read or write.
pub(crate) struct IoReq<'a> {
    pub(crate) fd: BorrowedFd<'a>,
    pub(crate) offset: u64,
    pub(crate) bufs: Bufs<'a>,
    /// Reads only: after a complete transfer, checksum (xxh3-64) this many bytes at the start
    /// of the second segment on the I/O thread, overlapping the other requests' I/O.
    pub(crate) hash_len: usize,
}

/// Outcome of one request.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Done {
    /// Bytes transferred (short only at end of file on reads).
    pub(crate) bytes: usize,
    /// Checksum of the requested prefix of segment 2, if asked for and the transfer was full.
    pub(crate) hash: Option<u64>,
}

type Reply = Vec<(usize, io::Result<Done>)>;

/// A request lowered to raw pointers for the worker threads.
struct RawReq {
    fd: RawFd,
    offset: u64,
    write: bool,
    iov: [libc::iovec; 2],
    niov: u32,
    total: usize,
    hash_len: usize,
    /// Index in the caller's request slice.
    idx: usize,
}

struct Job {
    reqs: Vec<RawReq>,
    reply: mpsc::Sender<Reply>,
}

// SAFETY: the raw pointers in a Job point into buffers that the submitting thread keeps
// borrowed (and does not touch) until the job's reply arrives; see Engine::submit.
unsafe impl Send for Job {}

/// A pool of I/O worker threads.
pub(crate) struct Engine {
    workers: Vec<mpsc::Sender<Job>>,
    handles: Vec<JoinHandle<()>>,
}

impl Engine {
    /// Set up `threads` io_uring rings of `depth` entries, each probed with a NOP.
    pub(crate) fn uring(threads: usize, depth: u32) -> io::Result<Engine> {
        let mut rings = Vec::with_capacity(threads);
        for _ in 0..threads.max(1) {
            let mut ring = IoUring::new(depth)?;
            probe_nop(&mut ring)?;
            rings.push(ring);
        }
        let mut e = Engine {
            workers: Vec::new(),
            handles: Vec::new(),
        };
        for (i, ring) in rings.into_iter().enumerate() {
            let (tx, rx) = mpsc::channel::<Job>();
            let qd = depth as usize;
            let h = std::thread::Builder::new()
                .name(format!("orbitkv-ssd-uring-{i}"))
                .spawn(move || uring_worker(ring, rx, qd))?;
            e.workers.push(tx);
            e.handles.push(h);
        }
        Ok(e)
    }

    /// A pool of `threads` pread/pwrite workers.
    pub(crate) fn psync(threads: usize) -> io::Result<Engine> {
        let mut e = Engine {
            workers: Vec::new(),
            handles: Vec::new(),
        };
        for i in 0..threads.max(1) {
            let (tx, rx) = mpsc::channel::<Job>();
            let h = std::thread::Builder::new()
                .name(format!("orbitkv-ssd-psync-{i}"))
                .spawn(move || psync_worker(rx))?;
            e.workers.push(tx);
            e.handles.push(h);
        }
        Ok(e)
    }

    /// Run all requests, spread over the workers, and wait for every one. Result `i` belongs
    /// to request `i`.
    pub(crate) fn submit(&self, reqs: &mut [IoReq<'_>]) -> Vec<io::Result<Done>> {
        let n = reqs.len();
        let mut out: Vec<io::Result<Done>> = (0..n).map(|_| Err(io::Error::other("not executed"))).collect();
        if n == 0 {
            return out;
        }
        let raw: Vec<RawReq> = reqs.iter_mut().enumerate().map(|(i, r)| lower(i, r)).collect();
        let nworkers = self.workers.len().min(n).max(1);
        // Interleave so that each worker gets a share of neighbouring requests.
        let mut per: Vec<Vec<RawReq>> = (0..nworkers).map(|_| Vec::new()).collect();
        for (i, r) in raw.into_iter().enumerate() {
            per[i % nworkers].push(r);
        }
        let (tx, rx) = mpsc::channel();
        let mut outstanding = 0usize;
        for (w, reqs) in per.into_iter().enumerate() {
            if reqs.is_empty() {
                continue;
            }
            let job = Job {
                reqs,
                reply: tx.clone(),
            };
            match self.workers[w].send(job) {
                Ok(()) => outstanding += 1,
                Err(mpsc::SendError(job)) => {
                    // Never reached a worker: no I/O was started for it.
                    for r in job.reqs {
                        out[r.idx] = Err(io::Error::other("I/O worker thread is gone"));
                    }
                }
            }
        }
        drop(tx);
        while outstanding > 0 {
            match rx.recv() {
                Ok(results) => {
                    for (idx, res) in results {
                        out[idx] = res;
                    }
                    outstanding -= 1;
                }
                Err(_) => {
                    // A worker died with requests that may still be in flight in the kernel;
                    // returning would hand buffers the kernel may still write to back to the
                    // caller.
                    eprintln!("orbitkv-ssd: I/O worker died with I/O in flight; aborting");
                    std::process::abort();
                }
            }
        }
        out
    }
}

impl Drop for Engine {
    fn drop(&mut self) {
        self.workers.clear();
        for h in self.handles.drain(..) {
            let _ = h.join();
        }
    }
}

fn lower(idx: usize, r: &mut IoReq<'_>) -> RawReq {
    let (write, a, b) = match &mut r.bufs {
        Bufs::Write(a, b) => (
            true,
            libc::iovec {
                iov_base: a.as_ptr() as *mut libc::c_void,
                iov_len: a.len(),
            },
            libc::iovec {
                iov_base: b.as_ptr() as *mut libc::c_void,
                iov_len: b.len(),
            },
        ),
        Bufs::Read(a, b) => (
            false,
            libc::iovec {
                iov_base: a.as_mut_ptr().cast(),
                iov_len: a.len(),
            },
            libc::iovec {
                iov_base: b.as_mut_ptr().cast(),
                iov_len: b.len(),
            },
        ),
    };
    let niov = if b.iov_len == 0 { 1 } else { 2 };
    let hash_len = if write { 0 } else { r.hash_len.min(b.iov_len) };
    RawReq {
        hash_len,
        fd: r.fd.as_raw_fd(),
        offset: r.offset,
        write,
        total: a.iov_len + b.iov_len,
        iov: [a, b],
        niov,
        idx,
    }
}

fn probe_nop(ring: &mut IoUring) -> io::Result<()> {
    let nop = opcode::Nop::new().build().user_data(u64::MAX);
    // SAFETY: a NOP references no memory.
    unsafe { ring.submission().push(&nop) }
        .map_err(|_| io::Error::other("io_uring submission queue full during probe"))?;
    loop {
        match ring.submit_and_wait(1) {
            Ok(_) => break,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
            Err(e) => return Err(e),
        }
    }
    match ring.completion().next() {
        Some(c) if c.result() >= 0 => Ok(()),
        Some(c) => Err(io::Error::from_raw_os_error(-c.result())),
        None => Err(io::Error::other("io_uring NOP probe returned no completion")),
    }
}

/// Positional vectored I/O of `r` starting `done` bytes in, looping over short transfers.
/// Returns total bytes transferred (less than `r.total` only at end of file on reads).
fn finish_sync(r: &RawReq, mut done: usize) -> io::Result<usize> {
    // SAFETY: r.fd is borrowed by the submitting thread for the whole call.
    let fd = unsafe { BorrowedFd::borrow_raw(r.fd) };
    while done < r.total {
        let mut skip = done;
        let mut segs: Vec<(*mut u8, usize)> = Vec::with_capacity(2);
        for v in &r.iov[..r.niov as usize] {
            if skip >= v.iov_len {
                skip -= v.iov_len;
                continue;
            }
            // SAFETY: skip < iov_len, so the pointer stays inside the segment.
            let p = unsafe { v.iov_base.cast::<u8>().add(skip) };
            segs.push((p, v.iov_len - skip));
            skip = 0;
        }
        let off = r.offset + done as u64;
        let res = if r.write {
            let slices: Vec<io::IoSlice<'_>> = segs
                .iter()
                // SAFETY: each segment lies inside a buffer the submitter keeps borrowed and
                // unaliased for the whole call (Engine::submit blocks until we reply).
                .map(|&(p, l)| io::IoSlice::new(unsafe { std::slice::from_raw_parts(p, l) }))
                .collect();
            rustix::io::pwritev(fd, &slices, off)
        } else {
            let mut slices: Vec<io::IoSliceMut<'_>> = segs
                .iter()
                // SAFETY: as above; read segments come from distinct &mut borrows, so they
                // do not overlap each other or anything else alive.
                .map(|&(p, l)| io::IoSliceMut::new(unsafe { std::slice::from_raw_parts_mut(p, l) }))
                .collect();
            rustix::io::preadv(fd, &mut slices, off)
        };
        match res {
            Ok(0) if r.write => return Err(io::Error::from(io::ErrorKind::WriteZero)),
            Ok(0) => return Ok(done),
            Ok(n) => done += n,
            Err(rustix::io::Errno::INTR) => continue,
            Err(e) => return Err(e.into()),
        }
    }
    Ok(done)
}

/// Checksum the requested prefix of segment 2 after a full transfer.
fn with_hash(r: &RawReq, res: io::Result<usize>) -> io::Result<Done> {
    let bytes = res?;
    let hash = if r.hash_len > 0 && bytes == r.total {
        // SAFETY: hash_len <= iov[1].iov_len (see lower), the segment lies in a buffer the
        // submitter keeps borrowed until we reply, and the kernel has finished writing it
        // (the transfer completed).
        let seg = unsafe { std::slice::from_raw_parts(r.iov[1].iov_base.cast::<u8>(), r.hash_len) };
        Some(xxhash_rust::xxh3::xxh3_64(seg))
    } else {
        None
    };
    Ok(Done { bytes, hash })
}

fn psync_worker(rx: mpsc::Receiver<Job>) {
    while let Ok(job) = rx.recv() {
        let res: Reply = job
            .reqs
            .iter()
            .map(|r| (r.idx, with_hash(r, finish_sync(r, 0))))
            .collect();
        let _ = job.reply.send(res);
    }
}

/// A job being served by a ring thread.
struct Slot {
    /// Never grown after creation, so the iovec arrays inside stay put while in flight.
    reqs: Vec<RawReq>,
    results: Vec<Option<io::Result<Done>>>,
    remaining: usize,
    reply: mpsc::Sender<Reply>,
}

/// One ring serves many jobs at once: requests of all queued jobs share the queue depth, and
/// each job is answered as soon as its own requests are done.
fn uring_worker(mut ring: IoUring, rx: mpsc::Receiver<Job>, qd: usize) {
    let qd = qd.max(1);
    let mut slots: Vec<Option<Slot>> = Vec::new();
    let mut pending: std::collections::VecDeque<(usize, usize)> = Default::default();
    let mut inflight = 0usize;
    let mut open = true;
    let add = |job: Job,
               slots: &mut Vec<Option<Slot>>,
               pending: &mut std::collections::VecDeque<(usize, usize)>| {
        if job.reqs.is_empty() {
            let _ = job.reply.send(Vec::new());
            return;
        }
        let n = job.reqs.len();
        let slot = Slot {
            results: (0..n).map(|_| None).collect(),
            remaining: n,
            reqs: job.reqs,
            reply: job.reply,
        };
        let id = match slots.iter().position(Option::is_none) {
            Some(i) => {
                slots[i] = Some(slot);
                i
            }
            None => {
                slots.push(Some(slot));
                slots.len() - 1
            }
        };
        pending.extend((0..n).map(|i| (id, i)));
    };
    loop {
        if inflight == 0 && pending.is_empty() {
            if !open {
                break;
            }
            match rx.recv() {
                Ok(job) => add(job, &mut slots, &mut pending),
                Err(_) => break,
            }
        }
        while open {
            match rx.try_recv() {
                Ok(job) => add(job, &mut slots, &mut pending),
                Err(mpsc::TryRecvError::Empty) => break,
                Err(mpsc::TryRecvError::Disconnected) => open = false,
            }
        }
        fill(&mut ring, &slots, &mut pending, &mut inflight, qd);
        if inflight == 0 {
            continue;
        }
        enter(&ring, 1);
        let done: Vec<(u64, i32)> = ring.completion().map(|c| (c.user_data(), c.result())).collect();
        inflight -= done.len();
        // Keep the device busy while we post-process (checksums, short transfers).
        if fill(&mut ring, &slots, &mut pending, &mut inflight, qd) {
            enter(&ring, 0);
        }
        for (ud, res) in done {
            let (id, i) = ((ud >> 32) as usize, (ud & 0xffff_ffff) as usize);
            let Some(Some(slot)) = slots.get_mut(id) else {
                continue;
            };
            let r = &slot.reqs[i];
            let out = if res < 0 {
                if res == -libc::EINTR || res == -libc::EAGAIN {
                    finish_sync(r, 0)
                } else {
                    Err(io::Error::from_raw_os_error(-res))
                }
            } else {
                let got = res as usize;
                if got >= r.total || (got == 0 && !r.write) {
                    Ok(got)
                } else {
                    // Short transfer: finish the rest synchronously.
                    finish_sync(r, got)
                }
            };
            slot.results[i] = Some(with_hash(r, out));
            slot.remaining -= 1;
            if slot.remaining == 0
                && let Some(slot) = slots[id].take()
            {
                let reply: Reply = slot
                    .reqs
                    .iter()
                    .zip(slot.results)
                    .map(|(r, res)| {
                        (
                            r.idx,
                            res.unwrap_or_else(|| Err(io::Error::other("no completion"))),
                        )
                    })
                    .collect();
                let _ = slot.reply.send(reply);
            }
        }
    }
}

/// Push pending requests while below the queue depth; true if any were pushed.
fn fill(
    ring: &mut IoUring,
    slots: &[Option<Slot>],
    pending: &mut std::collections::VecDeque<(usize, usize)>,
    inflight: &mut usize,
    qd: usize,
) -> bool {
    let mut pushed = false;
    let mut sq = ring.submission();
    while *inflight < qd {
        let Some(&(id, i)) = pending.front() else {
            break;
        };
        let Some(Some(slot)) = slots.get(id) else {
            pending.pop_front();
            continue;
        };
        let r = &slot.reqs[i];
        let entry = if r.write {
            opcode::Writev::new(types::Fd(r.fd), r.iov.as_ptr(), r.niov)
                .offset(r.offset)
                .build()
        } else {
            opcode::Readv::new(types::Fd(r.fd), r.iov.as_ptr(), r.niov)
                .offset(r.offset)
                .build()
        }
        .user_data(((id as u64) << 32) | i as u64);
        // SAFETY: the iovec array lives in the slot's `reqs` Vec, whose heap buffer is neither
        // grown, moved nor freed until the request completes and the slot is answered; the
        // buffers it points to stay borrowed by the submitter until that answer.
        if unsafe { sq.push(&entry) }.is_err() {
            break;
        }
        pending.pop_front();
        *inflight += 1;
        pushed = true;
    }
    pushed
}

/// io_uring_enter: submit queued entries and wait for `want` completions.
fn enter(ring: &IoUring, want: usize) {
    loop {
        match ring.submit_and_wait(want) {
            Ok(_) => return,
            Err(e)
                if matches!(e.kind(), io::ErrorKind::Interrupted | io::ErrorKind::WouldBlock)
                    || e.raw_os_error() == Some(libc::EBUSY) =>
            {
                if want == 0 {
                    // Entries stay queued and go out with the next enter.
                    return;
                }
                std::thread::yield_now();
            }
            Err(e) => {
                // Queued entries may or may not have reached the kernel; we cannot tell
                // when their buffers are free again.
                eprintln!("orbitkv-ssd: io_uring_enter failed ({e}); aborting");
                std::process::abort();
            }
        }
    }
}
