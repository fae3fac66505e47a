//! Background lookups: the `PendingLookup` class `Client.start_lookup`
//! returns, and the job and answer slot it shares with the client's lookup
//! thread.

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use orbitkv_client::ClientError;
use pyo3::exceptions::PyValueError;
use pyo3::prelude::*;

use crate::errors::to_py;
use crate::lease::Lease;

/// The answer slot of a lookup run by a client's background thread.
pub(crate) type LookupSlot = Arc<(
    Mutex<Option<Result<orbitkv_client::LookupHit, ClientError>>>,
    std::sync::Condvar,
)>;

/// A lookup handed to the client's background thread.
pub(crate) struct LookupJob {
    pub(crate) ns: orbitkv_client::Namespace,
    pub(crate) hashes: Vec<[u8; 32]>,
    pub(crate) slot: LookupSlot,
}

/// A lookup in flight on the client's background thread (`Client.start_lookup`):
/// no Python code runs for it there, so it needs no GIL and never waits for the
/// thread that started it.
#[pyclass(frozen, module = "orbitkv._native")]
pub(crate) struct PendingLookup {
    pub(crate) client: Arc<orbitkv_client::Client>,
    pub(crate) slot: LookupSlot,
    pub(crate) block_bytes: u64,
}

#[pymethods]
impl PendingLookup {
    /// True once the Manager answered (or the lookup failed).
    fn done(&self) -> bool {
        self.slot.0.lock().unwrap_or_else(|p| p.into_inner()).is_some()
    }

    /// Wait at most `timeout_s` seconds, with the GIL released, for the answer:
    /// True once it is there (or the lookup failed: `result()` then raises at
    /// once), False when the time ran out first. A timeout that is negative or
    /// not finite is a `ValueError`.
    fn wait(&self, py: Python<'_>, timeout_s: f64) -> PyResult<bool> {
        if !timeout_s.is_finite() || timeout_s < 0.0 {
            return Err(PyValueError::new_err(format!(
                "wait: timeout_s must be a finite number of seconds >= 0, got {timeout_s}"
            )));
        }
        let deadline = Instant::now() + Duration::from_secs_f64(timeout_s);
        Ok(py.detach(|| {
            let (m, cv) = &*self.slot;
            let mut g = m.lock().unwrap_or_else(|p| p.into_inner());
            loop {
                if g.is_some() || Arc::strong_count(&self.slot) == 1 {
                    return true; // answered, or the thread is gone: result() says which
                }
                let now = Instant::now();
                if now >= deadline {
                    return false;
                }
                g = cv
                    .wait_timeout(g, deadline - now)
                    .map(|(g, _)| g)
                    .unwrap_or_else(|p| p.into_inner().0);
            }
        }))
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
        Ok(Lease::from_hit(&self.client, &hit, self.block_bytes))
    }
}
