//! What serving peers is handed of this Manager ([`Source`]), and what owns it
//! ([`SourceHost`]): used by the connections of `source.rs` and by the TP
//! requests they carry (`tp.rs`). The Manager's wiring builds it.

use super::PeerTier;
use crate::config::ManagerConfig;
use crate::latency::Histogram;
use crate::parts::{Arena, Clock, Shutdown};
use crate::tier::Tier;

/// What serving peers reads and changes of this Manager, and nothing else: the
/// peer tier's own state, the arena blocks are sent from, the tier SSD-only
/// blocks are staged from, the clock of TP deadlines, the settings, the stop flag.
#[derive(Clone, Copy)]
pub struct Source<'a> {
    pub peer: &'a PeerTier,
    pub arena: Arena<'a>,
    pub tier: Option<&'a dyn Tier>,
    /// Where staging reads for a peer's fetch are timed (the Manager's `ssd_read`).
    pub ssd_read: &'a Histogram,
    pub config: &'a ManagerConfig,
    pub clock: Clock,
    pub shutdown: &'a Shutdown,
}

/// What a [`Source`] borrows from: the peer listener hands each connection's
/// thread a clone of its `Arc` (keeping it alive) and serves from its
/// [`Source`] only.
pub trait SourceHost: Send + Sync + 'static {
    /// `None` when no peer tier is configured.
    fn source(&self) -> Option<Source<'_>>;
}
