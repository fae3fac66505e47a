//! Leases: the `Lease` class (a lookup's pinned hit, acquired once and
//! released once, also by leaving a `with` block), the `TpLease` class
//! (contract T1), and what the `Client` methods share for them: acquiring a
//! lease's slots, packing slots into bytes, releasing in one of three ways.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};

use orbitkv_client::ClientError;
use orbitkv_proto::ErrorCode;
use pyo3::exceptions::PyValueError;
use pyo3::prelude::*;
use pyo3::types::{PyBytes, PyTuple};

use crate::errors::to_py;

#[derive(Default)]
pub(crate) struct LeaseState {
    slots: Option<Vec<(u32, u64)>>,
    released: bool,
}

#[pyclass(frozen, module = "orbitkv._native")]
pub(crate) struct Lease {
    pub(crate) client: Arc<orbitkv_client::Client>,
    #[pyo3(get)]
    pub(crate) id: u64,
    #[pyo3(get)]
    pub(crate) hit_blocks: u32,
    /// Indices (ascending) of the hit blocks the Manager held on SSD only at
    /// lookup time; the other hit blocks were in DRAM.
    #[pyo3(get)]
    pub(crate) ssd_blocks: Vec<u32>,
    #[pyo3(get)]
    pub(crate) block_bytes: u64,
    /// The session that holds this lease (`Client.session_id` of its client).
    #[pyo3(get)]
    pub(crate) session: u64,
    pub(crate) state: Mutex<LeaseState>,
}

impl Lease {
    /// The lease of `hit`, a lookup (or redeem) answered to `client` in a
    /// namespace of `block_bytes` blocks; not acquired, not released.
    pub(crate) fn from_hit(
        client: &Arc<orbitkv_client::Client>,
        hit: &orbitkv_client::LookupHit,
        block_bytes: u64,
    ) -> Lease {
        Lease {
            client: client.clone(),
            id: hit.lease,
            hit_blocks: hit.hit_blocks,
            ssd_blocks: hit.ssd_blocks.clone(),
            block_bytes,
            session: client.session_id(),
            state: Mutex::new(LeaseState::default()),
        }
    }

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
    #[pyo3(signature = (*_exc))]
    fn __exit__(&self, py: Python<'_>, _exc: &Bound<'_, PyTuple>) -> PyResult<()> {
        release_lease(py, &self.client, self, Release::Wait)
    }
}

/// A TP lease (contract T1): the common prefix of every declared shard, pinned
/// in each until every rank's worker reported done or the owner releases it.
/// `token` is what the workers redeem (`Client.redeem_tp`); it is a capability.
#[pyclass(frozen, module = "orbitkv._native")]
pub(crate) struct TpLease {
    pub(crate) token: [u8; orbitkv_proto::TP_TOKEN_BYTES],
    #[pyo3(get)]
    pub(crate) hit_blocks: u32,
    /// Indices of hit blocks some shard held on SSD only at lookup time.
    #[pyo3(get)]
    pub(crate) ssd_blocks: Vec<u32>,
    #[pyo3(get)]
    pub(crate) generation: u64,
    /// The session that owns it (`Client.session_id` of its client).
    #[pyo3(get)]
    pub(crate) session: u64,
    pub(crate) released: AtomicBool,
}

#[pymethods]
impl TpLease {
    #[getter]
    fn token<'py>(&self, py: Python<'py>) -> Bound<'py, PyBytes> {
        PyBytes::new(py, &self.token)
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

/// How a lease is released.
#[derive(Clone, Copy)]
pub(crate) enum Release {
    /// `Release`, waiting for the Manager's answer.
    Wait,
    /// `ReleaseQuiet` sent now; no answer read.
    Quiet,
    /// `ReleaseQuiet` queued for the next request or the flusher.
    Later,
}

/// Release `lease` once: later calls (explicit or a `with` exit) are no-ops.
pub(crate) fn release_lease(
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

/// `(segment, offset)` pairs as little-endian int64, `(-1, -1)` for `None`.
pub(crate) fn pack_slots(slots: impl Iterator<Item = Option<(u32, u64)>>) -> Vec<u8> {
    let mut out = Vec::with_capacity(slots.size_hint().0 * 16);
    for slot in slots {
        let (s, o) = slot.map_or((-1i64, -1i64), |(s, o)| (i64::from(s), o as i64));
        out.extend_from_slice(&s.to_le_bytes());
        out.extend_from_slice(&o.to_le_bytes());
    }
    out
}

pub(crate) fn acquire_slots(
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
