//! Sizes: parsing `1GiB`-style values, and the arena's layout (its size, the
//! page size backing it, and the segments it is split into).

use super::{ConfigError, ManagerConfig};

pub const DEFAULT_DRAM: &str = "1GiB";
/// The smallest segment `auto` chooses.
pub const AUTO_SEGMENT_MIN: u64 = 256 << 20;
/// `auto` grows segments past [`AUTO_SEGMENT_MIN`] to keep at most this many.
pub const AUTO_SEGMENTS: u64 = 64;

/// The segment size `--segment-size auto` picks for an arena of `dram_size`
/// on `page`-sized pages: [`AUTO_SEGMENT_MIN`] up to 16 GiB arenas, beyond
/// that `dram_size / AUTO_SEGMENTS` rounded up to a whole 256 MiB and a whole
/// page. Few segments mean few fds in the Manager, few mappings and pin calls
/// per client, and a handshake of one or two fd batches (docs/operations.md).
pub fn auto_segment_size(dram_size: u64, page: u64) -> u64 {
    let unit = AUTO_SEGMENT_MIN.max(page).next_multiple_of(page);
    dram_size.div_ceil(AUTO_SEGMENTS).max(1).next_multiple_of(unit)
}
pub const DEFAULT_MAX_BUFFERED: &str = "64MiB";

pub fn parse_size(s: &str) -> Result<u64, ConfigError> {
    let t = s.trim();
    let split = t.find(|c: char| !c.is_ascii_digit()).unwrap_or(t.len());
    let (num, unit) = t.split_at(split);
    let n: u64 = num.parse().map_err(|_| ConfigError::Size(s.into()))?;
    let mult: u64 = match unit.trim().to_ascii_lowercase().as_str() {
        "" | "b" => 1,
        "k" | "kib" | "kb" => 1 << 10,
        "m" | "mib" | "mb" => 1 << 20,
        "g" | "gib" | "gb" => 1 << 30,
        "t" | "tib" | "tb" => 1 << 40,
        _ => return Err(ConfigError::Size(s.into())),
    };
    n.checked_mul(mult).ok_or_else(|| ConfigError::Size(s.into()))
}

/// The arena's size, the page size backing it and its segment size, from
/// their settings (flag or file; unset: the defaults), each checked.
pub(super) fn arena_layout(
    dram_size: Option<String>,
    segment_flag: Option<String>,
    hugepages: Option<String>,
) -> Result<(u64, orbitkv_shm::PageSize, u64), ConfigError> {
    let dram_size = parse_size(dram_size.as_deref().unwrap_or(DEFAULT_DRAM))?;
    if dram_size < orbitkv_core::ALIGN {
        return Err(ConfigError::Invalid(format!(
            "dram_size {dram_size} is below one 4 KiB page"
        )));
    }
    let page_size = match hugepages.as_deref().map(str::to_ascii_lowercase).as_deref() {
        None | Some("off") => orbitkv_shm::PageSize::Base,
        Some("2mib" | "2m" | "2mb") => orbitkv_shm::PageSize::Huge2MiB,
        Some("1gib" | "1g" | "1gb") => orbitkv_shm::PageSize::Huge1GiB,
        Some(h) => {
            return Err(ConfigError::Invalid(format!(
                "hugepages {h:?} must be off, 2MiB or 1GiB"
            )));
        }
    };
    let page = page_size.bytes();
    let segment_size = match segment_flag.as_deref() {
        None => auto_segment_size(dram_size, page),
        Some(v) if v.eq_ignore_ascii_case("auto") => auto_segment_size(dram_size, page),
        Some(v) => parse_size(v)?,
    };
    if segment_size < orbitkv_core::ALIGN || segment_size % orbitkv_core::ALIGN != 0 {
        return Err(ConfigError::Invalid(format!(
            "segment_size {segment_size} must be a positive multiple of 4096"
        )));
    }
    let segments = dram_size.div_ceil(segment_size);
    if segments > orbitkv_proto::MAX_SEGMENTS as u64 {
        let least = dram_size
            .div_ceil(orbitkv_proto::MAX_SEGMENTS as u64)
            .next_multiple_of(page);
        return Err(ConfigError::Invalid(format!(
            "dram_size {dram_size} in segments of {segment_size} bytes makes {segments} segments, \
             above the limit of {} (each segment is one fd in the Manager and one mapping in every \
             client); use --segment-size {least} or larger, or leave it unset (auto)",
            orbitkv_proto::MAX_SEGMENTS
        )));
    }
    if !dram_size.is_multiple_of(page) || !segment_size.is_multiple_of(page) {
        return Err(ConfigError::Invalid(format!(
            "with {page_size} pages, dram_size ({dram_size}) and segment_size ({segment_size}) \
             must be whole multiples of {page} bytes"
        )));
    }
    Ok((dram_size, page_size, segment_size))
}

impl ManagerConfig {
    /// Segment sizes: `dram_size` split into `segment_size` pieces, the last
    /// one possibly smaller (rounded down to the 4 KiB granularity).
    pub fn segment_sizes(&self) -> Vec<u64> {
        let mut left = self.dram_size / orbitkv_core::ALIGN * orbitkv_core::ALIGN;
        let mut out = Vec::new();
        while left > 0 {
            let s = left.min(self.segment_size);
            out.push(s);
            left -= s;
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn auto_segments_stay_few_and_whole_pages_at_any_arena_size() {
        const G: u64 = 1 << 30;
        assert_eq!(auto_segment_size(1 << 30, 4096), 256 << 20);
        assert_eq!(
            auto_segment_size(16 * G, 4096),
            256 << 20,
            "64 segments of 256 MiB"
        );
        assert_eq!(auto_segment_size(96 * G, 4096), 1536 << 20);
        assert_eq!(auto_segment_size(1 << 40, 4096), 16 * G);
        assert_eq!(auto_segment_size(8 * G, G), G, "1 GiB pages: whole pages");
        for (dram, page) in [
            (3 * G, 4096),
            (100 * G + (8 << 20), 2 << 20),
            (2048 * G, G),
            (5 << 20, 4096),
        ] {
            let seg = auto_segment_size(dram, page);
            assert!(
                seg.is_multiple_of(page) && seg >= 256 << 20,
                "{dram} {page}: {seg}"
            );
            assert!(
                dram.div_ceil(seg) <= AUTO_SEGMENTS,
                "{dram}: {} segments",
                dram.div_ceil(seg)
            );
        }
        let c = ManagerConfig::from_argv(["x", "--dram-size", "96GiB"]).expect("96 GiB");
        assert_eq!(c.segment_sizes(), vec![1536 << 20; 64]);
        let c =
            ManagerConfig::from_argv(["x", "--dram-size", "4GiB", "--segment-size", "auto"]).expect("auto");
        assert_eq!(c.segment_sizes(), vec![256 << 20; 16]);
        let c = ManagerConfig::from_argv(["x", "--dram-size", "4GiB", "--hugepages", "1GiB"])
            .expect("1 GiB pages");
        assert_eq!(c.segment_sizes(), vec![G; 4]);
    }

    #[test]
    fn more_segments_than_the_limit_are_refused_naming_the_fix() {
        let ok =
            ManagerConfig::from_argv(["x", "--dram-size", "64MiB", "--segment-size", "4KiB"]).expect("16384");
        assert_eq!(ok.segment_sizes().len(), orbitkv_proto::MAX_SEGMENTS);
        let e = ManagerConfig::from_argv(["x", "--dram-size", "1GiB", "--segment-size", "4KiB"])
            .expect_err("262144 segments");
        let msg = e.to_string();
        assert!(
            msg.contains("262144 segments") && msg.contains("--segment-size 65536"),
            "{msg}"
        );
    }

    #[test]
    fn sizes_parse() {
        assert_eq!(parse_size("1GiB").ok(), Some(1 << 30));
        assert_eq!(parse_size("64M").ok(), Some(64 << 20));
        assert_eq!(parse_size("4096").ok(), Some(4096));
        assert!(parse_size("12 parsecs").is_err());
        assert!(parse_size("99999999999999T").is_err());
    }

    #[test]
    fn hugepages_parse_and_sizes_must_be_whole_pages() {
        let c = ManagerConfig::from_argv(["m", "--hugepages", "2MiB", "--dram-size", "64MiB"]).expect("ok");
        assert_eq!(c.page_size, orbitkv_shm::PageSize::Huge2MiB);
        let c = ManagerConfig::from_argv(["m", "--dram-size", "64MiB"]).expect("ok");
        assert_eq!(c.page_size, orbitkv_shm::PageSize::Base);
        for argv in [
            vec!["m", "--hugepages", "2MiB", "--dram-size", "5MiB"],
            vec!["m", "--hugepages", "2MiB", "--segment-size", "3MiB"],
            vec![
                "m",
                "--hugepages",
                "1GiB",
                "--dram-size",
                "1GiB",
                "--segment-size",
                "256MiB",
            ],
            vec!["m", "--hugepages", "64KiB"],
        ] {
            let e = ManagerConfig::from_argv(argv.clone()).expect_err("refused");
            assert!(
                e.to_string().contains("hugepages") || e.to_string().contains("multiples"),
                "{argv:?}: {e}"
            );
        }
    }
}
