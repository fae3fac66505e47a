//! Membership in etcd through its v3 JSON gateway (plain HTTP/1.1 on a
//! loopback endpoint, or HTTPS with a CA and an optional client certificate,
//! rustls): this Manager registers `<prefix>members/<advertise>`
//! under a lease with `--etcd-ttl-s`, keeps the lease alive at a third of the
//! TTL, and reads the member list at the same pace. etcd down: the last known
//! list and the static peers stay in use, and the Manager's own blocks are
//! served as always (nothing on the lookup path waits for etcd). The lease is
//! revoked at shutdown, so a stopped Manager leaves the list at once; a killed
//! one leaves it when its lease expires.
//!
//! Why the gateway rather than a gRPC client crate: it needs only a TCP
//! socket, `serde_json` (already a dependency) and base64 (a few lines here),
//! where the gRPC client brings an async runtime, an HTTP/2 stack, protobuf
//! code generation and a build-time `protoc`.

use std::io::{Read, Write};
use std::net::{TcpStream, ToSocketAddrs};
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use rustls::pki_types::ServerName;
use rustls::{ClientConfig, ClientConnection, StreamOwned};
use serde_json::{Value, json};

use super::PeerTier;
use crate::config::EtcdTlsFiles;
use crate::parts::Shutdown;

/// The HTTPS client configuration for etcd, built at start-up: every problem
/// with the files is an error naming the file.
pub fn load_tls(files: &EtcdTlsFiles) -> Result<Arc<ClientConfig>, String> {
    let roots = super::pem::roots(&files.ca, "etcd TLS")?;
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let builder = ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .map_err(|e| e.to_string())?
        .with_root_certificates(roots);
    let config = match &files.client {
        None => builder.with_no_client_auth(),
        Some((cert, key)) => {
            let certs = super::pem::chain(cert, "etcd TLS")?;
            let k = super::pem::private_key(key, "etcd TLS")?;
            builder
                .with_client_auth_cert(certs, k)
                .map_err(|e| format!("etcd TLS certificate/key: {e}"))?
        }
    };
    Ok(Arc::new(config))
}

const HTTP_TIMEOUT: Duration = Duration::from_secs(2);
/// Largest gateway reply read.
const MAX_REPLY: u64 = 16 << 20;

pub fn membership(peer: &PeerTier, shutdown: &Shutdown) {
    let Some(etcd) = peer.settings.etcd.clone() else {
        return;
    };
    let Some(me) = peer.settings.advertise.clone().or_else(|| {
        peer.listen_addr
            .lock()
            .ok()
            .and_then(|a| *a)
            .map(|a| a.to_string())
    }) else {
        return;
    };
    let members = format!("{}members/", etcd.prefix);
    let my_key = format!("{members}{me}");
    let period = Duration::from_millis(etcd.ttl_s * 1000 / 3);
    let client = Gateway {
        endpoints: etcd.endpoints.clone(),
        tls: peer.etcd_tls.clone(),
    };
    let mut lease: Option<String> = None;
    while !shutdown.requested() {
        let round = (|| -> Result<(), String> {
            let id = match &lease {
                Some(id) => {
                    let r = client.post("/v3/lease/keepalive", &json!({ "ID": id }))?;
                    let ttl = r.pointer("/result/TTL").and_then(value_u64).unwrap_or(0);
                    if ttl == 0 {
                        log!(Warn, "etcd lease {id} expired; registering again");
                        lease = None;
                        return Err("lease expired".into());
                    }
                    id.clone()
                }
                None => {
                    let r = client.post("/v3/lease/grant", &json!({ "TTL": etcd.ttl_s }))?;
                    let id = r
                        .get("ID")
                        .and_then(value_u64)
                        .ok_or_else(|| format!("lease grant: unexpected reply {r}"))?
                        .to_string();
                    client.post(
                        "/v3/kv/put",
                        &json!({ "key": b64(my_key.as_bytes()), "value": b64(me.as_bytes()), "lease": id }),
                    )?;
                    log!(
                        Info,
                        "registered in etcd as {my_key} (lease {id}, TTL {} s)",
                        etcd.ttl_s
                    );
                    lease = Some(id.clone());
                    id
                }
            };
            let _ = id;
            let r = client.post(
                "/v3/kv/range",
                &json!({ "key": b64(members.as_bytes()), "range_end": b64(&prefix_end(members.as_bytes())) }),
            )?;
            let mut found = Vec::new();
            for kv in r.get("kvs").and_then(Value::as_array).into_iter().flatten() {
                if let Some(v) = kv.get("value").and_then(Value::as_str).and_then(unb64)
                    && let Ok(addr) = String::from_utf8(v)
                {
                    found.push(addr);
                }
            }
            peer.set_discovered(&found);
            *peer.etcd_status.write().unwrap_or_else(|p| p.into_inner()) =
                format!("up: {} member(s) registered", found.len());
            Ok(())
        })();
        match round {
            Ok(()) => {
                if !peer.etcd_up.swap(true, Ordering::Relaxed) {
                    log!(Info, "etcd reachable");
                }
            }
            Err(e) => {
                if peer.etcd_up.swap(false, Ordering::Relaxed) {
                    log!(
                        Warn,
                        "etcd unreachable ({e}); serving local blocks and the last known peers"
                    );
                }
                *peer.etcd_status.write().unwrap_or_else(|p| p.into_inner()) = format!("down: {e}");
            }
        }
        let t0 = Instant::now();
        while t0.elapsed() < period && !shutdown.requested() {
            std::thread::sleep(Duration::from_millis(50));
        }
    }
    if let Some(id) = lease {
        let _ = client.post("/v3/lease/revoke", &json!({ "ID": id }));
    }
}

/// etcd's JSON encodes int64 as strings.
fn value_u64(v: &Value) -> Option<u64> {
    v.as_u64().or_else(|| v.as_str().and_then(|s| s.parse().ok()))
}

fn prefix_end(p: &[u8]) -> Vec<u8> {
    let mut end = p.to_vec();
    while let Some(last) = end.pop() {
        if last < 0xff {
            end.push(last + 1);
            return end;
        }
    }
    vec![0]
}

struct Gateway {
    endpoints: Vec<String>,
    tls: Option<Arc<ClientConfig>>,
}

impl Gateway {
    /// POST `body` to the first endpoint that answers.
    fn post(&self, path: &str, body: &Value) -> Result<Value, String> {
        let mut last = String::from("no endpoint");
        for ep in &self.endpoints {
            match post_one(ep, self.tls.as_ref(), path, body) {
                Ok(v) => return Ok(v),
                Err(e) => last = format!("{ep}{path}: {e}"),
            }
        }
        Err(last)
    }
}

fn post_one(ep: &str, tls: Option<&Arc<ClientConfig>>, path: &str, body: &Value) -> Result<Value, String> {
    let body = body.to_string();
    let addr = ep
        .to_socket_addrs()
        .map_err(|e| e.to_string())?
        .next()
        .ok_or("the host name has no address")?;
    let s = TcpStream::connect_timeout(&addr, HTTP_TIMEOUT).map_err(|e| e.to_string())?;
    s.set_read_timeout(Some(HTTP_TIMEOUT))
        .map_err(|e| e.to_string())?;
    s.set_write_timeout(Some(HTTP_TIMEOUT))
        .map_err(|e| e.to_string())?;
    let req = format!(
        "POST {path} HTTP/1.1\r\nHost: {ep}\r\nContent-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
        body.len()
    );
    let mut raw = Vec::new();
    match tls {
        None => {
            let mut s = s;
            s.write_all(req.as_bytes()).map_err(|e| e.to_string())?;
            s.take(MAX_REPLY)
                .read_to_end(&mut raw)
                .map_err(|e| e.to_string())?;
        }
        Some(cfg) => {
            let host = ep.rsplit_once(':').map_or(ep, |(h, _)| h);
            let host = host.trim_start_matches('[').trim_end_matches(']');
            let name =
                ServerName::try_from(host.to_string()).map_err(|e| format!("server name {host:?}: {e}"))?;
            let conn = ClientConnection::new(cfg.clone(), name).map_err(|e| e.to_string())?;
            let mut s = StreamOwned::new(conn, s);
            s.write_all(req.as_bytes()).map_err(|e| e.to_string())?;
            s.flush().map_err(|e| e.to_string())?;
            match (&mut s).take(MAX_REPLY).read_to_end(&mut raw) {
                Ok(_) => {}
                // A server that closes without close_notify after a whole reply.
                Err(e) if e.kind() == std::io::ErrorKind::UnexpectedEof && !raw.is_empty() => {}
                Err(e) => return Err(e.to_string()),
            }
        }
    }
    let split = raw
        .windows(4)
        .position(|w| w == b"\r\n\r\n")
        .ok_or("no HTTP header end")?;
    let head = String::from_utf8_lossy(&raw[..split]).to_string();
    let mut payload = raw[split + 4..].to_vec();
    let status = head
        .split_whitespace()
        .nth(1)
        .and_then(|c| c.parse::<u16>().ok())
        .ok_or("no HTTP status")?;
    if head.to_ascii_lowercase().contains("transfer-encoding: chunked") {
        payload = dechunk(&payload).ok_or("bad chunked body")?;
    }
    if status != 200 {
        return Err(format!(
            "HTTP {status}: {}",
            String::from_utf8_lossy(&payload)
                .chars()
                .take(200)
                .collect::<String>()
        ));
    }
    serde_json::from_slice(&payload).map_err(|e| format!("reply is not JSON: {e}"))
}

fn dechunk(mut b: &[u8]) -> Option<Vec<u8>> {
    let mut out = Vec::new();
    loop {
        let nl = b.windows(2).position(|w| w == b"\r\n")?;
        let size_s = std::str::from_utf8(&b[..nl]).ok()?;
        let size = usize::from_str_radix(size_s.split(';').next()?.trim(), 16).ok()?;
        b = &b[nl + 2..];
        if size == 0 {
            return Some(out);
        }
        out.extend_from_slice(b.get(..size)?);
        b = b.get(size + 2..)?;
    }
}

const B64: &[u8; 64] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";

fn b64(data: &[u8]) -> String {
    let mut out = String::with_capacity(data.len().div_ceil(3) * 4);
    for c in data.chunks(3) {
        let n = (u32::from(c[0]) << 16)
            | (u32::from(*c.get(1).unwrap_or(&0)) << 8)
            | u32::from(*c.get(2).unwrap_or(&0));
        for i in 0..4 {
            if i <= c.len() {
                out.push(B64[(n >> (18 - 6 * i) & 63) as usize] as char);
            } else {
                out.push('=');
            }
        }
    }
    out
}

fn unb64(s: &str) -> Option<Vec<u8>> {
    let mut out = Vec::with_capacity(s.len() / 4 * 3);
    let mut acc = 0u32;
    let mut bits = 0;
    for ch in s.bytes() {
        if ch == b'=' {
            break;
        }
        let v = B64.iter().position(|&x| x == ch)? as u32;
        acc = (acc << 6) | v;
        bits += 6;
        if bits >= 8 {
            bits -= 8;
            out.push((acc >> bits) as u8);
            acc &= (1 << bits) - 1;
        }
    }
    Some(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn base64_round_trips() {
        for s in ["", "a", "ab", "abc", "abcd", "/orbitkv/members/127.0.0.1:7470"] {
            let e = b64(s.as_bytes());
            assert_eq!(unb64(&e).as_deref(), Some(s.as_bytes()), "{s} -> {e}");
        }
        assert_eq!(b64(b"foo"), "Zm9v");
        assert_eq!(b64(b"fo"), "Zm8=");
        assert_eq!(prefix_end(b"/a/"), b"/a0".to_vec());
    }

    #[test]
    fn dechunks() {
        assert_eq!(
            dechunk(b"3\r\nabc\r\n2\r\nde\r\n0\r\n\r\n").as_deref(),
            Some(&b"abcde"[..])
        );
        assert_eq!(dechunk(b"5\r\nab"), None);
    }
}
