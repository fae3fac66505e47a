//! Python buffers as raw byte ranges that can be used with the GIL released.
//!
//! The only `unsafe` of the bindings: turning a held `PyBuffer` into a Rust
//! slice. The `PyBuffer` (an exported view) is kept alive for as long as the
//! slice is used, which also stops the exporter (bytearray, numpy array) from
//! resizing or freeing its memory. What a held buffer cannot prove, the
//! callers in `lib.rs` check before making slices: destinations writable and
//! pairwise disjoint, and no range overlapping the client's arena mapping
//! (the arena side of a copy is a second view of that memory). Concurrent
//! *Python-side* writers of the same memory are outside what Rust can see:
//! the binding documents that a buffer must not be written by anyone else
//! while a call copies into or out of it.

use orbitkv_client::{ClientError, EngineMemory, ReadRun, WriteRun};
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

    /// `[offset, offset + len)` of this range; `None` when it reaches past it.
    pub fn sub(&self, offset: usize, len: usize) -> Option<RawRange> {
        let end = offset.checked_add(len)?;
        (end <= self.len).then_some(RawRange {
            ptr: self.ptr + offset,
            len,
            writable: self.writable,
        })
    }

    /// # Safety
    /// The `HeldBuffer` this range came from must outlive the returned slice,
    /// and no Rust `&mut` to any of its bytes (including through the arena
    /// mapping) may exist while it lives.
    pub unsafe fn as_slice<'a>(&self) -> &'a [u8] {
        // SAFETY: ptr/len describe a sub-range of a live, C-contiguous exported
        // buffer (the caller keeps its `HeldBuffer`), so it is valid for reads of
        // `len` bytes; the caller guarantees no mutable alias.
        unsafe { std::slice::from_raw_parts(self.ptr as *const u8, self.len) }
    }

    /// # Safety
    /// As [`RawRange::as_slice`], and no other Rust reference to any of its
    /// bytes may exist while the slice lives. Writability is checked here.
    pub unsafe fn as_mut_slice<'a>(&self) -> &'a mut [u8] {
        assert!(self.writable, "a read-only buffer was used as a copy destination");
        // SAFETY: valid for `len` bytes as in `as_slice`; the exporter declared
        // the buffer writable (asserted above); exclusivity is the caller's.
        unsafe { std::slice::from_raw_parts_mut(self.ptr as *mut u8, self.len) }
    }
}

/// A held buffer as the engine memory of a page gather/scatter: lends out
/// only the run being copied, so concurrent copies of other pages of the same
/// region (another load, the engine's own kernels) never alias a Rust slice.
pub struct HeldRegion<'a> {
    _held: &'a HeldBuffer,
    range: RawRange,
}

impl<'a> HeldRegion<'a> {
    pub fn new(held: &'a HeldBuffer) -> HeldRegion<'a> {
        HeldRegion {
            _held: held,
            range: held.range(),
        }
    }

    fn run(&self, offset: u64, len: usize) -> Result<RawRange, ClientError> {
        usize::try_from(offset)
            .ok()
            .and_then(|o| self.range.sub(o, len))
            .ok_or_else(|| {
                ClientError::Invalid(format!(
                    "run [{offset}, +{len}) outside the {}-byte KV region",
                    self.range.len
                ))
            })
    }
}

impl EngineMemory for HeldRegion<'_> {
    fn region_len(&self) -> u64 {
        self.range.len as u64
    }

    fn with_run(&self, offset: u64, len: usize, f: ReadRun<'_>) -> Result<(), ClientError> {
        let r = self.run(offset, len)?;
        // SAFETY: `r` lies inside the buffer `_held` keeps alive for `'a`, which
        // outlives this call; `lib.rs` proved the region does not overlap the
        // arena mapping that `f` writes, and the slice dies before this returns.
        f(unsafe { r.as_slice() })
    }

    fn with_run_mut(&mut self, offset: u64, len: usize, f: WriteRun<'_>) -> Result<(), ClientError> {
        if !self.range.writable {
            return Err(ClientError::Invalid("the KV region is read-only".into()));
        }
        let r = self.run(offset, len)?;
        // SAFETY: as in `with_run`, and the region is writable (checked above);
        // `&mut self` means no other run of this region is lent out meanwhile, and
        // the page layout visits each byte of a block once, so this slice is the
        // only Rust reference to these bytes until it dies at the end of `f`.
        f(unsafe { r.as_mut_slice() })
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
        if n != blocks {
            return Err(PyValueError::new_err(format!(
                "buffer count mismatch: expected {blocks} buffers (one per block), got {n} [size_mismatch]"
            )));
        }
        let mut held = Vec::with_capacity(blocks);
        let mut ranges = Vec::with_capacity(blocks);
        for i in 0..blocks {
            let h = hold(py, &obj.get_item(i)?, writable)?;
            let r = h.range();
            if r.len() != block_bytes {
                return Err(PyValueError::new_err(format!(
                    "buffer {i} size mismatch: expected {block_bytes} bytes (one block), got {} [size_mismatch]",
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
        if r.len() != need {
            return Err(PyValueError::new_err(format!(
                "buffer size mismatch: expected {need} bytes ({blocks} block(s) of {block_bytes}), got {} [size_mismatch]",
                r.len()
            )));
        }
        let ranges = (0..blocks)
            .map(|i| r.sub(i * block_bytes, block_bytes))
            .collect::<Option<Vec<_>>>()
            .ok_or_else(|| PyValueError::new_err("block range outside the buffer"))?;
        Ok((vec![h], ranges))
    }
}
