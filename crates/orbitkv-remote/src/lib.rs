//! OrbitKV's remote tier on an existing distributed store (Redis Cluster / Valkey):
//! blocks written behind by every host's Manager, read on a local miss after DRAM, SSD
//! and peers.
//!
//! This crate holds the parts that do not talk to the store, so they are tested (and
//! fuzzed) on their own:
//!
//! - [`value`]: what every block carries in the store — a checksummed header naming the
//!   block's full key (namespace fingerprint, shard, salt, generation, hash), the payload
//!   length and the payload's checksum — and [`value::verify`], which turns anything
//!   else (another writer's value, a truncated one, another model's or salt's, a torn
//!   write) into a miss with its reason, never into bytes served;
//! - [`value::store_key`]: the store key of a block, a digest of its full key, so key
//!   names reveal no model fingerprint or salt;
//! - [`breaker`]: the circuit breaker that makes an unreachable store cost nothing per
//!   lookup.
//!
//! - [`store`]: the store itself, a Redis Cluster reached through the `redis` crate's
//!   synchronous cluster client (ACL user, password file, TLS), each request under a
//!   deadline and the breaker.
//!
//! The Manager's writer thread and read path through it are in `orbitkv-manager`'s
//! `remote.rs`.
#![deny(unsafe_code)]
#![deny(clippy::unwrap_used, clippy::expect_used)]
#![warn(missing_docs)]

pub mod breaker;
pub mod store;
pub mod value;
