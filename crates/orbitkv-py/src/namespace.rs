//! The `Namespace` class: a registered namespace, read-only (its id,
//! generation, block bytes, fingerprint and shard).

use pyo3::prelude::*;
use pyo3::types::PyBytes;

#[pyclass(frozen, module = "orbitkv._native")]
pub(crate) struct Namespace {
    pub(crate) inner: orbitkv_client::Namespace,
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
