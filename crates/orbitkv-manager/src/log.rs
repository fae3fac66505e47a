//! Minimal structured log lines on stderr: `ts level target: message`.

use std::sync::atomic::{AtomicU8, Ordering};

#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum Level {
    Error = 0,
    Warn = 1,
    Info = 2,
    Debug = 3,
}

impl Level {
    pub fn parse(s: &str) -> Option<Level> {
        Some(match s.to_ascii_lowercase().as_str() {
            "error" => Level::Error,
            "warn" | "warning" => Level::Warn,
            "info" => Level::Info,
            "debug" | "trace" => Level::Debug,
            _ => return None,
        })
    }
}

static LEVEL: AtomicU8 = AtomicU8::new(Level::Info as u8);

pub fn set_level(l: Level) {
    LEVEL.store(l as u8, Ordering::Relaxed);
}

pub fn enabled(l: Level) -> bool {
    l as u8 <= LEVEL.load(Ordering::Relaxed)
}

pub fn emit(l: Level, msg: std::fmt::Arguments<'_>) {
    if !enabled(l) {
        return;
    }
    let ts = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_secs_f64())
        .unwrap_or(0.0);
    let name = match l {
        Level::Error => "ERROR",
        Level::Warn => "WARN",
        Level::Info => "INFO",
        Level::Debug => "DEBUG",
    };
    eprintln!("{ts:.3} {name} orbitkv-manager: {msg}");
}

/// The running count of one kind of repeatable warning that no server counter
/// counts (e.g. per-block SSD failures), for [`warn_sampled`].
#[derive(Default)]
pub struct Occurrences(std::sync::atomic::AtomicU64);

impl Occurrences {
    pub const fn new() -> Self {
        Occurrences(std::sync::atomic::AtomicU64::new(0))
    }

    /// Count one occurrence; returns its 1-based number.
    pub fn inc(&self) -> u64 {
        self.0.fetch_add(1, std::sync::atomic::Ordering::Relaxed) + 1
    }
}

/// Whether the `count`th occurrence of a repeatable warning is logged.
fn sampled(count: u64) -> bool {
    count.is_power_of_two()
}

/// A warning that a peer can make repeat without bound (refusals, timeouts):
/// logged only at its 1st, 2nd, 4th, 8th, … occurrence, with the count, so a
/// flood cannot flood the log. `count` is this occurrence's 1-based number,
/// e.g. the value returned by `ServerCounters::inc`.
pub fn warn_sampled(count: u64, msg: std::fmt::Arguments<'_>) {
    if sampled(count) {
        emit(
            Level::Warn,
            format_args!("{msg} [{count} so far; repeats logged at powers of two]"),
        );
    }
}

#[macro_export]
macro_rules! log {
    ($lvl:ident, $($arg:tt)*) => {
        $crate::log::emit($crate::log::Level::$lvl, format_args!($($arg)*))
    };
}

/// `warn_sampled!(count, "fmt", args…)`: see [`warn_sampled`].
#[macro_export]
macro_rules! warn_sampled {
    ($count:expr, $($arg:tt)*) => {
        $crate::log::warn_sampled($count, format_args!($($arg)*))
    };
}

#[cfg(test)]
mod tests {
    #[test]
    fn repeated_warnings_are_logged_at_powers_of_two() {
        let logged: Vec<u64> = (0..=100).filter(|n| super::sampled(*n)).collect();
        assert_eq!(logged, vec![1, 2, 4, 8, 16, 32, 64]);
        let o = super::Occurrences::new();
        let counts: Vec<u64> = (0..3).map(|_| o.inc()).collect();
        assert_eq!(counts, [1, 2, 3]);
    }
}
