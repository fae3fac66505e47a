//! Log lines on stderr, one per event, in one of two formats (`--log-format`):
//!
//! - `text` (default): `2026-12-02T18:50:12.345Z WARN orbitkv-manager: message`
//! - `json`: `{"ts":"2026-12-02T18:50:12.345Z","level":"warn","target":"orbitkv-manager","msg":"message"}`
//!
//! Timestamps are RFC 3339 in UTC with milliseconds, so log collectors parse them
//! without a format hint and lines from several hosts sort as text.

use std::fmt::Write as _;
use std::sync::atomic::{AtomicBool, AtomicU8, Ordering};
use std::time::{SystemTime, UNIX_EPOCH};

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

/// How each line is written.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Format {
    #[default]
    Text,
    Json,
}

impl Format {
    pub fn parse(s: &str) -> Option<Format> {
        match s.to_ascii_lowercase().as_str() {
            "text" => Some(Format::Text),
            "json" => Some(Format::Json),
            _ => None,
        }
    }
}

static LEVEL: AtomicU8 = AtomicU8::new(Level::Info as u8);
static JSON: AtomicBool = AtomicBool::new(false);

pub fn set_level(l: Level) {
    LEVEL.store(l as u8, Ordering::Relaxed);
}

pub fn set_format(f: Format) {
    JSON.store(f == Format::Json, Ordering::Relaxed);
}

pub fn enabled(l: Level) -> bool {
    l as u8 <= LEVEL.load(Ordering::Relaxed)
}

const TARGET: &str = "orbitkv-manager";

pub fn emit(l: Level, msg: std::fmt::Arguments<'_>) {
    if !enabled(l) {
        return;
    }
    let millis = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_millis() as u64)
        .unwrap_or(0);
    let line = render(l, millis, msg, JSON.load(Ordering::Relaxed));
    eprintln!("{line}");
}

/// One log line (without its newline).
fn render(l: Level, unix_millis: u64, msg: std::fmt::Arguments<'_>, json: bool) -> String {
    let ts = rfc3339_millis(unix_millis);
    if !json {
        let name = match l {
            Level::Error => "ERROR",
            Level::Warn => "WARN",
            Level::Info => "INFO",
            Level::Debug => "DEBUG",
        };
        return format!("{ts} {name} {TARGET}: {msg}");
    }
    let name = match l {
        Level::Error => "error",
        Level::Warn => "warn",
        Level::Info => "info",
        Level::Debug => "debug",
    };
    let mut out = format!(r#"{{"ts":"{ts}","level":"{name}","target":"{TARGET}","msg":""#);
    json_escape_into(&mut out, &msg.to_string());
    out.push_str("\"}");
    out
}

/// `s` as the inside of a JSON string: quotes, backslashes and control characters
/// escaped (RFC 8259), everything else as is (the line stays UTF-8).
fn json_escape_into(out: &mut String, s: &str) {
    for c in s.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            '\n' => out.push_str("\\n"),
            '\r' => out.push_str("\\r"),
            '\t' => out.push_str("\\t"),
            c if (c as u32) < 0x20 => {
                let _ = write!(out, "\\u{:04x}", c as u32);
            }
            c => out.push(c),
        }
    }
}

/// Milliseconds since the Unix epoch as RFC 3339 UTC, e.g. `2026-12-02T18:50:12.345Z`.
pub(crate) fn rfc3339_millis(unix_millis: u64) -> String {
    let secs = unix_millis / 1000;
    let (days, rem) = (secs / 86_400, secs % 86_400);
    let (y, m, d) = civil_from_days(days);
    format!(
        "{y:04}-{m:02}-{d:02}T{:02}:{:02}:{:02}.{:03}Z",
        rem / 3600,
        rem / 60 % 60,
        rem % 60,
        unix_millis % 1000
    )
}

/// The proleptic Gregorian date of `days` since 1970-01-01 (H. Hinnant's
/// `civil_from_days`, for days ≥ 0).
fn civil_from_days(days: u64) -> (u64, u64, u64) {
    let z = days + 719_468;
    let era = z / 146_097;
    let doe = z % 146_097;
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = doy - (153 * mp + 2) / 5 + 1;
    let m = if mp < 10 { mp + 3 } else { mp - 9 };
    let y = yoe + era * 400 + u64::from(m <= 2);
    (y, m, d)
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
    use super::{Format, Level, render, rfc3339_millis};

    #[test]
    fn timestamps_are_rfc3339_utc_with_millis() {
        assert_eq!(rfc3339_millis(0), "1970-01-01T00:00:00.000Z");
        // 2000-02-29 (a leap day of a century leap year), 23:59:59.999
        assert_eq!(rfc3339_millis(951_868_799_999), "2000-02-29T23:59:59.999Z");
        assert_eq!(rfc3339_millis(1_796_236_212_345), "2026-12-02T18:30:12.345Z");
        // 2100 is not a leap year: Feb 28 is followed by Mar 1.
        assert_eq!(rfc3339_millis(4_107_456_000_000), "2100-02-28T00:00:00.000Z");
        assert_eq!(rfc3339_millis(4_107_542_400_000), "2100-03-01T00:00:00.000Z");
    }

    #[test]
    fn text_and_json_lines() {
        let text = render(
            Level::Warn,
            1_796_236_212_345,
            format_args!("peer {} refused", 7),
            false,
        );
        assert_eq!(
            text,
            "2026-12-02T18:30:12.345Z WARN orbitkv-manager: peer 7 refused"
        );
        let json = render(
            Level::Info,
            0,
            format_args!("a \"quoted\" \\ path\nnext\u{1} é"),
            true,
        );
        assert_eq!(
            json,
            r#"{"ts":"1970-01-01T00:00:00.000Z","level":"info","target":"orbitkv-manager","msg":"a \"quoted\" \\ path\nnext\u0001 é"}"#
        );
        // What a log collector reads back is the message as written.
        let v: serde_json::Value = serde_json::from_str(&json).expect("one JSON object");
        assert_eq!(v["msg"], "a \"quoted\" \\ path\nnext\u{1} é");
        assert_eq!(v["level"], "info");
        assert_eq!(Format::parse("JSON"), Some(Format::Json));
        assert_eq!(Format::parse("text"), Some(Format::Text));
        assert_eq!(Format::parse("logfmt"), None);
    }

    #[test]
    fn repeated_warnings_are_logged_at_powers_of_two() {
        let logged: Vec<u64> = (0..=100).filter(|n| super::sampled(*n)).collect();
        assert_eq!(logged, vec![1, 2, 4, 8, 16, 32, 64]);
        let o = super::Occurrences::new();
        let counts: Vec<u64> = (0..3).map(|_| o.inc()).collect();
        assert_eq!(counts, [1, 2, 3]);
    }
}
