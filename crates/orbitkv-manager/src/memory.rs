//! The memory a base-page arena can have, checked before the arena is created.
//!
//! At start-up the Manager writes every page of the arena (`Segment::create_arena`), so an
//! arena larger than the machine, or than the memory cgroup the Manager runs in, is never
//! a cache that fills slowly. It is an OOM kill during start-up, and the kernel may choose
//! an engine process on the same host as its victim. Such an arena is refused with both
//! numbers. An arena that fits the machine but not what is available at this moment (page
//! cache, other processes, or the old arena of a Manager being replaced that clients still
//! map) is logged as a warning and started: the kernel can reclaim the difference, and a
//! restart must not fail because the previous arena is still mapped for a few seconds.
//!
//! Huge-page arenas come from the reserved pool and have their own check (free pages).

use std::path::{Path, PathBuf};

use crate::config::ConfigError;

/// What bounds the arena: the machine and, where the Manager is in a memory cgroup with
/// a limit, that limit.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MemoryRoom {
    /// `MemTotal` of /proc/meminfo, in bytes.
    pub total: Option<u64>,
    /// `MemAvailable` of /proc/meminfo, in bytes.
    pub available: Option<u64>,
    /// The memory cgroup's limit in bytes and the file it was read from (v2 `memory.max`,
    /// v1 `memory.limit_in_bytes`); `None` without a limit.
    pub cgroup_limit: Option<(u64, PathBuf)>,
}

impl MemoryRoom {
    /// This process's room, from /proc and /sys (fields it cannot read are `None`).
    pub fn read() -> MemoryRoom {
        let (total, available) = std::fs::read_to_string("/proc/meminfo")
            .map(|t| parse_meminfo(&t))
            .unwrap_or((None, None));
        let cgroup_limit = std::fs::read_to_string("/proc/self/cgroup")
            .ok()
            .and_then(|t| cgroup_limit(&t, Path::new("/sys/fs/cgroup")));
        MemoryRoom {
            total,
            available,
            cgroup_limit,
        }
    }

    /// Refuse an arena of `size` bytes that cannot fit; `Ok(Some(warning))` for one that
    /// fits the machine but not what is available now.
    pub fn check(&self, size: u64) -> Result<Option<String>, ConfigError> {
        if let Some(total) = self.total
            && size > total
        {
            return Err(ConfigError::Invalid(format!(
                "--dram-size {size} bytes ({}) is more than this machine's memory (MemTotal {total} \
                 bytes, {}): the arena is written in full at start-up; lower --dram-size",
                gib(size),
                gib(total)
            )));
        }
        if let Some((limit, file)) = &self.cgroup_limit
            && size > *limit
        {
            return Err(ConfigError::Invalid(format!(
                "--dram-size {size} bytes ({}) is more than the memory limit of this process's \
                 cgroup ({limit} bytes, {}, {}): the arena is written in full at start-up and \
                 counts against that limit; lower --dram-size or raise the limit",
                gib(size),
                gib(*limit),
                file.display()
            )));
        }
        Ok(match self.available {
            Some(avail) if size > avail => Some(format!(
                "arena: {size} bytes ({}) is more than the memory available now (MemAvailable {avail} \
                 bytes, {}); writing it makes the kernel reclaim page cache or swap, and can wake the \
                 OOM killer. Expected while a previous Manager's clients still map its arena (a restart); \
                 otherwise lower --dram-size",
                gib(size),
                gib(avail)
            )),
            _ => None,
        })
    }
}

fn gib(bytes: u64) -> String {
    format!("{:.1} GiB", bytes as f64 / (1u64 << 30) as f64)
}

/// (`MemTotal`, `MemAvailable`) in bytes from the text of /proc/meminfo.
fn parse_meminfo(text: &str) -> (Option<u64>, Option<u64>) {
    let field = |name: &str| {
        text.lines().find_map(|l| {
            let rest = l.strip_prefix(name)?.strip_prefix(':')?.trim();
            let kib: u64 = rest.strip_suffix("kB").unwrap_or(rest).trim().parse().ok()?;
            kib.checked_mul(1024)
        })
    };
    (field("MemTotal"), field("MemAvailable"))
}

/// The memory limit of the cgroup named in `proc_self_cgroup` (the text of
/// /proc/self/cgroup), read under `root` (/sys/fs/cgroup): cgroup v2's `memory.max`, or
/// v1's `memory.limit_in_bytes` (whose "no limit" is a value near `i64::MAX`).
fn cgroup_limit(proc_self_cgroup: &str, root: &Path) -> Option<(u64, PathBuf)> {
    for line in proc_self_cgroup.lines() {
        let mut parts = line.splitn(3, ':');
        let (Some(_id), Some(controllers), Some(path)) = (parts.next(), parts.next(), parts.next()) else {
            continue;
        };
        let rel = path.trim_start_matches('/');
        let file = if controllers.is_empty() {
            root.join(rel).join("memory.max")
        } else if controllers.split(',').any(|c| c == "memory") {
            root.join("memory").join(rel).join("memory.limit_in_bytes")
        } else {
            continue;
        };
        let Ok(text) = std::fs::read_to_string(&file) else {
            continue;
        };
        let text = text.trim();
        if text == "max" {
            return None;
        }
        return match text.parse::<u64>() {
            Ok(v) if v < (1u64 << 60) => Some((v, file)),
            _ => None, // v1's "unlimited" (a page-rounded i64::MAX), or unreadable
        };
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    const GIB: u64 = 1 << 30;

    fn room_of(total: Option<u64>, available: Option<u64>, cgroup: Option<(u64, &str)>) -> MemoryRoom {
        MemoryRoom {
            total,
            available,
            cgroup_limit: cgroup.map(|(limit, file)| (limit, PathBuf::from(file))),
        }
    }

    /// The refusal of an arena of `size` bytes, checked to name every one of `parts`.
    fn refusal_naming(room: &MemoryRoom, size: u64, parts: &[&str]) {
        let e = room.check(size).expect_err("refused").to_string();
        assert!(parts.iter().all(|p| e.contains(p)), "{e}");
    }

    #[test]
    fn meminfo_fields_parse_in_bytes() {
        let t = "MemTotal:       24576000 kB\nMemFree:   100 kB\nMemAvailable:   20000000 kB\n";
        assert_eq!(
            parse_meminfo(t),
            (Some(24_576_000 * 1024), Some(20_000_000 * 1024))
        );
        assert_eq!(parse_meminfo("MemTotalX: 5 kB\nnonsense"), (None, None));
    }

    #[test]
    fn an_arena_larger_than_the_machine_is_refused_naming_the_flag_and_both_sizes() {
        let room = room_of(Some(24 * GIB), Some(20 * GIB), None);
        refusal_naming(
            &room,
            64 * GIB,
            &[
                "--dram-size",
                "64.0 GiB",
                "MemTotal",
                "24.0 GiB",
                "lower --dram-size",
            ],
        );
        assert_eq!(room.check(16 * GIB).expect("fits"), None);
        let warn = room
            .check(22 * GIB)
            .expect("fits the machine")
            .expect("a warning");
        assert!(
            warn.contains("MemAvailable") && warn.contains("22.0 GiB"),
            "{warn}"
        );
    }

    #[test]
    fn the_cgroup_limit_bounds_the_arena_and_names_its_file() {
        let room = room_of(
            Some(256 * GIB),
            None,
            Some((8 * GIB, "/sys/fs/cgroup/x/memory.max")),
        );
        refusal_naming(
            &room,
            10 * GIB,
            &[
                "cgroup",
                "/sys/fs/cgroup/x/memory.max",
                "8.0 GiB",
                "raise the limit",
            ],
        );
        assert_eq!(room.check(4 * GIB).expect("fits"), None);
        // Nothing known: nothing refused.
        let none = room_of(None, None, None);
        assert_eq!(none.check(u64::MAX).expect("unknown"), None);
    }

    #[test]
    fn cgroup_v2_and_v1_limits_are_read_and_no_limit_is_none() {
        let dir = std::env::temp_dir().join(format!("okv-memory-{}", std::process::id()));
        let v2 = dir.join("pod/a");
        let v1 = dir.join("memory/pod/b");
        std::fs::create_dir_all(&v2).expect("dir");
        std::fs::create_dir_all(&v1).expect("dir");
        std::fs::write(v2.join("memory.max"), "8589934592\n").expect("write");
        std::fs::write(v1.join("memory.limit_in_bytes"), "4294967296\n").expect("write");
        assert_eq!(
            cgroup_limit("0::/pod/a\n", &dir),
            Some((8 * GIB, v2.join("memory.max")))
        );
        assert_eq!(
            cgroup_limit("5:cpu,cpuacct:/x\n4:memory:/pod/b\n", &dir),
            Some((4 * GIB, v1.join("memory.limit_in_bytes")))
        );
        std::fs::write(v2.join("memory.max"), "max\n").expect("write");
        assert_eq!(cgroup_limit("0::/pod/a\n", &dir), None);
        std::fs::write(v1.join("memory.limit_in_bytes"), "9223372036854771712\n").expect("write");
        assert_eq!(cgroup_limit("4:memory:/pod/b\n", &dir), None);
        assert_eq!(cgroup_limit("0::/missing\n", &dir), None);
        let _ = std::fs::remove_dir_all(&dir);
    }
}
