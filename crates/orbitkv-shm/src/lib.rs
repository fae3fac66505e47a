//! Shared-memory and socket primitives for the DRAM arena.
//!
//! - [`Segment`]: a sealed memfd of fixed size, created by the Manager, on base
//!   or reserved huge pages ([`PageSize`]).
//! - [`Mapping`]: a `MAP_SHARED` read-write mapping of a segment, in the
//!   Manager or in a client after fd passing; bounds-checked copies.
//! - [`fdpass`]: `SCM_RIGHTS` send/receive on Unix stream sockets.
//! - [`peer`]: `SO_PEERCRED` and pidfd-based proof that a process is gone.
//!
//! Every `unsafe` block of OrbitKV's host path lives in `mapping.rs`.
#![deny(unsafe_op_in_unsafe_fn)]

pub mod fdpass;
mod mapping;
pub mod peer;

pub use mapping::{Mapping, PageSize, Segment, ShmError};
