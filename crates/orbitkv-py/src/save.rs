//! Saves: the `PendingSave` class (a begun save's slots, aborted by leaving
//! a `with` block uncommitted) and the `SaveResult` class (what `Client.save`
//! stored).

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use orbitkv_client::SlotStatus;
use pyo3::prelude::*;
use pyo3::types::{PyBytes, PyTuple};

use crate::errors::to_py;
use crate::lease::pack_slots;

#[pyclass(frozen, module = "orbitkv._native")]
pub(crate) struct SaveResult {
    #[pyo3(get)]
    pub(crate) stored: u32,
    #[pyo3(get)]
    pub(crate) already_present: u32,
    #[pyo3(get)]
    pub(crate) refused: u32,
    #[pyo3(get)]
    pub(crate) bytes_copied: u64,
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
pub(crate) struct PendingSave {
    pub(crate) client: Arc<orbitkv_client::Client>,
    #[pyo3(get)]
    pub(crate) id: u64,
    pub(crate) items: Vec<SlotStatus>,
    pub(crate) session: u64,
    pub(crate) done: AtomicBool,
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
    #[pyo3(signature = (*_exc))]
    fn __exit__(&self, py: Python<'_>, _exc: &Bound<'_, PyTuple>) -> PyResult<()> {
        abort_pending(py, &self.client, self)
    }
}

/// Abort `pending` unless it was committed or aborted already.
pub(crate) fn abort_pending(
    py: Python<'_>,
    c: &Arc<orbitkv_client::Client>,
    pending: &PendingSave,
) -> PyResult<()> {
    if pending.done.swap(true, Ordering::AcqRel) {
        return Ok(());
    }
    let c = c.clone();
    let id = pending.id;
    py.detach(|| c.abort_save(id)).map_err(to_py)
}
