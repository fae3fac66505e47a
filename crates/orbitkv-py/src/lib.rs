//! `orbitkv._native`: PyO3 bindings over `orbitkv-client` (and the Manager
//! entry point for `orbitkv serve`). Every call that talks to the Manager or
//! copies bytes releases the GIL.
//!
//! This file holds the `Client` class (its one `#[pymethods]` block) and the
//! module's registration; the other classes, the exceptions and the
//! module-level functions live in the modules declared below.
#![deny(unsafe_op_in_unsafe_fn)]

mod buffers;
mod errors;
mod functions;
mod hashes;
mod layout;
mod lease;
mod lookup;
mod namespace;
mod save;

use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use errors::{
    AuthError, Busy, ManagerUnavailable, OrbitKVError, ProtocolError, RestoreFailed, SaveFailed, to_py,
};
use functions::{default_socket_path, namespace_salt, serve};
use hashes::{Hashes, hash32};
use layout::PageLayout;
use lease::{Lease, Release, TpLease, acquire_slots, pack_slots, release_lease};
use lookup::{LookupJob, LookupSlot, PendingLookup};
use namespace::Namespace;
use orbitkv_client::{ClientError, SlotCopier, SlotStatus};
use pyo3::exceptions::{PyException, PyValueError};
use pyo3::prelude::*;
use pyo3::types::{PyBytes, PyTuple};
use save::{PendingSave, SaveResult, abort_pending};

#[pyclass(frozen, module = "orbitkv._native")]
struct Client {
    inner: Arc<orbitkv_client::Client>,
    /// The background lookup thread's queue, started on first use; the thread
    /// ends when this (the last sender) is dropped with the client.
    lookups: Mutex<Option<std::sync::mpsc::Sender<LookupJob>>>,
}

impl Client {
    /// Run `f` on the Rust client with the GIL released; its error raised as
    /// the exception [`to_py`] maps it to.
    fn detached<T: Send>(
        &self,
        py: Python<'_>,
        f: impl FnOnce(&orbitkv_client::Client) -> Result<T, ClientError> + Send,
    ) -> PyResult<T> {
        let c = self.inner.clone();
        py.detach(move || f(&c)).map_err(to_py)
    }

    fn check_lease(&self, lease: &Lease) -> PyResult<()> {
        if lease.session != self.inner.session_id() {
            return Err(PyValueError::new_err("lease belongs to another client"));
        }
        Ok(())
    }

    fn check_pending(&self, pending: &PendingSave) -> PyResult<()> {
        if pending.session != self.inner.session_id() {
            return Err(PyValueError::new_err("pending save belongs to another client"));
        }
        Ok(())
    }

    /// Refuse buffers that overlap this client's arena mapping: the copies
    /// would alias the arena slices they read or write.
    fn check_outside_arena(&self, ranges: &[buffers::RawRange], what: &str) -> PyResult<()> {
        let arena = self.inner.arena_spans();
        for r in ranges {
            let (s, e) = r.bounds();
            if arena.iter().any(|(a, b)| s < *b && *a < e) {
                return Err(PyValueError::new_err(format!(
                    "{what} [{s:#x}, {e:#x}) overlaps this client's arena mapping"
                )));
            }
        }
        Ok(())
    }
}

#[pymethods]
impl Client {
    #[new]
    #[pyo3(signature = (socket_path=None, *, token=None, timeout_ms=5000, map_arena=true, server_uid=None, prefault=true))]
    fn new(
        py: Python<'_>,
        socket_path: Option<PathBuf>,
        token: Option<String>,
        timeout_ms: u64,
        map_arena: bool,
        server_uid: Option<u32>,
        prefault: bool,
    ) -> PyResult<Self> {
        let path =
            socket_path.unwrap_or_else(|| orbitkv_proto::default_socket_path(orbitkv_shm::peer::my_uid()));
        let token = token.map(String::into_bytes);
        let opts = orbitkv_client::ConnectOptions {
            token: token.as_deref(),
            map_arena,
            server_uid,
            prefault,
            ..orbitkv_client::ConnectOptions::new(Duration::from_millis(timeout_ms))
        };
        let client = py
            .detach(|| orbitkv_client::Client::connect_with(&path, &opts))
            .map_err(to_py)?;
        Ok(Client {
            inner: Arc::new(client),
            lookups: Mutex::new(None),
        })
    }

    #[getter]
    fn session_id(&self) -> u64 {
        self.inner.session_id()
    }

    /// True when connected with `map_arena=False`: no copies through this client.
    #[getter]
    fn control_only(&self) -> bool {
        self.inner.is_control_only()
    }

    #[getter]
    fn socket_path(&self) -> String {
        self.inner.socket_path().display().to_string()
    }

    fn segments(&self) -> Vec<(u32, u64)> {
        self.inner.segments()
    }

    #[pyo3(signature = (fingerprint, block_bytes, *, shard=0, salt=b"".to_vec()))]
    fn register_namespace(
        &self,
        py: Python<'_>,
        fingerprint: Vec<u8>,
        block_bytes: u64,
        shard: u32,
        salt: Vec<u8>,
    ) -> PyResult<Namespace> {
        let fp = hash32(&fingerprint, "fingerprint")?;
        // The raw salt: the Rust client applies the one salt encoding.
        let ns = self.detached(py, |c| c.register_namespace(fp, block_bytes, shard, &salt))?;
        Ok(Namespace { inner: ns })
    }

    /// How many of `hashes`, from the first, may be present in `ns`, read from
    /// the Manager's shared presence table without sending a message: 0 means
    /// the first block is certainly absent. Hashes are converted lazily (a
    /// miss looks at one). A non-zero answer promises nothing: `lookup` pins.
    fn probably_present(&self, ns: &Namespace, hashes: &Bound<'_, PyAny>) -> PyResult<usize> {
        let len = hashes.len()?;
        let mut err: Option<PyErr> = None;
        let mut items = hashes.try_iter()?;
        let lazy = std::iter::from_fn(|| match items.next()? {
            Ok(item) => match item.cast::<PyBytes>() {
                Ok(b) => match hash32(b.as_bytes(), "block hash") {
                    Ok(h) => Some(h),
                    Err(e) => {
                        err = Some(e);
                        None
                    }
                },
                Err(_) => {
                    err = Some(PyValueError::new_err("block hash must be bytes"));
                    None
                }
            },
            Err(e) => {
                err = Some(e);
                None
            }
        });
        let n = self
            .inner
            .probably_present_iter(&ns.inner, lazy, len)
            .map_err(to_py)?;
        match err {
            Some(e) => Err(e),
            None => Ok(n),
        }
    }

    /// Start a lookup on this client's background thread (started on first
    /// use; lookups run one after another on the session's connection) and
    /// return at once. `PendingLookup.result()` gives the `Lease`.
    fn start_lookup(&self, ns: &Namespace, hashes: Hashes) -> PyResult<PendingLookup> {
        let hs = hashes.0;
        let slot: LookupSlot = Arc::new((Mutex::new(None), std::sync::Condvar::new()));
        let job = LookupJob {
            ns: ns.inner.clone(),
            hashes: hs,
            slot: slot.clone(),
        };
        let mut q = self.lookups.lock().unwrap_or_else(|p| p.into_inner());
        if q.is_none() {
            let (tx, rx) = std::sync::mpsc::channel::<LookupJob>();
            let c = self.inner.clone();
            std::thread::Builder::new()
                .name("orbitkv-lookup".into())
                .spawn(move || {
                    for job in rx {
                        let r = c.lookup(&job.ns, &job.hashes);
                        let (m, cv) = &*job.slot;
                        *m.lock().unwrap_or_else(|p| p.into_inner()) = Some(r);
                        cv.notify_all();
                    }
                })
                .map_err(|e| PyException::new_err(format!("starting the lookup thread: {e}")))?;
            *q = Some(tx);
        }
        if let Some(tx) = q.as_ref()
            && tx.send(job).is_err()
        {
            *q = None;
            return Err(to_py(ClientError::Unavailable(
                "the lookup thread stopped".into(),
            )));
        }
        Ok(PendingLookup {
            client: self.inner.clone(),
            slot,
            block_bytes: ns.inner.block_bytes,
        })
    }

    /// Whether the Manager publishes a presence table to this client.
    #[getter]
    fn has_presence(&self) -> bool {
        self.inner.has_presence()
    }

    fn lookup(&self, py: Python<'_>, ns: &Namespace, hashes: Hashes) -> PyResult<Lease> {
        let hit = self.detached(py, |c| c.lookup(&ns.inner, &hashes.0))?;
        Ok(Lease::from_hit(&self.inner, &hit, ns.inner.block_bytes))
    }

    /// One lookup over every shard of a TP group (`namespaces[i]` is shard `i`):
    /// the common prefix, pinned in every shard under one TP lease.
    fn lookup_tp(&self, py: Python<'_>, namespaces: Vec<Py<Namespace>>, hashes: Hashes) -> PyResult<TpLease> {
        let hs = hashes.0;
        let nss: Vec<orbitkv_client::Namespace> = namespaces.iter().map(|n| n.get().inner.clone()).collect();
        let hit = self.detached(py, |c| c.lookup_tp(&nss, &hs))?;
        Ok(TpLease {
            token: hit.token.unwrap_or([0; orbitkv_proto::TP_TOKEN_BYTES]),
            hit_blocks: hit.hit_blocks,
            ssd_blocks: hit.ssd_blocks.clone(),
            generation: hit.generation,
            session: self.inner.session_id(),
            released: AtomicBool::new(false),
        })
    }

    /// Take shard `ns`'s part of the TP lease named by `token` into this
    /// session: an ordinary `Lease` of this client (acquire, restore, release).
    fn redeem_tp(&self, py: Python<'_>, token: Vec<u8>, ns: &Namespace) -> PyResult<Lease> {
        let token: [u8; orbitkv_proto::TP_TOKEN_BYTES] = token.as_slice().try_into().map_err(|_| {
            PyValueError::new_err(format!(
                "a TP token is exactly {} bytes, got {}",
                orbitkv_proto::TP_TOKEN_BYTES,
                token.len()
            ))
        })?;
        let hit = self.detached(py, |c| c.redeem_tp(token, &ns.inner))?;
        Ok(Lease::from_hit(&self.inner, &hit, ns.inner.block_bytes))
    }

    /// The owner ends its TP lease (once; later calls are no-ops): parts no
    /// worker redeemed are released, redeemed ones stay with their workers.
    /// True when this call ended it; False when it had ended already (every
    /// rank reported done, or it expired) or this is a repeated call.
    fn release_tp(&self, py: Python<'_>, lease: &TpLease) -> PyResult<bool> {
        if lease.session != self.inner.session_id() {
            return Err(PyValueError::new_err("TP lease belongs to another client"));
        }
        if lease.hit_blocks == 0 || lease.released.swap(true, Ordering::AcqRel) {
            return Ok(false);
        }
        let token = lease.token;
        self.detached(py, |c| c.release_tp(token))
    }

    fn acquire(&self, py: Python<'_>, lease: &Lease) -> PyResult<Vec<(u32, u64)>> {
        self.check_lease(lease)?;
        acquire_slots(py, &self.inner, lease)
    }

    /// `acquire`, with the slots packed as little-endian int64 `(segment, offset)`
    /// pairs (16 bytes a hit block): one bytes object instead of a tuple per block,
    /// for copy engines that read them as an array.
    fn acquire_packed<'py>(&self, py: Python<'py>, lease: &Lease) -> PyResult<Bound<'py, PyBytes>> {
        self.check_lease(lease)?;
        let slots = acquire_slots(py, &self.inner, lease)?;
        Ok(PyBytes::new(
            py,
            &pack_slots(slots.iter().map(|&(s, o)| Some((s, o)))),
        ))
    }

    #[pyo3(signature = (lease, dst, *, start=0, count=None))]
    fn restore(
        &self,
        py: Python<'_>,
        lease: &Lease,
        dst: &Bound<'_, PyAny>,
        start: usize,
        count: Option<usize>,
    ) -> PyResult<u64> {
        self.check_lease(lease)?;
        let hit = lease.hit_blocks as usize;
        let count = count.unwrap_or(hit.saturating_sub(start));
        if start.checked_add(count).is_none_or(|e| e > hit) {
            return Err(PyValueError::new_err(format!(
                "blocks {start}..{} outside the {hit} hit",
                start + count
            )));
        }
        if count == 0 {
            return Ok(0);
        }
        self.inner.require_mapped().map_err(to_py)?; // before the lease is acquired
        let slots = acquire_slots(py, &self.inner, lease)?;
        let (_held, ranges) = buffers::hold_blocks(py, dst, lease.block_bytes as usize, count, true)?;
        check_disjoint(&ranges)?;
        self.check_outside_arena(&ranges, "destination buffer")?;
        let c = self.inner.clone();
        let bb = lease.block_bytes;
        py.detach(|| {
            let mut dsts: Vec<&mut [u8]> = ranges
                .iter()
                // SAFETY: `_held` keeps every exported buffer alive (and unresizable)
                // until after this closure; `hold_blocks` checked them writable,
                // `check_disjoint` that no two overlap and `check_outside_arena`
                // that none overlaps the arena mapping the copy reads, so these are
                // the only Rust references to this memory while they live.
                .map(|r| unsafe { r.as_mut_slice() })
                .collect();
            c.copy_out(&slots, bb, start, &mut dsts)
        })
        .map_err(to_py)
    }

    /// Scatter hit blocks `[start, start + len(block_ids))` of `lease` straight
    /// into the engine pages of `block_ids` in `kv` (a writable buffer over the
    /// whole region `layout` describes), acquiring the lease first if needed.
    /// Every arena and page range is bounds-checked; the copy holds the
    /// client's copy lock, so `close` waits for it.
    #[pyo3(signature = (lease, layout, kv, block_ids, *, start=0))]
    fn restore_pages(
        &self,
        py: Python<'_>,
        lease: &Lease,
        layout: &PageLayout,
        kv: &Bound<'_, PyAny>,
        block_ids: Vec<u32>,
        start: usize,
    ) -> PyResult<u64> {
        self.check_lease(lease)?;
        let hit = lease.hit_blocks as usize;
        if start.checked_add(block_ids.len()).is_none_or(|e| e > hit) {
            return Err(PyValueError::new_err(format!(
                "blocks {start}..{} outside the {hit} hit",
                start + block_ids.len()
            )));
        }
        if layout.inner.block_bytes() != lease.block_bytes {
            return Err(PyValueError::new_err(format!(
                "page layout holds {} bytes per block, the lease's namespace {}",
                layout.inner.block_bytes(),
                lease.block_bytes
            )));
        }
        if block_ids.is_empty() {
            return Ok(0);
        }
        self.inner.require_mapped().map_err(to_py)?; // before the lease is acquired
        let held = buffers::hold(py, kv, true)?;
        let range = held.range();
        self.check_outside_arena(&[range], "KV region")?;
        let slots = acquire_slots(py, &self.inner, lease)?;
        let Some(slots) = slots.get(start..start + block_ids.len()) else {
            return Err(ProtocolError::new_err(format!(
                "the Manager staged {} slots for a hit of {hit} blocks",
                slots.len()
            )));
        };
        let c = self.inner.clone();
        let l = &layout.inner;
        let out = py.detach(|| {
            let mut region = buffers::HeldRegion::new(&held);
            c.scatter(l, slots, &mut region, &block_ids)
        });
        drop(held);
        out.map_err(to_py)
    }

    /// Gather the engine pages of `block_ids` (one per hash of `pending`) from
    /// `kv` into the save's allocated slots; blocks already present or refused
    /// are skipped. Commit or abort the save afterwards.
    fn save_pages(
        &self,
        py: Python<'_>,
        pending: &PendingSave,
        layout: &PageLayout,
        kv: &Bound<'_, PyAny>,
        block_ids: Vec<u32>,
    ) -> PyResult<u64> {
        self.check_pending(pending)?;
        if pending.done.load(Ordering::Acquire) {
            return Err(PyValueError::new_err("pending save already committed or aborted"));
        }
        if block_ids.len() != pending.items.len() {
            return Err(to_py(ClientError::Size {
                what: "engine block ids (one per hash of the save)".into(),
                expected: pending.items.len() as u64,
                actual: block_ids.len() as u64,
            }));
        }
        let mut blocks = Vec::new();
        let mut slots = Vec::new();
        for (b, st) in block_ids.iter().zip(&pending.items) {
            if let SlotStatus::Allocated { segment, offset } = st {
                blocks.push(*b);
                slots.push((*segment, *offset));
            }
        }
        if blocks.is_empty() {
            return Ok(0);
        }
        let held = buffers::hold(py, kv, false)?;
        self.check_outside_arena(&[held.range()], "KV region")?;
        let c = self.inner.clone();
        let l = &layout.inner;
        let out = py.detach(|| {
            let region = buffers::HeldRegion::new(&held);
            c.gather(l, &region, &blocks, &slots)
        });
        drop(held);
        out.map_err(to_py)
    }

    /// Release `lease` (a no-op when already released). `wait=False` sends it
    /// without waiting for the Manager's answer (one message, no round trip):
    /// later requests of this client see it released; a lease the Manager no
    /// longer knows is then counted there, not raised here.
    #[pyo3(signature = (lease, *, wait = true))]
    fn release(&self, py: Python<'_>, lease: &Lease, wait: bool) -> PyResult<()> {
        self.check_lease(lease)?;
        release_lease(
            py,
            &self.inner,
            lease,
            if wait { Release::Wait } else { Release::Quiet },
        )
    }

    /// Release `lease` with neither a round trip nor a message of its own: it
    /// is written in front of this client's next request, or by the client's
    /// flusher thread once it has waited `ORBITKV_RELEASE_DELAY_US`. For
    /// callers that no other process waits on (a scheduler's query leases).
    fn release_later(&self, py: Python<'_>, lease: &Lease) -> PyResult<()> {
        self.check_lease(lease)?;
        release_lease(py, &self.inner, lease, Release::Later)
    }

    fn save(
        &self,
        py: Python<'_>,
        ns: &Namespace,
        hashes: Hashes,
        src: &Bound<'_, PyAny>,
    ) -> PyResult<SaveResult> {
        let hs = hashes.0;
        let (_held, ranges) = buffers::hold_blocks(py, src, ns.inner.block_bytes as usize, hs.len(), false)?;
        self.check_outside_arena(&ranges, "source buffer")?;
        let c = self.inner.clone();
        let nsi = ns.inner.clone();
        let r = py
            .detach(|| {
                let srcs: Vec<&[u8]> = ranges
                    .iter()
                    // SAFETY: `_held` keeps every source buffer alive (and
                    // unresizable) for the closure; only shared slices are made,
                    // and `check_outside_arena` proved none overlaps the arena
                    // mapping the copy writes.
                    .map(|r| unsafe { r.as_slice() })
                    .collect();
                c.save(&nsi, &hs, &srcs)
            })
            .map_err(to_py)?;
        Ok(SaveResult {
            stored: r.stored,
            already_present: r.already_present,
            refused: r.refused,
            bytes_copied: r.bytes_copied,
        })
    }

    fn begin_save(&self, py: Python<'_>, ns: &Namespace, hashes: Hashes) -> PyResult<PendingSave> {
        let p = self.detached(py, |c| c.begin_save(&ns.inner, &hashes.0))?;
        Ok(PendingSave {
            client: self.inner.clone(),
            id: p.id,
            items: p.items,
            session: self.inner.session_id(),
            done: AtomicBool::new(false),
        })
    }

    fn commit_save(&self, py: Python<'_>, pending: &PendingSave) -> PyResult<u32> {
        self.check_pending(pending)?;
        if pending.done.swap(true, Ordering::AcqRel) {
            return Err(PyValueError::new_err("pending save already committed or aborted"));
        }
        let id = pending.id;
        self.detached(py, |c| c.commit_save(id))
    }

    fn abort_save(&self, py: Python<'_>, pending: &PendingSave) -> PyResult<()> {
        self.check_pending(pending)?;
        abort_pending(py, &self.inner, pending)
    }

    /// `(address, size)` of a mapped arena segment in this process, for GPU
    /// registration (`cudaHostRegister`) and gather/scatter kernels. Valid
    /// while this client is open.
    fn segment_address(&self, segment: u32) -> PyResult<(usize, usize)> {
        let m = self.inner.segment(segment).map_err(to_py)?;
        Ok((m.as_ptr() as usize, m.len()))
    }

    /// A retention hint on a chain of blocks (prefix first) of `ns`: exactly
    /// one of `keep_for_s` (expected back within that many seconds, up to
    /// 24 hours), `done` (not expected back) or `clear` (forget earlier
    /// hints). Returns `(applied, pending, refused)`: blocks it applied to,
    /// blocks it waits for (not committed yet), blocks the cap refused.
    #[pyo3(signature = (ns, hashes, *, keep_for_s=None, done=false, clear=false))]
    fn retain(
        &self,
        py: Python<'_>,
        ns: &Namespace,
        hashes: Hashes,
        keep_for_s: Option<f64>,
        done: bool,
        clear: bool,
    ) -> PyResult<(u32, u32, u32)> {
        let hold = match (keep_for_s, done, clear) {
            (Some(s), false, false) => {
                let ms = s * 1000.0;
                if !(1.0..=f64::from(orbitkv_proto::MAX_RETAIN_TTL_MS)).contains(&ms) {
                    return Err(PyValueError::new_err(format!(
                        "keep_for_s must be from 0.001 to 86400 (24 hours), got {s}"
                    )));
                }
                orbitkv_client::RetainHold::Keep { ttl_ms: ms as u32 }
            }
            (None, true, false) => orbitkv_client::RetainHold::Done,
            (None, false, true) => orbitkv_client::RetainHold::Clear,
            _ => {
                return Err(PyValueError::new_err(
                    "retain takes exactly one of keep_for_s=SECONDS, done=True or clear=True",
                ));
            }
        };
        let r = self.detached(py, |c| c.retain(&ns.inner, hold, &hashes.0))?;
        Ok((r.applied, r.pending, r.refused))
    }

    fn reset_generation(&self, py: Python<'_>, ns: &Namespace) -> PyResult<u64> {
        self.detached(py, |c| c.reset_generation(&ns.inner))
    }

    #[pyo3(signature = (*, restore_failures=0, commit_failures=0))]
    fn inject_faults(&self, py: Python<'_>, restore_failures: u32, commit_failures: u32) -> PyResult<()> {
        self.detached(py, |c| c.inject_faults(restore_failures, commit_failures))
    }

    fn stats<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyAny>> {
        let text = self.detached(py, |c| c.stats_json())?;
        py.import("json")?.call_method1("loads", (text,))
    }

    /// `orbitkv trace`: keep the Manager recording lookups (with the block each
    /// stopped at and why), restores, releases and resets for `arm_ms` more
    /// milliseconds (0: stop), of the namespace `fingerprint` (None: any) and
    /// process `pid` (0: any) only; returns the events after `cursor` (the
    /// default: from now on) with `next`, the cursor of the following call.
    #[pyo3(signature = (arm_ms, *, fingerprint=None, pid=0, cursor=u64::MAX))]
    fn trace<'py>(
        &self,
        py: Python<'py>,
        arm_ms: u32,
        fingerprint: Option<Vec<u8>>,
        pid: u32,
        cursor: u64,
    ) -> PyResult<Bound<'py, PyAny>> {
        let fp = match fingerprint {
            Some(f) => hash32(&f, "fingerprint")?,
            None => [0; 32],
        };
        let text = self.detached(py, |c| c.trace(arm_ms, fp, pid, cursor))?;
        py.import("json")?.call_method1("loads", (text,))
    }

    fn close(&self, py: Python<'_>) -> PyResult<()> {
        self.detached(py, |c| c.close())
    }

    fn __enter__(slf: Py<Self>) -> Py<Self> {
        slf
    }

    /// Leaving a `with` block closes the client (its leases and saves end with it).
    #[pyo3(signature = (*_exc))]
    fn __exit__(&self, py: Python<'_>, _exc: &Bound<'_, PyTuple>) -> PyResult<()> {
        self.close(py)
    }
}

fn check_disjoint(ranges: &[buffers::RawRange]) -> PyResult<()> {
    let mut v: Vec<(usize, usize)> = ranges.iter().map(|r| r.bounds()).collect();
    v.sort_unstable();
    if v.windows(2).any(|w| w[0].1 > w[1].0) {
        return Err(PyValueError::new_err("destination buffers overlap"));
    }
    Ok(())
}

#[pymodule(gil_used = false)]
fn _native(m: &Bound<'_, PyModule>) -> PyResult<()> {
    let py = m.py();
    m.add("PROTOCOL_VERSION", orbitkv_proto::PROTOCOL_VERSION)?;
    m.add("HASH_BYTES", orbitkv_proto::HASH_BYTES)?;
    m.add("__version__", env!("CARGO_PKG_VERSION"))?;
    m.add("OrbitKVError", py.get_type::<OrbitKVError>())?;
    m.add("ManagerUnavailable", py.get_type::<ManagerUnavailable>())?;
    m.add("AuthError", py.get_type::<AuthError>())?;
    m.add("ProtocolError", py.get_type::<ProtocolError>())?;
    m.add("Busy", py.get_type::<Busy>())?;
    m.add("RestoreFailed", py.get_type::<RestoreFailed>())?;
    m.add("SaveFailed", py.get_type::<SaveFailed>())?;
    m.add_class::<Client>()?;
    m.add_class::<PendingLookup>()?;
    m.add_class::<Namespace>()?;
    m.add_class::<Lease>()?;
    m.add_class::<TpLease>()?;
    m.add_class::<SaveResult>()?;
    m.add_class::<PendingSave>()?;
    m.add_class::<PageLayout>()?;
    m.add_function(wrap_pyfunction!(namespace_salt, m)?)?;
    m.add_function(wrap_pyfunction!(serve, m)?)?;
    m.add_function(wrap_pyfunction!(default_socket_path, m)?)?;
    Ok(())
}
