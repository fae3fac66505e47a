//! SSD-tier settings: the directory (`--ssd-dir`, or the default one with
//! `--ssd`), capacity, I/O mode and engine, admission and write policy.

use std::path::PathBuf;

use super::{ConfigError, check, parse_size};

/// Validated SSD-tier settings.
#[derive(Debug, Clone)]
pub struct SsdSettings {
    pub dir: PathBuf,
    pub capacity: u64,
    pub mode: orbitkv_ssd::IoMode,
    pub engine: orbitkv_ssd::EnginePref,
    pub admit_hits: u32,
    pub write_policy: orbitkv_core::SpillPolicy,
}

pub(super) fn default_ssd_dir() -> PathBuf {
    let base = std::env::var_os("XDG_CACHE_HOME")
        .filter(|v| !v.is_empty())
        .map(PathBuf::from)
        .or_else(|| std::env::var_os("HOME").map(|h| PathBuf::from(h).join(".cache")))
        .unwrap_or_else(|| PathBuf::from("/var/tmp"));
    base.join("orbitkv").join("ssd")
}

/// Validated SSD-tier settings for `dir`, from the other `ssd_*` settings
/// (flag or file; unset: the defaults).
pub(super) fn settings(
    dir: PathBuf,
    capacity: Option<String>,
    mode: Option<String>,
    engine: Option<String>,
    admit_hits: Option<u32>,
    write_policy: Option<String>,
) -> Result<SsdSettings, ConfigError> {
    let capacity = parse_size(capacity.as_deref().unwrap_or("16GiB"))?;
    use orbitkv_ssd::{EnginePref, IoMode};
    let mode = check::choose(
        "ssd_mode",
        mode.as_deref().unwrap_or("direct"),
        &[("direct", IoMode::Direct), ("kernel", IoMode::Kernel)],
    )?;
    let engine = check::choose(
        "ssd_engine",
        engine.as_deref().unwrap_or("auto"),
        &[
            ("auto", EnginePref::Auto),
            ("uring", EnginePref::Uring),
            ("io_uring", EnginePref::Uring),
            ("psync", EnginePref::Psync),
        ],
    )?;
    let admit_hits = admit_hits.unwrap_or(0);
    let write_policy = check::choose(
        "ssd_write_policy",
        write_policy.as_deref().unwrap_or("evict"),
        &[
            ("evict", orbitkv_core::SpillPolicy::Evict),
            ("eager", orbitkv_core::SpillPolicy::Eager),
        ],
    )?;
    Ok(SsdSettings {
        dir,
        capacity,
        mode,
        engine,
        admit_hits,
        write_policy,
    })
}
