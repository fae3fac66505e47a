//! Retention hints: tell the Manager that a chain of blocks will return by a
//! deadline (keep), will not return (done), or forget earlier hints (clear).

use orbitkv_proto::{Request, Response, RetainHold};

use crate::{Client, ClientError, Hash, Namespace, check_count};

/// What one hint did (blocks not committed yet take it when they commit).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Retained {
    pub applied: u32,
    pub pending: u32,
    pub refused: u32,
}

impl Client {
    /// Send a retention hint on `hashes` (a chain, prefix first) of `ns`.
    pub fn retain(&self, ns: &Namespace, hold: RetainHold, hashes: &[Hash]) -> Result<Retained, ClientError> {
        check_count(hashes.len())?;
        let reply = self.call(&Request::Retain {
            ns: ns.id,
            hold,
            hashes: hashes.to_vec(),
        })?;
        match reply {
            Response::Retained {
                applied,
                pending,
                refused,
            } => {
                let total = u64::from(applied) + u64::from(pending) + u64::from(refused);
                if total > hashes.len() as u64 {
                    return Err(ClientError::Protocol(format!(
                        "retain reply counts {total} blocks of a {}-block hint",
                        hashes.len()
                    )));
                }
                Ok(Retained {
                    applied,
                    pending,
                    refused,
                })
            }
            r => Err(Client::unexpected(r)),
        }
    }
}
