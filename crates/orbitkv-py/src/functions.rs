//! The module-level functions of `orbitkv._native`: `serve` (the Manager,
//! run in this process), `namespace_salt` and `default_socket_path`.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use pyo3::prelude::*;
use pyo3::types::PyBytes;

use crate::errors::OrbitKVError;

/// Run the Manager in this process until SIGINT/SIGTERM (Python signal
/// handlers run while we wait) and return its exit code.
#[pyfunction]
pub(crate) fn serve(py: Python<'_>, argv: Vec<String>) -> PyResult<i32> {
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
pub(crate) fn namespace_salt<'py>(py: Python<'py>, salt: Vec<u8>) -> Bound<'py, PyBytes> {
    PyBytes::new(py, &orbitkv_client::namespace_salt(&salt))
}

#[pyfunction]
pub(crate) fn default_socket_path() -> String {
    orbitkv_proto::default_socket_path(orbitkv_shm::peer::my_uid())
        .display()
        .to_string()
}
