//! The checks every settings section makes: a value inside its range, a choice among
//! named values, settings that need another one, a certificate with its key, and a
//! literal loopback address.

use std::fmt::Display;
use std::net::SocketAddr;
use std::ops::RangeInclusive;
use std::path::PathBuf;

use super::ConfigError;

/// `v` when `range` holds it; else an error naming the setting, the value, the range and
/// its unit ("" for none).
pub(super) fn bounded<T: PartialOrd + Display>(
    name: &str,
    v: T,
    range: RangeInclusive<T>,
    unit: &str,
) -> Result<T, ConfigError> {
    if range.contains(&v) {
        return Ok(v);
    }
    let unit = if unit.is_empty() {
        String::new()
    } else {
        format!(" {unit}")
    };
    Err(ConfigError::Invalid(format!(
        "{name} {v} must be {}..={}{unit}",
        range.start(),
        range.end()
    )))
}

/// The value named `given` among `choices`; else an error listing them.
pub(super) fn choose<T: Copy>(name: &str, given: &str, choices: &[(&str, T)]) -> Result<T, ConfigError> {
    if let Some((_, v)) = choices.iter().find(|(n, _)| *n == given) {
        return Ok(*v);
    }
    let names: Vec<&str> = choices.iter().map(|(n, _)| *n).collect();
    let list = match names.split_last() {
        Some((last, [])) => (*last).to_string(),
        Some((last, rest)) => format!("{} or {last}", rest.join(", ")),
        None => String::new(),
    };
    Err(ConfigError::Invalid(format!("{name} {given:?} must be {list}")))
}

/// Settings that only mean something beside `parent`: the first of `others` that is
/// set without it is an error (it would silently do nothing); `why` says what is off.
pub(super) fn refuse_orphans(others: &[(&str, bool)], parent: &str, why: &str) -> Result<(), ConfigError> {
    match others.iter().find(|(_, set)| *set) {
        Some((name, _)) => Err(ConfigError::Invalid(format!(
            "{name} is set but {parent} is not: {why}"
        ))),
        None => Ok(()),
    }
}

/// A client certificate chain and its key, both or neither (`both` says so to the user).
pub(super) fn cert_and_key(
    cert: Option<PathBuf>,
    key: Option<PathBuf>,
    both: &str,
) -> Result<Option<(PathBuf, PathBuf)>, ConfigError> {
    match (cert, key) {
        (Some(c), Some(k)) => Ok(Some((c, k))),
        (None, None) => Ok(None),
        _ => Err(ConfigError::Invalid(both.into())),
    }
}

/// `text` as a literal socket address on loopback; else the error `bad()` (not an
/// address and a port) or `open(addr)` (another address): what a setting reached
/// without authentication may name.
pub(super) fn loopback(
    text: &str,
    bad: impl FnOnce() -> String,
    open: impl FnOnce(SocketAddr) -> String,
) -> Result<SocketAddr, ConfigError> {
    let addr: SocketAddr = text.parse().map_err(|_| ConfigError::Invalid(bad()))?;
    if !addr.ip().is_loopback() {
        return Err(ConfigError::Invalid(open(addr)));
    }
    Ok(addr)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The message alone (`Display` prefixes "invalid setting: ").
    fn msg(e: ConfigError) -> String {
        match e {
            ConfigError::Invalid(m) => m,
            other => panic!("not an Invalid error: {other}"),
        }
    }

    #[test]
    fn each_check_names_the_setting_and_what_is_allowed() {
        assert_eq!(
            bounded("x_ms", 5u64, 1..=10, "milliseconds").expect("in range"),
            5
        );
        let e = bounded("x_ms", 11u64, 1..=10, "milliseconds").expect_err("above");
        assert_eq!(msg(e), "x_ms 11 must be 1..=10 milliseconds");
        let e = bounded("n", 0u32, 1..=64, "").expect_err("below");
        assert_eq!(msg(e), "n 0 must be 1..=64");
        let modes = [("direct", 1), ("kernel", 2)];
        assert_eq!(choose("ssd_mode", "kernel", &modes).expect("named"), 2);
        let e = choose("ssd_mode", "raw", &modes).expect_err("unknown");
        assert_eq!(msg(e), "ssd_mode \"raw\" must be direct or kernel");
        let e = choose("e", "x", &[("a", 0), ("b", 1), ("c", 2)]).expect_err("unknown");
        assert_eq!(msg(e), "e \"x\" must be a, b or c");
        refuse_orphans(&[("a", false), ("b", false)], "p", "why").expect("none set");
        let e = refuse_orphans(&[("a", false), ("b", true)], "p", "nothing to apply it to").expect_err("b");
        assert_eq!(msg(e), "b is set but p is not: nothing to apply it to");
        let p = || Some(PathBuf::from("/f"));
        assert!(cert_and_key(p(), p(), "both").expect("pair").is_some());
        assert!(cert_and_key(None, None, "both").expect("none").is_none());
        let e = cert_and_key(p(), None, "give both").expect_err("half");
        assert_eq!(msg(e), "give both");
    }
}
