//! Python buffers as raw byte ranges that can be used with the GIL released.
//!
//! The only `unsafe` of the bindings: turning a held `PyBuffer` into a Rust
//! slice. The `PyBuffer` (an exported view) is kept alive for as long as the
//! slice is used, which also stops the exporter (bytearray, numpy array) from
//! resizing or freeing its memory.

use pyo3::buffer::PyBuffer;
use pyo3::exceptions::{PyTypeError, PyValueError};
use pyo3::prelude::*;
use pyo3::types::{PyList, PyTuple};

/// A held C-contiguous byte view.
pub struct HeldBuffer {
    buf: PyBuffer<u8>,
}

// The raw pointer of a held buffer, sendable into `Python::detach`.
#[derive(Clone, Copy)]
pub struct RawRange {
    ptr: usize,
    len: usize,
    writable: bool,
}

impl HeldBuffer {
    pub fn range(&self) -> RawRange {
        RawRange {
            ptr: self.buf.buf_ptr() as usize,
            len: self.buf.len_bytes(),
            writable: !self.buf.readonly(),
        }
    }
}

impl RawRange {
    pub fn len(&self) -> usize {
        self.len
    }

    pub fn bounds(&self) -> (usize, usize) {
        (self.ptr, self.ptr + self.len)
    }

    pub fn sub(&self, offset: usize, len: usize) -> RawRange {
        debug_assert!(offset + len <= self.len);
        RawRange {
            ptr: self.ptr + offset,
            len,
            writable: self.writable,
        }
    }

    /// # Safety
    /// The `HeldBuffer` this range came from must outlive the returned slice,
    /// and no other Rust reference to the same memory may exist meanwhile.
    pub unsafe fn as_slice<'a>(&self) -> &'a [u8] {
        // SAFETY: ptr/len describe a live, C-contiguous exported buffer (held by
        // the caller's `HeldBuffer`), so the range is valid for reads.
        unsafe { std::slice::from_raw_parts(self.ptr as *const u8, self.len) }
    }

    /// # Safety
    /// As [`RawRange::as_slice`], and the buffer must be writable (checked at
    /// acquisition) and not aliased by another live Rust slice.
    pub unsafe fn as_mut_slice<'a>(&self) -> &'a mut [u8] {
        debug_assert!(self.writable);
        // SAFETY: as above; writability was checked when the buffer was taken.
        unsafe { std::slice::from_raw_parts_mut(self.ptr as *mut u8, self.len) }
    }
}

/// Take a byte view of `obj`: any C-contiguous buffer-protocol object (cast
/// to bytes whatever its item format), or a CPU torch tensor (viewed as uint8
/// through numpy, zero-copy).
pub fn hold(py: Python<'_>, obj: &Bound<'_, PyAny>, writable: bool) -> PyResult<HeldBuffer> {
    let view = byte_view(py, obj)?;
    let buf = PyBuffer::<u8>::get(&view)?;
    if !buf.is_c_contiguous() {
        return Err(PyValueError::new_err("buffer must be C-contiguous"));
    }
    if writable && buf.readonly() {
        return Err(PyTypeError::new_err("destination buffer is read-only"));
    }
    Ok(HeldBuffer { buf })
}

fn byte_view<'py>(py: Python<'py>, obj: &Bound<'py, PyAny>) -> PyResult<Bound<'py, PyAny>> {
    let builtins = py.import("builtins")?;
    let memoryview = builtins.getattr("memoryview")?;
    let mv = match memoryview.call1((obj,)) {
        Ok(mv) => mv,
        Err(e) => {
            // torch.Tensor has no buffer protocol; view it as bytes via numpy.
            if obj.hasattr("data_ptr")? && obj.hasattr("numpy")? {
                if obj.getattr("is_cuda")?.is_truthy()? {
                    return Err(PyTypeError::new_err(
                        "CUDA tensors are not host buffers; the host copy path needs a CPU tensor",
                    ));
                }
                if !obj.call_method0("is_contiguous")?.is_truthy()? {
                    return Err(PyValueError::new_err("tensor must be contiguous"));
                }
                let torch = py.import("torch")?;
                let flat = obj.call_method1("reshape", (-1,))?;
                let bytes = flat.call_method1("view", (torch.getattr("uint8")?,))?;
                memoryview.call1((bytes.call_method0("numpy")?,))?
            } else {
                return Err(e);
            }
        }
    };
    let fmt: String = mv.getattr("format")?.extract()?;
    let ndim: usize = mv.getattr("ndim")?.extract()?;
    if fmt == "B" && ndim == 1 {
        return Ok(mv);
    }
    if !mv.getattr("c_contiguous")?.is_truthy()? {
        return Err(PyValueError::new_err("buffer must be C-contiguous"));
    }
    mv.call_method1("cast", ("B",))
}

/// `obj` is one buffer or a sequence of buffers. Returns held buffers and one
/// `block_bytes` range per block (a single buffer is split into blocks).
pub fn hold_blocks(
    py: Python<'_>,
    obj: &Bound<'_, PyAny>,
    block_bytes: usize,
    blocks: usize,
    writable: bool,
) -> PyResult<(Vec<HeldBuffer>, Vec<RawRange>)> {
    let is_seq = obj.is_instance_of::<PyList>() || obj.is_instance_of::<PyTuple>();
    if is_seq {
        let n = obj.len()?;
        if n < blocks {
            return Err(PyValueError::new_err(format!(
                "{n} buffers given for {blocks} blocks"
            )));
        }
        let mut held = Vec::with_capacity(blocks);
        let mut ranges = Vec::with_capacity(blocks);
        for i in 0..blocks {
            let h = hold(py, &obj.get_item(i)?, writable)?;
            let r = h.range();
            if r.len() != block_bytes {
                return Err(PyValueError::new_err(format!(
                    "buffer {i} has {} bytes, block_bytes is {block_bytes}",
                    r.len()
                )));
            }
            ranges.push(r);
            held.push(h);
        }
        Ok((held, ranges))
    } else {
        let h = hold(py, obj, writable)?;
        let r = h.range();
        let need = block_bytes
            .checked_mul(blocks)
            .ok_or_else(|| PyValueError::new_err("size overflow"))?;
        if r.len() < need {
            return Err(PyValueError::new_err(format!(
                "buffer has {} bytes, {blocks} block(s) of {block_bytes} need {need}",
                r.len()
            )));
        }
        let ranges = (0..blocks).map(|i| r.sub(i * block_bytes, block_bytes)).collect();
        Ok((vec![h], ranges))
    }
}
