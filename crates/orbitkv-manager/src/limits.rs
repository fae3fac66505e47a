//! Process limits the arena and the connections need, checked (and the fd
//! limit raised) before anything is created, so that a limit is a start-up
//! error naming the flag and the fix, never a failed handshake later.
//!
//! - `RLIMIT_NOFILE`: the Manager keeps one fd per arena segment for as long as
//!   it runs (they are passed to every client that maps the arena), and each
//!   session holds its socket and a pidfd of its process. The soft limit is
//!   raised to the hard limit; what remains must cover segments, sessions and
//!   a reserve for the SSD tier, peers, metrics and the listener.
//! - `vm.max_map_count`: one mapping per segment in the Manager and in every
//!   client that maps the arena (each client needs only [`orbitkv_proto::FD_BATCH`]
//!   free fds: it closes each batch once mapped).

use crate::config::ConfigError;

/// Fds each session may hold: its socket and a pidfd of its process.
pub const FDS_PER_SESSION: u64 = 2;
/// Fds kept free beyond segments and sessions (listener, metrics, SSD files and
/// ring, peer connections, presence table, logs).
pub const FD_RESERVE: u64 = 256;
/// Mappings kept free in each process beyond the arena's (libraries, heaps,
/// thread stacks; an engine process with torch uses a few thousand).
pub const MAP_RESERVE: u64 = 8192;

/// What the checks found, for the start-up log.
#[derive(Debug, Clone, Copy)]
pub struct Limits {
    pub nofile: u64,
    pub max_map_count: Option<u64>,
}

/// Raise `RLIMIT_NOFILE` to its hard limit and check that `segments` arena
/// fds plus `max_connections` sessions fit, and that every process can map
/// the arena. Errors name the flags and the system setting to change.
pub fn check(segments: u64, max_connections: u64) -> Result<Limits, ConfigError> {
    let nofile = raise_nofile();
    let need = segments + FDS_PER_SESSION * max_connections + FD_RESERVE;
    if need > nofile {
        return Err(ConfigError::Invalid(format!(
            "the open-file limit (RLIMIT_NOFILE, hard limit {nofile}) is below what this \
             configuration needs: {segments} arena segment fds + {FDS_PER_SESSION} per connection x \
             --max-connections {max_connections} + {FD_RESERVE} reserved = {need}. Use fewer segments \
             (leave --segment-size unset, or larger), a smaller --max-connections, or raise the limit \
             (`ulimit -Hn`, systemd LimitNOFILE=)"
        )));
    }
    let max_map_count = read_max_map_count();
    if let Some(max) = max_map_count
        && segments + MAP_RESERVE > max
    {
        return Err(ConfigError::Invalid(format!(
            "vm.max_map_count is {max}: every process that maps the arena needs one mapping per \
             segment ({segments}) plus about {MAP_RESERVE} of its own. Use fewer segments (leave \
             --segment-size unset, or larger), or raise it (`sysctl vm.max_map_count=N`)"
        )));
    }
    Ok(Limits {
        nofile,
        max_map_count,
    })
}

/// Raise the soft fd limit to the hard one; returns the soft limit in force.
fn raise_nofile() -> u64 {
    use rustix::process::{Resource, getrlimit, setrlimit};
    let mut lim = getrlimit(Resource::Nofile);
    if lim.current != lim.maximum {
        lim.current = lim.maximum;
        // Failure leaves the old soft limit, which is what is reported.
        let _ = setrlimit(Resource::Nofile, lim);
    }
    getrlimit(Resource::Nofile).current.unwrap_or(u64::MAX)
}

fn read_max_map_count() -> Option<u64> {
    std::fs::read_to_string("/proc/sys/vm/max_map_count")
        .ok()?
        .trim()
        .parse()
        .ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn too_many_connections_for_the_fd_limit_is_refused_naming_the_flags() {
        let Err(ConfigError::Invalid(msg)) = check(64, u64::MAX / 4) else {
            panic!("expected a refusal")
        };
        assert!(
            msg.contains("--max-connections") && msg.contains("RLIMIT_NOFILE"),
            "{msg}"
        );
    }

    #[test]
    fn a_default_arena_fits() {
        let l = check(64, 1024).expect("fits");
        assert!(l.nofile >= 64 + 2 * 1024 + FD_RESERVE);
    }
}
