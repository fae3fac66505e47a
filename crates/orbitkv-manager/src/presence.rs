//! The Manager's side of the presence table (`orbitkv_shm::presence`): the
//! `PresenceSink` installed into the cache state (so the table's one writer
//! runs under the cache lock, told every visibility change), the per-Manager
//! secret and the per-namespace keys handed out in `RegisterNamespace` replies.

use std::collections::HashMap;
use std::io::Read;
use std::os::fd::OwnedFd;
use std::sync::{Arc, Mutex};

use orbitkv_core::{BlockKey, NsId, PresenceSink};
use orbitkv_proto::PRESENCE_KEY_BYTES;
use orbitkv_shm::ShmError;
use orbitkv_shm::presence::{PresenceStats, PresenceView, PresenceWriter, fingerprint, namespace_key};

/// What the rest of the Manager sees: the fd for `HelloOk`, stats, keys.
pub struct Presence {
    secret: [u8; 32],
    /// Read-only view of our own table (fd to pass, header stats).
    view: PresenceView,
    /// Shared with the sink; locked only under the cache lock, and at shutdown.
    writer: Arc<Mutex<PresenceWriter>>,
}

/// The sink inside `CacheState`.
struct Publisher {
    secret: [u8; 32],
    keys: HashMap<NsId, [u8; PRESENCE_KEY_BYTES]>,
    writer: Arc<Mutex<PresenceWriter>>,
}

// Debug without the secret or the keys derived from it (a `CacheState` or
// `Shared` may be logged with `{:?}`).
impl std::fmt::Debug for Publisher {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Publisher")
            .field("namespaces", &self.keys.len())
            .finish_non_exhaustive()
    }
}

impl std::fmt::Debug for Presence {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Presence")
            .field("stats", &self.view.stats())
            .finish_non_exhaustive()
    }
}

impl PresenceSink for Publisher {
    fn changed(&mut self, key: &BlockKey, visible: bool, _in_dram: bool) {
        let secret = &self.secret;
        let k = self
            .keys
            .entry(key.ns)
            .or_insert_with(|| namespace_key(secret, key.ns.0));
        let fp = fingerprint(k, &key.hash);
        let mut w = self.writer.lock().unwrap_or_else(|p| p.into_inner());
        if visible {
            let was = w.is_saturated();
            if !w.insert(fp) && !was {
                log!(
                    Warn,
                    "presence table full ({} of {} slots): clients now ask the Manager for every \
                     lookup; raise --presence-slots",
                    w.entries(),
                    w.slots()
                );
            }
        } else {
            w.remove(fp);
        }
    }
}

#[derive(Debug, thiserror::Error)]
pub enum PresenceError {
    #[error("drawing the presence secret from /dev/urandom: {0}")]
    Secret(std::io::Error),
    #[error("duplicating the presence table's fd: {0}")]
    Dup(std::io::Error),
    #[error("creating the presence table: {0}")]
    Table(#[from] ShmError),
}

fn draw_secret() -> std::io::Result<[u8; 32]> {
    let mut s = [0u8; 32];
    std::fs::File::open("/dev/urandom")?.read_exact(&mut s)?;
    Ok(s)
}

impl Presence {
    /// Create the table (`slots` > 0) and the sink that publishes into it, for
    /// [`crate::visibility::Visibility`] (installed into the cache, which first
    /// tells it every block already visible: SSD recovery).
    pub fn start(slots: u64) -> Result<(Presence, Box<dyn PresenceSink>), PresenceError> {
        let secret = draw_secret().map_err(PresenceError::Secret)?;
        let writer = PresenceWriter::create(slots)?;
        let fd = writer.fd().try_clone().map_err(PresenceError::Dup)?;
        let view = PresenceView::open(fd, slots)?;
        let writer = Arc::new(Mutex::new(writer));
        let sink = Box::new(Publisher {
            secret,
            keys: HashMap::new(),
            writer: writer.clone(),
        });
        Ok((Presence { secret, view, writer }, sink))
    }

    pub fn slots(&self) -> u64 {
        self.view.slots()
    }

    /// The table's fd (read-only for whoever receives it: it is sealed).
    pub fn fd(&self) -> &OwnedFd {
        self.view.fd()
    }

    /// The key a registrant of `ns` uses for its fingerprints.
    pub fn namespace_key(&self, ns: NsId) -> [u8; PRESENCE_KEY_BYTES] {
        namespace_key(&self.secret, ns.0)
    }

    pub fn stats(&self) -> PresenceStats {
        self.view.stats()
    }

    /// The Manager stops: mapped tables answer "closed" from now on.
    pub fn close(&self) {
        self.writer.lock().unwrap_or_else(|p| p.into_inner()).close();
    }
}
