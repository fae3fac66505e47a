//! `orbitkv._native`: PyO3 bindings over `orbitkv-client` (and the Manager
//! entry point for `orbitkv serve`). Every call that talks to the Manager or
//! copies bytes releases the GIL.
#![deny(unsafe_op_in_unsafe_fn)]

mod buffers;

use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use orbitkv_client::{ClientError, PageSpec, SlotCopier, SlotStatus};
use orbitkv_proto::ErrorCode;
use pyo3::create_exception;
use pyo3::exceptions::{PyException, PyTypeError, PyValueError};
use pyo3::prelude::*;
use pyo3::types::{PyBytes, PyString};

create_exception!(
    _native,
    OrbitKVError,
    PyException,
    "Base error of the native client."
);
create_exception!(
    _native,
    ManagerUnavailable,
    OrbitKVError,
    "No Manager on the socket, or the connection broke."
);
create_exception!(
    _native,
    AuthError,
    OrbitKVError,
    "The Manager refused this peer, or the peer is not a trusted Manager."
);
create_exception!(
    _native,
    ProtocolError,
    OrbitKVError,
    "Malformed or unexpected frame."
);
create_exception!(
    _native,
    Busy,
    OrbitKVError,
    "Refused because owners are still live."
);
create_exception!(
    _native,
    SaveFailed,
    OrbitKVError,
    "A save failed; nothing of it became visible."
);
create_exception!(
    _native,
    RestoreFailed,
    OrbitKVError,
    "The Manager could not stage the leased blocks."
);

fn to_py(e: ClientError) -> PyErr {
    let code = e.code_name();
    let msg = format!("{e} [{code}]");
    match &e {
        ClientError::Unavailable(_) | ClientError::Closed => ManagerUnavailable::new_err(msg),
        ClientError::Auth(_) | ClientError::UntrustedServer(_) => AuthError::new_err(msg),
        ClientError::Protocol(_) => ProtocolError::new_err(msg),
        ClientError::Invalid(_) | ClientError::Size { .. } | ClientError::UnknownSegment { .. } => {
            PyValueError::new_err(msg)
        }
        ClientError::Server {
            code: ErrorCode::Busy,
            ..
        } => Busy::new_err(msg),
        ClientError::Server {
            code: ErrorCode::RestoreFailed,
            ..
        } => RestoreFailed::new_err(msg),
        ClientError::Server {
            code: ErrorCode::SaveFailed,
            ..
        } => SaveFailed::new_err(msg),
        ClientError::Server {
            code: ErrorCode::Auth,
            ..
        } => AuthError::new_err(msg),
        ClientError::Server {
            code: ErrorCode::InvalidArgument,
            ..
        } => PyValueError::new_err(msg),
        _ => OrbitKVError::new_err(msg),
    }
}

fn hash32(b: &[u8], what: &str) -> PyResult<[u8; 32]> {
    b.try_into()
        .map_err(|_| PyValueError::new_err(format!("{what} must be exactly 32 bytes, got {}", b.len())))
}

/// Block hashes from any iterable of 32-byte buffers. `bytes` items are
/// copied straight into place (no buffer per item: a scheduler passes tens of
/// hashes per request); other buffers (`bytearray`, `memoryview`) are read as
/// bytes first.
struct Hashes(Vec<[u8; 32]>);

impl<'a, 'py> FromPyObject<'a, 'py> for Hashes {
    type Error = PyErr;

    fn extract(obj: Borrowed<'a, 'py, PyAny>) -> PyResult<Self> {
        if obj.is_instance_of::<PyString>() || obj.is_instance_of::<PyBytes>() {
            return Err(PyTypeError::new_err(
                "block hashes must be a sequence of 32-byte values, not a single str or bytes",
            ));
        }
        let mut out = Vec::with_capacity(obj.len().unwrap_or(0));
        for item in obj.try_iter()? {
            let item = item?;
            let h = match item.cast::<PyBytes>() {
                Ok(b) => hash32(b.as_bytes(), "block hash")?,
                Err(_) => hash32(&item.extract::<Vec<u8>>()?, "block hash")?,
            };
            out.push(h);
        }
        Ok(Hashes(out))
    }
}

#[pyclass(frozen, module = "orbitkv._native")]
struct Namespace {
    inner: orbitkv_client::Namespace,
}

#[pymethods]
impl Namespace {
    #[getter]
    fn id(&self) -> u32 {
        self.inner.id
    }
    #[getter]
    fn generation(&self) -> u64 {
        self.inner.generation
    }
    #[getter]
    fn block_bytes(&self) -> u64 {
        self.inner.block_bytes
    }
    #[getter]
    fn fingerprint<'py>(&self, py: Python<'py>) -> Bound<'py, PyBytes> {
        PyBytes::new(py, &self.inner.fingerprint)
    }
    #[getter]
    fn shard(&self) -> u32 {
        self.inner.shard
    }
    fn __repr__(&self) -> String {
        format!(
            "Namespace(id={}, generation={}, block_bytes={}, shard={})",
            self.inner.id, self.inner.generation, self.inner.block_bytes, self.inner.shard
        )
    }
}

#[derive(Default)]
struct LeaseState {
    slots: Option<Vec<(u32, u64)>>,
    released: bool,
}

#[pyclass(frozen, module = "orbitkv._native")]
struct Lease {
    client: Arc<orbitkv_client::Client>,
    id: u64,
    hit_blocks: u32,
    ssd_blocks: Vec<u32>,
    block_bytes: u64,
    session: u64,
    state: Mutex<LeaseState>,
}

impl Lease {
    fn state(&self) -> std::sync::MutexGuard<'_, LeaseState> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Mark this lease released; true when the caller must tell the Manager
    /// (it pinned something and was not released before).
    fn mark_released(&self) -> bool {
        if self.hit_blocks == 0 {
            return false;
        }
        let mut st = self.state();
        !std::mem::replace(&mut st.released, true)
    }
}

#[pymethods]
impl Lease {
    #[getter]
    fn id(&self) -> u64 {
        self.id
    }
    #[getter]
    fn hit_blocks(&self) -> u32 {
        self.hit_blocks
    }
    /// Indices (ascending) of the hit blocks the Manager held on SSD only at
    /// lookup time; the other hit blocks were in DRAM.
    #[getter]
    fn ssd_blocks(&self) -> Vec<u32> {
        self.ssd_blocks.clone()
    }
    #[getter]
    fn block_bytes(&self) -> u64 {
        self.block_bytes
    }
    /// The session that holds this lease (`Client.session_id` of its client).
    #[getter]
    fn session(&self) -> u64 {
        self.session
    }
    #[getter]
    fn released(&self) -> bool {
        self.hit_blocks == 0 || self.state().released
    }
    fn __repr__(&self) -> String {
        format!(
            "Lease(id={}, hit_blocks={}, released={})",
            self.id,
            self.hit_blocks,
            self.released()
        )
    }

    fn __enter__(slf: Py<Self>) -> Py<Self> {
        slf
    }

    /// Leaving a `with` block releases the lease (a no-op when already released).
    #[pyo3(signature = (exc_type, exc_value, traceback, /))]
    fn __exit__(
        &self,
        py: Python<'_>,
        exc_type: Py<PyAny>,
        exc_value: Py<PyAny>,
        traceback: Py<PyAny>,
    ) -> PyResult<()> {
        let _ = (exc_type, exc_value, traceback);
        release_lease(py, &self.client, self, Release::Wait)
    }
}

/// A TP lease (contract T1): the common prefix of every declared shard, pinned
/// in each until every rank's worker reported done or the owner releases it.
/// `token` is what the workers redeem (`Client.redeem_tp`); it is a capability.
#[pyclass(frozen, module = "orbitkv._native")]
struct TpLease {
    token: [u8; orbitkv_proto::TP_TOKEN_BYTES],
    hit_blocks: u32,
    ssd_blocks: Vec<u32>,
    generation: u64,
    session: u64,
    released: AtomicBool,
}

#[pymethods]
impl TpLease {
    #[getter]
    fn token<'py>(&self, py: Python<'py>) -> Bound<'py, PyBytes> {
        PyBytes::new(py, &self.token)
    }
    #[getter]
    fn hit_blocks(&self) -> u32 {
        self.hit_blocks
    }
    #[getter]
    fn generation(&self) -> u64 {
        self.generation
    }
    /// Indices of hit blocks some shard held on SSD only at lookup time.
    #[getter]
    fn ssd_blocks(&self) -> Vec<u32> {
        self.ssd_blocks.clone()
    }
    /// The session that owns it (`Client.session_id` of its client).
    #[getter]
    fn session(&self) -> u64 {
        self.session
    }
    #[getter]
    fn released(&self) -> bool {
        self.hit_blocks == 0 || self.released.load(Ordering::Acquire)
    }
    fn __repr__(&self) -> String {
        // Never the token itself: it is a capability.
        format!(
            "TpLease(hit_blocks={}, generation={}, released={})",
            self.hit_blocks,
            self.generation,
            self.released()
        )
    }
}

#[pyclass(frozen, module = "orbitkv._native")]
struct SaveResult {
    #[pyo3(get)]
    stored: u32,
    #[pyo3(get)]
    already_present: u32,
    #[pyo3(get)]
    refused: u32,
    #[pyo3(get)]
    bytes_copied: u64,
}

#[pymethods]
impl SaveResult {
    fn __repr__(&self) -> String {
        format!(
            "SaveResult(stored={}, already_present={}, refused={}, bytes_copied={})",
            self.stored, self.already_present, self.refused, self.bytes_copied
        )
    }
}

#[pyclass(frozen, module = "orbitkv._native")]
struct PendingSave {
    client: Arc<orbitkv_client::Client>,
    #[pyo3(get)]
    id: u64,
    items: Vec<SlotStatus>,
    session: u64,
    done: AtomicBool,
}

#[pymethods]
impl PendingSave {
    #[getter]
    fn slots(&self) -> Vec<Option<(u32, u64)>> {
        self.items
            .iter()
            .map(|s| match s {
                SlotStatus::Allocated { segment, offset } => Some((*segment, *offset)),
                _ => None,
            })
            .collect()
    }
    /// `slots` packed as little-endian int64 `(segment, offset)` pairs, 16 bytes a
    /// block; a block that got no slot is `(-1, -1)`.
    #[getter]
    fn packed_slots<'py>(&self, py: Python<'py>) -> Bound<'py, PyBytes> {
        PyBytes::new(
            py,
            &pack_slots(self.items.iter().map(|s| match s {
                SlotStatus::Allocated { segment, offset } => Some((*segment, *offset)),
                _ => None,
            })),
        )
    }
    #[getter]
    fn statuses(&self) -> Vec<&'static str> {
        self.items
            .iter()
            .map(|s| match s {
                SlotStatus::Allocated { .. } => "allocated",
                SlotStatus::Present => "present",
                SlotStatus::Refused => "refused",
            })
            .collect()
    }

    /// True once committed or aborted.
    #[getter]
    fn done(&self) -> bool {
        self.done.load(Ordering::Acquire)
    }

    fn __enter__(slf: Py<Self>) -> Py<Self> {
        slf
    }

    /// Leaving a `with` block aborts the save unless it was committed.
    #[pyo3(signature = (exc_type, exc_value, traceback, /))]
    fn __exit__(
        &self,
        py: Python<'_>,
        exc_type: Py<PyAny>,
        exc_value: Py<PyAny>,
        traceback: Py<PyAny>,
    ) -> PyResult<()> {
        let _ = (exc_type, exc_value, traceback);
        abort_pending(py, &self.client, self)
    }
}

/// The block geometry of one engine KV region (see `orbitkv_client::PageLayout`).
#[pyclass(frozen, module = "orbitkv._native")]
struct PageLayout {
    inner: orbitkv_client::PageLayout,
}

#[pymethods]
impl PageLayout {
    #[new]
    fn new(pages: Vec<(u64, u64, [u64; 4], [u64; 4])>, num_blocks: u32, region_bytes: u64) -> PyResult<Self> {
        let specs: Vec<PageSpec> = pages
            .into_iter()
            .map(|(base, block_stride, shape, strides)| PageSpec {
                base,
                block_stride,
                shape,
                strides,
            })
            .collect();
        let inner = orbitkv_client::PageLayout::new(&specs, num_blocks, region_bytes).map_err(to_py)?;
        Ok(PageLayout { inner })
    }
    #[getter]
    fn block_bytes(&self) -> u64 {
        self.inner.block_bytes()
    }
    #[getter]
    fn num_blocks(&self) -> u32 {
        self.inner.num_blocks()
    }
    #[getter]
    fn region_bytes(&self) -> u64 {
        self.inner.region_bytes()
    }
    fn __repr__(&self) -> String {
        format!(
            "PageLayout(num_blocks={}, block_bytes={}, region_bytes={})",
            self.inner.num_blocks(),
            self.inner.block_bytes(),
            self.inner.region_bytes()
        )
    }
}

/// The answer slot of a lookup run by a client's background thread.
type LookupSlot = Arc<(
    Mutex<Option<Result<orbitkv_client::LookupHit, ClientError>>>,
    std::sync::Condvar,
)>;

/// A lookup handed to the client's background thread.
struct LookupJob {
    ns: orbitkv_client::Namespace,
    hashes: Vec<[u8; 32]>,
    slot: LookupSlot,
}

/// A lookup in flight on the client's background thread (`Client.start_lookup`):
/// no Python code runs for it there, so it needs no GIL and never waits for the
/// thread that started it.
#[pyclass(frozen, module = "orbitkv._native")]
struct PendingLookup {
    client: Arc<orbitkv_client::Client>,
    slot: LookupSlot,
    block_bytes: u64,
}

#[pymethods]
impl PendingLookup {
    /// True once the Manager answered (or the lookup failed).
    fn done(&self) -> bool {
        self.slot.0.lock().unwrap_or_else(|p| p.into_inner()).is_some()
    }

    /// The lease (waits for the answer with the GIL released); raises the
    /// lookup's error. May be called once: the answer is moved out.
    fn result(&self, py: Python<'_>) -> PyResult<Lease> {
        let r = py.detach(|| {
            let (m, cv) = &*self.slot;
            let mut g = m.lock().unwrap_or_else(|p| p.into_inner());
            loop {
                if let Some(r) = g.take() {
                    return Some(r);
                }
                if Arc::strong_count(&self.slot) == 1 {
                    return None; // the background thread is gone without answering
                }
                g = cv
                    .wait_timeout(g, Duration::from_millis(50))
                    .map(|(g, _)| g)
                    .unwrap_or_else(|p| p.into_inner().0);
            }
        });
        let hit = match r {
            Some(r) => r.map_err(to_py)?,
            None => {
                return Err(to_py(ClientError::Unavailable(
                    "the lookup thread stopped before answering".into(),
                )));
            }
        };
        Ok(Lease {
            client: self.client.clone(),
            id: hit.lease,
            hit_blocks: hit.hit_blocks,
            ssd_blocks: hit.ssd_blocks.clone(),
            block_bytes: self.block_bytes,
            session: self.client.session_id(),
            state: Mutex::new(LeaseState::default()),
        })
    }
}

#[pyclass(frozen, module = "orbitkv._native")]
struct Client {
    inner: Arc<orbitkv_client::Client>,
    /// The background lookup thread's queue, started on first use; the thread
    /// ends when this (the last sender) is dropped with the client.
    lookups: Mutex<Option<std::sync::mpsc::Sender<LookupJob>>>,
}

impl Client {
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
    #[pyo3(signature = (socket_path=None, *, token=None, timeout_ms=5000, map_arena=true, server_uid=None))]
    fn new(
        py: Python<'_>,
        socket_path: Option<PathBuf>,
        token: Option<String>,
        timeout_ms: u64,
        map_arena: bool,
        server_uid: Option<u32>,
    ) -> PyResult<Self> {
        let path =
            socket_path.unwrap_or_else(|| orbitkv_proto::default_socket_path(orbitkv_shm::peer::my_uid()));
        let token = token.map(String::into_bytes);
        let opts = orbitkv_client::ConnectOptions {
            token: token.as_deref(),
            map_arena,
            server_uid,
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
        let c = self.inner.clone();
        // The raw salt: the Rust client applies the one salt encoding.
        let ns = py
            .detach(|| c.register_namespace(fp, block_bytes, shard, &salt))
            .map_err(to_py)?;
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
        let hs = hashes.0;
        let c = self.inner.clone();
        let nsi = ns.inner.clone();
        let hit = py.detach(|| c.lookup(&nsi, &hs)).map_err(to_py)?;
        Ok(Lease {
            client: self.inner.clone(),
            id: hit.lease,
            hit_blocks: hit.hit_blocks,
            ssd_blocks: hit.ssd_blocks.clone(),
            block_bytes: ns.inner.block_bytes,
            session: self.inner.session_id(),
            state: Mutex::new(LeaseState::default()),
        })
    }

    /// One lookup over every shard of a TP group (`namespaces[i]` is shard `i`):
    /// the common prefix, pinned in every shard under one TP lease.
    fn lookup_tp(&self, py: Python<'_>, namespaces: Vec<Py<Namespace>>, hashes: Hashes) -> PyResult<TpLease> {
        let hs = hashes.0;
        let nss: Vec<orbitkv_client::Namespace> = namespaces.iter().map(|n| n.get().inner.clone()).collect();
        let c = self.inner.clone();
        let hit = py.detach(|| c.lookup_tp(&nss, &hs)).map_err(to_py)?;
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
        let c = self.inner.clone();
        let nsi = ns.inner.clone();
        let hit = py.detach(|| c.redeem_tp(token, &nsi)).map_err(to_py)?;
        Ok(Lease {
            client: self.inner.clone(),
            id: hit.lease,
            hit_blocks: hit.hit_blocks,
            ssd_blocks: hit.ssd_blocks.clone(),
            block_bytes: ns.inner.block_bytes,
            session: self.inner.session_id(),
            state: Mutex::new(LeaseState::default()),
        })
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
        let c = self.inner.clone();
        let token = lease.token;
        py.detach(|| c.release_tp(token)).map_err(to_py)
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
        let hs = hashes.0;
        let c = self.inner.clone();
        let nsi = ns.inner.clone();
        let p = py.detach(|| c.begin_save(&nsi, &hs)).map_err(to_py)?;
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
        let c = self.inner.clone();
        let id = pending.id;
        py.detach(|| c.commit_save(id)).map_err(to_py)
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

    fn reset_generation(&self, py: Python<'_>, ns: &Namespace) -> PyResult<u64> {
        let c = self.inner.clone();
        let nsi = ns.inner.clone();
        py.detach(|| c.reset_generation(&nsi)).map_err(to_py)
    }

    #[pyo3(signature = (*, restore_failures=0, commit_failures=0))]
    fn inject_faults(&self, py: Python<'_>, restore_failures: u32, commit_failures: u32) -> PyResult<()> {
        let c = self.inner.clone();
        py.detach(|| c.inject_faults(restore_failures, commit_failures))
            .map_err(to_py)
    }

    fn stats<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyAny>> {
        let c = self.inner.clone();
        let text = py.detach(|| c.stats_json()).map_err(to_py)?;
        py.import("json")?.call_method1("loads", (text,))
    }

    fn close(&self, py: Python<'_>) -> PyResult<()> {
        let c = self.inner.clone();
        py.detach(|| c.close()).map_err(to_py)
    }

    fn __enter__(slf: Py<Self>) -> Py<Self> {
        slf
    }

    #[pyo3(signature = (exc_type, exc_value, traceback, /))]
    fn __exit__(
        &self,
        py: Python<'_>,
        exc_type: Py<PyAny>,
        exc_value: Py<PyAny>,
        traceback: Py<PyAny>,
    ) -> PyResult<()> {
        let _ = (exc_type, exc_value, traceback);
        self.close(py)
    }
}

/// How a lease is released.
#[derive(Clone, Copy)]
enum Release {
    /// `Release`, waiting for the Manager's answer.
    Wait,
    /// `ReleaseQuiet` sent now; no answer read.
    Quiet,
    /// `ReleaseQuiet` queued for the next request or the flusher.
    Later,
}

/// Release `lease` once: later calls (explicit or a `with` exit) are no-ops.
fn release_lease(
    py: Python<'_>,
    c: &Arc<orbitkv_client::Client>,
    lease: &Lease,
    how: Release,
) -> PyResult<()> {
    if !lease.mark_released() {
        return Ok(());
    }
    let c = c.clone();
    let id = lease.id;
    py.detach(|| match how {
        Release::Wait => c.release(id),
        Release::Quiet => c.release_quiet(&[id]),
        Release::Later => c.release_later(&[id]),
    })
    .map_err(to_py)
}

/// Abort `pending` unless it was committed or aborted already.
fn abort_pending(py: Python<'_>, c: &Arc<orbitkv_client::Client>, pending: &PendingSave) -> PyResult<()> {
    if pending.done.swap(true, Ordering::AcqRel) {
        return Ok(());
    }
    let c = c.clone();
    let id = pending.id;
    py.detach(|| c.abort_save(id)).map_err(to_py)
}

/// `(segment, offset)` pairs as little-endian int64, `(-1, -1)` for `None`.
fn pack_slots(slots: impl Iterator<Item = Option<(u32, u64)>>) -> Vec<u8> {
    let mut out = Vec::with_capacity(slots.size_hint().0 * 16);
    for slot in slots {
        let (s, o) = slot.map_or((-1i64, -1i64), |(s, o)| (i64::from(s), o as i64));
        out.extend_from_slice(&s.to_le_bytes());
        out.extend_from_slice(&o.to_le_bytes());
    }
    out
}

fn acquire_slots(
    py: Python<'_>,
    c: &Arc<orbitkv_client::Client>,
    lease: &Lease,
) -> PyResult<Vec<(u32, u64)>> {
    if lease.hit_blocks == 0 {
        return Ok(Vec::new());
    }
    let mut st = lease.state();
    if st.released {
        return Err(PyValueError::new_err("lease already released"));
    }
    if let Some(s) = &st.slots {
        return Ok(s.clone());
    }
    let c = c.clone();
    let id = lease.id;
    match py.detach(|| c.acquire(id)) {
        Ok(slots) => {
            st.slots = Some(slots.clone());
            Ok(slots)
        }
        Err(e) => {
            if matches!(
                e,
                ClientError::Server {
                    code: ErrorCode::RestoreFailed,
                    ..
                }
            ) {
                st.released = true; // the Manager retired it: nothing was handed out
            }
            Err(to_py(e))
        }
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

/// Run the Manager in this process until SIGINT/SIGTERM (Python signal
/// handlers run while we wait) and return its exit code.
#[pyfunction]
fn serve(py: Python<'_>, argv: Vec<String>) -> PyResult<i32> {
    let stop = Arc::new(AtomicBool::new(false));
    let s2 = stop.clone();
    let handle = std::thread::Builder::new()
        .name("orbitkv-serve".into())
        .spawn(move || orbitkv_manager::run_until_signal(argv, s2))
        .map_err(|e| OrbitKVError::new_err(format!("cannot start the Manager thread: {e}")))?;
    loop {
        if handle.is_finished() {
            return handle
                .join()
                .map_err(|_| OrbitKVError::new_err("the Manager thread panicked"));
        }
        if let Err(e) = py.check_signals() {
            stop.store(true, Ordering::Relaxed);
            let code = py
                .detach(|| handle.join())
                .map_err(|_| OrbitKVError::new_err("the Manager thread panicked"))?;
            // KeyboardInterrupt / SystemExit from a signal handler: a clean stop.
            let is_stop = e.is_instance_of::<pyo3::exceptions::PyKeyboardInterrupt>(py)
                || e.is_instance_of::<pyo3::exceptions::PySystemExit>(py);
            return if is_stop { Ok(code) } else { Err(e) };
        }
        py.detach(|| std::thread::sleep(Duration::from_millis(50)));
    }
}

/// The 32-byte namespace salt the Manager keys a tenant salt by (the one
/// encoding, `orbitkv_client::namespace_salt`).
#[pyfunction]
fn namespace_salt<'py>(py: Python<'py>, salt: Vec<u8>) -> Bound<'py, PyBytes> {
    PyBytes::new(py, &orbitkv_client::namespace_salt(&salt))
}

#[pyfunction]
fn default_socket_path() -> String {
    orbitkv_proto::default_socket_path(orbitkv_shm::peer::my_uid())
        .display()
        .to_string()
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
