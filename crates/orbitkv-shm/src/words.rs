//! Shared memory viewed as an array of 64-bit words accessed only atomically:
//! the presence table's storage (`presence.rs` holds the logic, in safe code).
//!
//! Another process writes these words while we read them (or the reverse), so
//! every access is an atomic load or store of one aligned word: no Rust
//! reference to the bytes exists, and any bit pattern is a valid `u64`, so
//! arbitrary contents written by anyone can never cause undefined behaviour,
//! only wrong answers, which the caller's protocol tolerates.

use std::os::fd::AsFd;
use std::ptr::NonNull;
use std::sync::atomic::{AtomicU64, Ordering};

use rustix::mm::{MapFlags, ProtFlags};

use crate::ShmError;

/// `len` words of a `MAP_SHARED` mapping, read-only or read-write.
#[derive(Debug)]
pub(crate) struct Words {
    ptr: NonNull<u64>,
    /// In words; the mapping is `len * 8` bytes.
    len: usize,
    writable: bool,
}

// SAFETY: the mapping has no thread affinity, and every access goes through
// `AtomicU64`, so concurrent use from several threads is data-race free.
unsafe impl Send for Words {}
// SAFETY: as above: `&self` methods only perform atomic loads and stores.
unsafe impl Sync for Words {}

impl Words {
    /// Map the first `len` words of `fd`. The file must hold at least that
    /// many bytes (checked with `fstat`), so no access can fault on a hole past
    /// its end. A sealed memfd (`F_SEAL_SHRINK`) cannot shrink later.
    pub(crate) fn map(fd: impl AsFd, len: usize, writable: bool) -> Result<Words, ShmError> {
        let bytes = len
            .checked_mul(8)
            .filter(|b| *b > 0)
            .ok_or(ShmError::SizeMismatch {
                expected: u64::MAX,
                actual: 0,
            })?;
        let st = rustix::fs::fstat(&fd).map_err(ShmError::Stat)?;
        let actual = u64::try_from(st.st_size).unwrap_or(0);
        if actual < bytes as u64 {
            return Err(ShmError::SizeMismatch {
                expected: bytes as u64,
                actual,
            });
        }
        let prot = if writable {
            ProtFlags::READ | ProtFlags::WRITE
        } else {
            ProtFlags::READ
        };
        // SAFETY: a fresh mapping at a kernel-chosen address (null hint), so it
        // overlaps no Rust-owned memory; the fd is valid for the call.
        let ptr = unsafe { rustix::mm::mmap(std::ptr::null_mut(), bytes, prot, MapFlags::SHARED, &fd, 0) }
            .map_err(|err| ShmError::Map {
                size: bytes as u64,
                err,
            })?;
        let ptr = NonNull::new(ptr.cast::<u64>()).ok_or(ShmError::Map {
            size: bytes as u64,
            err: rustix::io::Errno::INVAL,
        })?;
        Ok(Words { ptr, len, writable })
    }

    fn atomic(&self, i: usize) -> &AtomicU64 {
        // Callers index with values they computed themselves, but a bad index
        // must stay a panic-free wrong answer, never an access outside the map.
        let i = i.min(self.len - 1);
        // SAFETY: `i < len`, so the word lies inside the live mapping; mmap
        // returns page-aligned memory, so every word is 8-aligned as
        // `AtomicU64` requires. Every access to the region in this process is
        // atomic (this type hands out no other view), so there is no mixed
        // atomic/non-atomic access. A read-only mapping is only ever loaded
        // (`store` refuses it), and atomic loads of a native-width integer
        // from read-only memory are allowed. The borrow cannot outlive `self`,
        // which unmaps only in `Drop`.
        unsafe { AtomicU64::from_ptr(self.ptr.as_ptr().add(i)) }
    }

    /// Load word `i` (clamped to the last word).
    pub(crate) fn load(&self, i: usize, order: Ordering) -> u64 {
        self.atomic(i).load(order)
    }

    /// Store word `i` (clamped to the last word). A no-op on a read-only
    /// mapping (writing it would fault); only the Manager maps writable.
    pub(crate) fn store(&self, i: usize, v: u64, order: Ordering) {
        if self.writable {
            self.atomic(i).store(v, order);
        }
    }
}

impl Drop for Words {
    fn drop(&mut self) {
        // SAFETY: ptr and len * 8 are exactly what mmap returned, unmapped once
        // here; the atomics handed out borrow `self`, so none survives this.
        let _ = unsafe { rustix::mm::munmap(self.ptr.as_ptr().cast(), self.len * 8) };
    }
}
