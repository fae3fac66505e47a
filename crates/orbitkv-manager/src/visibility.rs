//! The one sink the cache tells every change of a block's visibility (under its
//! lock): the presence table's publisher, when there is one, the KV-event stream,
//! when there is one, and the trace, which
//! remembers while armed which blocks left the cache (so `orbitkv trace` can say a
//! missing block was evicted rather than never saved).

use std::sync::Arc;

use orbitkv_core::{BlockKey, PresenceSink};

use crate::trace::Tracer;

pub struct Visibility {
    pub presence: Option<Box<dyn PresenceSink>>,
    pub events: Option<crate::events::Sink>,
    pub tracer: Arc<Tracer>,
}

impl std::fmt::Debug for Visibility {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Visibility")
            .field("presence", &self.presence.is_some())
            .field("events", &self.events.is_some())
            .finish_non_exhaustive()
    }
}

impl PresenceSink for Visibility {
    fn changed(&mut self, key: &BlockKey, visible: bool, in_dram: bool) {
        if let Some(p) = self.presence.as_mut() {
            p.changed(key, visible, in_dram);
        }
        if let Some(e) = self.events.as_ref() {
            e.changed(key, visible, in_dram);
        }
        if !visible {
            self.tracer.left(key);
        }
    }

    fn moved(&mut self, key: &BlockKey, in_dram: bool) {
        if let Some(e) = self.events.as_ref() {
            e.moved(key, in_dram);
        }
    }
}
