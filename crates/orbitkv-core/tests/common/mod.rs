//! A `PresenceSink` that records what it is told, so property tests can check
//! that it stays in step with the blocks visible to lookups.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use orbitkv_core::{BlockKey, CacheState, PresenceSink};

#[derive(Debug, Clone, Default)]
pub struct Recorder(Arc<Mutex<HashMap<BlockKey, i64>>>);

impl PresenceSink for Recorder {
    fn changed(&mut self, key: &BlockKey, visible: bool, _in_dram: bool) {
        let mut m = self.0.lock().unwrap_or_else(|p| p.into_inner());
        *m.entry(*key).or_default() += if visible { 1 } else { -1 };
    }
}

impl Recorder {
    pub fn install(c: &mut CacheState) -> Recorder {
        let r = Recorder::default();
        c.set_presence_sink(Box::new(r.clone()));
        r
    }

    /// Every visible block was told visible exactly once more than hidden,
    /// every other block as often visible as hidden.
    pub fn check(&self, c: &CacheState) -> Result<(), String> {
        let m = self.0.lock().unwrap_or_else(|p| p.into_inner());
        let visible: std::collections::HashSet<BlockKey> = c.visible_blocks().into_iter().collect();
        for (k, n) in m.iter() {
            let want = i64::from(visible.contains(k));
            if *n != want {
                return Err(format!(
                    "presence sink holds {k:?} {n} time(s), visible: {}",
                    want == 1
                ));
            }
        }
        for k in &visible {
            if !m.contains_key(k) {
                return Err(format!("visible block {k:?} never told to the presence sink"));
            }
        }
        Ok(())
    }
}
