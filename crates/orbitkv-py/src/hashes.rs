//! Block hashes from Python arguments: [`hash32`] (one 32-byte value) and
//! [`Hashes`] (any iterable of them).

use pyo3::exceptions::{PyTypeError, PyValueError};
use pyo3::prelude::*;
use pyo3::types::{PyBytes, PyString};

pub(crate) fn hash32(b: &[u8], what: &str) -> PyResult<[u8; 32]> {
    b.try_into()
        .map_err(|_| PyValueError::new_err(format!("{what} must be exactly 32 bytes, got {}", b.len())))
}

/// Block hashes from any iterable of 32-byte buffers. `bytes` items are
/// copied straight into place (no buffer per item: a scheduler passes tens of
/// hashes per request); other buffers (`bytearray`, `memoryview`) are read as
/// bytes first.
pub(crate) struct Hashes(pub(crate) Vec<[u8; 32]>);

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
