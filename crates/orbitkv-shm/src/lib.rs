//! Shared-memory and socket primitives for the DRAM arena.
//!
//! - [`Segment`]: a sealed memfd of fixed size, created by the Manager, on base
//!   or reserved huge pages ([`PageSize`]).
//! - [`Mapping`]: a `MAP_SHARED` read-write mapping of a segment, in the
//!   Manager or in a client after fd passing; bounds-checked copies.
//! - [`fdpass`]: `SCM_RIGHTS` send/receive on Unix stream sockets.
//! - [`peer`]: `SO_PEERCRED` and pidfd-based proof that a process is gone.
//! - [`presence`]: the Manager's read-only (for clients) table answering
//!   "certainly absent" without a message.
//!
//! Every `unsafe` block of this crate lives in `mapping.rs`, `words.rs`
//! (atomic word access to the presence table) and `ucred.rs` (one raw
//! `getsockopt(SO_PEERCRED)`); `fdpass`, `peer` and
//! `presence` use safe wrappers; elsewhere `unsafe_code` is denied.
#![deny(unsafe_op_in_unsafe_fn, unsafe_code)]

pub mod fdpass;
#[allow(unsafe_code)] // memfd mappings: raw-pointer copies and borrowed slices
mod mapping;
pub mod peer;
pub mod presence;
#[allow(unsafe_code)] // one getsockopt into a local ucred
mod ucred;
#[allow(unsafe_code)] // shared words accessed only atomically
mod words;

pub use mapping::{Mapping, PageSize, Segment, ShmError, populate_threads};
