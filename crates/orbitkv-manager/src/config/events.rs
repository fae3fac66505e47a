//! KV-event settings (`--kv-events*`): where the Manager publishes blocks stored and
//! removed, in vLLM's wire format, checked at start-up (loopback or a local socket only).

use super::args::Args;
use super::{ConfigError, check};

/// Default number of batches kept for replay.
pub const DEFAULT_BUFFER: usize = 10_000;

/// How block hashes (and media) are written, for the engine whose routers read them.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum HashForm {
    /// vLLM's default: the block hash as bytes.
    #[default]
    Bytes,
    /// vLLM with `VLLM_KV_EVENTS_USE_INT_BLOCK_HASHES=1`: the low 64 bits, big-endian,
    /// as an unsigned int.
    VllmInt,
    /// SGLang's: a page hash's first 64 bits, big-endian, as a signed int (its
    /// `hash_str_to_int64` of the hex page hash), media named as SGLang names them.
    Sglang,
}

impl HashForm {
    pub fn parse(s: &str) -> Option<HashForm> {
        match s {
            "bytes" => Some(HashForm::Bytes),
            "vllm-int" => Some(HashForm::VllmInt),
            "sglang" => Some(HashForm::Sglang),
            _ => None,
        }
    }

    pub fn name(self) -> &'static str {
        match self {
            HashForm::Bytes => "bytes",
            HashForm::VllmInt => "vllm-int",
            HashForm::Sglang => "sglang",
        }
    }
}

/// Validated KV-event settings.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct EventsSettings {
    /// ZeroMQ PUB endpoint (bound).
    pub endpoint: String,
    /// ZeroMQ ROUTER endpoint for replay requests (bound), if any.
    pub replay: Option<String>,
    /// Batches kept for replay.
    pub buffer: usize,
    /// How block hashes (and media) are written.
    pub form: HashForm,
}

/// The KV-event settings, or `None` without `--kv-events`. Another `kv_events_*` setting
/// without it is an error (it would silently do nothing).
pub(super) fn events_settings(a: &mut Args, file: &mut Args) -> Result<Option<EventsSettings>, ConfigError> {
    let endpoint = a.kv_events.take().or(file.kv_events.take());
    let replay = a.kv_events_replay.take().or(file.kv_events_replay.take());
    let buffer = a.kv_events_buffer.take().or(file.kv_events_buffer.take());
    let int_hashes = a.kv_events_int_hashes || file.kv_events_int_hashes;
    let form_name = a.kv_events_hash_form.take().or(file.kv_events_hash_form.take());
    let Some(endpoint) = endpoint.filter(|e| !e.eq_ignore_ascii_case("off")) else {
        let others = [
            ("kv_events_replay", replay.is_some()),
            ("kv_events_buffer", buffer.is_some()),
            ("kv_events_int_hashes", int_hashes),
            ("kv_events_hash_form", form_name.is_some()),
        ];
        check::refuse_orphans(&others, "kv_events", "no KV events are published")?;
        return Ok(None);
    };
    check_endpoint("kv_events", &endpoint)?;
    if let Some(r) = &replay {
        check_endpoint("kv_events_replay", r)?;
        if *r == endpoint {
            return Err(ConfigError::Invalid(format!(
                "kv_events_replay {r:?} is the kv_events endpoint; give the replay socket its own"
            )));
        }
    }
    let form = match form_name.as_deref() {
        None if int_hashes => HashForm::VllmInt,
        None => HashForm::Bytes,
        Some(f) => HashForm::parse(f).ok_or_else(|| {
            ConfigError::Invalid(format!(
                "kv_events_hash_form {f:?}: expected bytes, vllm-int or sglang"
            ))
        })?,
    };
    if int_hashes && form != HashForm::VllmInt {
        return Err(ConfigError::Invalid(format!(
            "kv_events_int_hashes is vllm-int but kv_events_hash_form is {}: give one",
            form.name()
        )));
    }
    let buffer = check::bounded(
        "kv_events_buffer",
        buffer.unwrap_or(DEFAULT_BUFFER),
        1..=1_000_000,
        "batches",
    )?;
    Ok(Some(EventsSettings {
        endpoint,
        replay,
        buffer,
        form,
    }))
}

/// `tcp://` with a literal loopback address and a port, or `ipc://` with an absolute path.
fn check_endpoint(name: &str, e: &str) -> Result<(), ConfigError> {
    if let Some(addr) = e.strip_prefix("tcp://") {
        check::loopback(
            addr,
            || {
                format!(
                    "{name} {e:?}: expected tcp://127.0.0.1:PORT or tcp://[::1]:PORT (a literal address and a port)"
                )
            },
            |_| {
                format!(
                    "{name} {e:?} is not loopback; the KV-event stream has no authentication, so only \
                     127.0.0.0/8, [::1] or an ipc:// socket is allowed"
                )
            },
        )?;
        return Ok(());
    }
    if let Some(path) = e.strip_prefix("ipc://") {
        if !path.starts_with('/') || path.len() < 2 {
            return Err(ConfigError::Invalid(format!(
                "{name} {e:?}: an ipc:// endpoint needs an absolute path"
            )));
        }
        return Ok(());
    }
    Err(ConfigError::Invalid(format!(
        "{name} {e:?}: use tcp://127.0.0.1:PORT or ipc:///absolute/path"
    )))
}

#[cfg(test)]
mod tests {
    use super::super::ManagerConfig;
    use super::HashForm;

    fn err(argv: &[&str]) -> String {
        let mut full = vec!["x"];
        full.extend_from_slice(argv);
        ManagerConfig::from_argv(full).expect_err("refused").to_string()
    }

    #[test]
    fn off_by_default_and_lone_settings_are_refused() {
        assert_eq!(ManagerConfig::from_argv(["x"]).expect("ok").events, None);
        assert!(err(&["--kv-events-replay", "tcp://127.0.0.1:5558"]).contains("kv_events is not"));
        assert!(err(&["--kv-events-int-hashes"]).contains("kv_events_int_hashes is set"));
    }

    #[test]
    fn only_loopback_or_ipc_endpoints() {
        assert!(err(&["--kv-events", "tcp://0.0.0.0:5557"]).contains("not loopback"));
        assert!(err(&["--kv-events", "tcp://*:5557"]).contains("literal address"));
        assert!(err(&["--kv-events", "tcp://localhost:5557"]).contains("literal address"));
        assert!(err(&["--kv-events", "ipc://rel/path"]).contains("absolute path"));
        assert!(err(&["--kv-events", "udp://127.0.0.1:1"]).contains("use tcp://"));
        let same = [
            "--kv-events",
            "tcp://127.0.0.1:5557",
            "--kv-events-replay",
            "tcp://127.0.0.1:5557",
        ];
        assert!(err(&same).contains("its own"));
        assert!(
            err(&["--kv-events", "tcp://127.0.0.1:5557", "--kv-events-buffer", "0"])
                .contains("0 must be 1..=1000000 batches")
        );
        let c = ManagerConfig::from_argv([
            "x",
            "--kv-events",
            "tcp://[::1]:5557",
            "--kv-events-replay",
            "ipc:///tmp/r.sock",
            "--kv-events-int-hashes",
        ])
        .expect("ok");
        let e = c.events.expect("on");
        assert_eq!(
            (e.replay.as_deref(), e.buffer, e.form),
            (Some("ipc:///tmp/r.sock"), 10_000, HashForm::VllmInt)
        );
        let on = [
            "x",
            "--kv-events",
            "tcp://127.0.0.1:5557",
            "--kv-events-hash-form",
        ];
        let form = |f: &str| {
            let argv = on.iter().copied().chain([f]);
            ManagerConfig::from_argv(argv).map(|c| c.events.map(|e| e.form))
        };
        assert_eq!(form("sglang").expect("ok"), Some(HashForm::Sglang));
        assert_eq!(form("bytes").expect("ok"), Some(HashForm::Bytes));
        assert!(err(&on[1..].iter().copied().chain(["int"]).collect::<Vec<_>>()).contains("expected bytes"));
        let both = [
            "--kv-events",
            "tcp://127.0.0.1:5557",
            "--kv-events-int-hashes",
            "--kv-events-hash-form",
            "sglang",
        ];
        assert!(err(&both).contains("give one"));
        assert!(err(&["--kv-events-hash-form", "sglang"]).contains("kv_events is not"));
    }
}
