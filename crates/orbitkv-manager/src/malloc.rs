//! The C allocator's settings for the Manager's large transient buffers.
//!
//! Remote-tier fills receive each block into a buffer of the block's size (the `redis`
//! crate allocates one per reply), hold it until the block is copied into the arena, and
//! free it. With glibc's defaults a buffer of more than the dynamic mmap
//! threshold is a fresh `mmap` — every page faulted in and zeroed by the kernel — and
//! `munmap`ed when freed; measured on a loopback Redis Cluster (`cargo run --release -p
//! orbitkv-remote --example fill_rate`, 4 MiB blocks, 2-core VM) that churn halved the
//! read rate: one GET at a time 1.7 → 2.1 GB/s, pipelines of two 0.9 → 2.0 GB/s with the
//! settings below. So buffers up to [`MMAP_THRESHOLD`] come from the heap, and up to
//! [`TRIM_THRESHOLD`] of freed heap stays mapped for the next fill instead of being
//! returned to the kernel at once. The cost is memory the process keeps after a burst of
//! fills: at most what the burst used at once, per allocator arena.

/// Allocations above this are still served by `mmap` (glibc's maximum for the setting).
pub const MMAP_THRESHOLD: usize = 32 << 20;
/// Free memory at the top of an allocator arena kept before it is returned to the kernel.
pub const TRIM_THRESHOLD: usize = 128 << 20;

/// Apply the settings (glibc only; elsewhere the allocator's defaults stay). Call once,
/// before the Manager's threads start. Returns whether both were accepted.
#[cfg(all(target_os = "linux", target_env = "gnu"))]
#[allow(unsafe_code)]
pub fn tune() -> bool {
    // SAFETY: `mallopt` only changes the allocator's parameters (it takes the arenas'
    // locks itself); the arguments are constants in its documented range, and nothing
    // refers to memory through it.
    unsafe {
        libc::mallopt(libc::M_MMAP_THRESHOLD, MMAP_THRESHOLD as libc::c_int) == 1
            && libc::mallopt(libc::M_TRIM_THRESHOLD, TRIM_THRESHOLD as libc::c_int) == 1
    }
}

/// Apply the settings (glibc only; elsewhere the allocator's defaults stay).
#[cfg(not(all(target_os = "linux", target_env = "gnu")))]
pub fn tune() -> bool {
    false
}

#[cfg(test)]
mod tests {
    #[test]
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    fn glibc_accepts_the_settings() {
        assert!(super::tune());
        // A buffer of a typical block now comes from the heap and is reused.
        let a = vec![1u8; 4 << 20];
        let p = a.as_ptr() as usize;
        drop(a);
        let b = vec![2u8; 4 << 20];
        assert_eq!(b.as_ptr() as usize, p, "the freed 4 MiB buffer was not reused");
    }
}
