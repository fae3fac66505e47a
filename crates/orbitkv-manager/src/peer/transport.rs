//! Manager↔Manager connections: TCP, plain on literal loopback, mutual TLS
//! (rustls, TLS 1.3 only, ring provider) when TLS files are configured. The
//! config refuses any other address without TLS files (`config::peer::peer_settings`).

use std::io::{self, Read, Write};
use std::net::{Shutdown, TcpStream, ToSocketAddrs};
use std::sync::Arc;
use std::time::Duration;

use rustls::pki_types::ServerName;
use rustls::server::WebPkiClientVerifier;
use rustls::{ClientConfig, ClientConnection, ServerConfig, ServerConnection, StreamOwned};

use crate::config::PeerTlsFiles;

/// Both sides of mutual TLS, built once at start-up.
pub struct Tls {
    client: Arc<ClientConfig>,
    server: Arc<ServerConfig>,
}

impl std::fmt::Debug for Tls {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Tls")
    }
}

impl Tls {
    /// Load the certificate chain, key and CA; every problem is an error naming the file.
    pub fn load(files: &PeerTlsFiles) -> Result<Tls, String> {
        let certs = super::pem::chain(&files.cert, "peer TLS")?;
        let key = super::pem::private_key(&files.key, "peer TLS")?;
        let roots = super::pem::roots(&files.ca, "peer TLS")?;
        let roots = Arc::new(roots);
        let provider = Arc::new(rustls::crypto::ring::default_provider());
        let verifier = WebPkiClientVerifier::builder_with_provider(roots.clone(), provider.clone())
            .build()
            .map_err(|e| format!("peer TLS CA {}: {e}", files.ca.display()))?;
        let server = ServerConfig::builder_with_provider(provider.clone())
            .with_protocol_versions(&[&rustls::version::TLS13])
            .map_err(|e| e.to_string())?
            .with_client_cert_verifier(verifier)
            .with_single_cert(certs.clone(), key.clone_key())
            .map_err(|e| format!("peer TLS certificate/key: {e}"))?;
        let client = ClientConfig::builder_with_provider(provider)
            .with_protocol_versions(&[&rustls::version::TLS13])
            .map_err(|e| e.to_string())?
            .with_root_certificates(roots)
            .with_client_auth_cert(certs, key)
            .map_err(|e| format!("peer TLS certificate/key: {e}"))?;
        Ok(Tls {
            client: Arc::new(client),
            server: Arc::new(server),
        })
    }
}

/// One Manager↔Manager connection, either side.
pub enum Conn {
    Plain(TcpStream),
    Client(Box<StreamOwned<ClientConnection, TcpStream>>),
    Server(Box<StreamOwned<ServerConnection, TcpStream>>),
}

impl Conn {
    pub fn tcp(&self) -> &TcpStream {
        match self {
            Conn::Plain(s) => s,
            Conn::Client(s) => s.get_ref(),
            Conn::Server(s) => s.get_ref(),
        }
    }

    pub fn set_timeouts(&self, t: Option<Duration>) -> io::Result<()> {
        self.tcp().set_read_timeout(t)?;
        self.tcp().set_write_timeout(t)
    }

    pub fn is_tls(&self) -> bool {
        !matches!(self, Conn::Plain(_))
    }

    pub fn close(&self) {
        let _ = self.tcp().shutdown(Shutdown::Both);
    }
}

impl Read for Conn {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        match self {
            Conn::Plain(s) => s.read(buf),
            Conn::Client(s) => s.read(buf),
            Conn::Server(s) => s.read(buf),
        }
    }
}

impl Write for Conn {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        match self {
            Conn::Plain(s) => s.write(buf),
            Conn::Client(s) => s.write(buf),
            Conn::Server(s) => s.write(buf),
        }
    }

    fn flush(&mut self) -> io::Result<()> {
        match self {
            Conn::Plain(s) => s.flush(),
            Conn::Client(s) => s.flush(),
            Conn::Server(s) => s.flush(),
        }
    }
}

/// Connect to `addr` (`host:port`) within `timeout`, completing the TLS
/// handshake (the peer's certificate verified against our CA, for the name or
/// IP in `addr`) when TLS is configured.
pub fn connect(addr: &str, tls: Option<&Tls>, timeout: Duration, allowed: &[u32]) -> io::Result<Conn> {
    let mut last = io::Error::new(io::ErrorKind::NotFound, format!("{addr}: no address"));
    let mut stream = None;
    for a in addr.to_socket_addrs()? {
        match TcpStream::connect_timeout(&a, timeout) {
            Ok(s) => {
                stream = Some(s);
                break;
            }
            Err(e) => last = e,
        }
    }
    let stream = stream.ok_or(last)?;
    stream.set_nodelay(true)?;
    stream.set_read_timeout(Some(timeout))?;
    stream.set_write_timeout(Some(timeout))?;
    let Some(tls) = tls else {
        check_loopback_uid(&stream, allowed, "source")?;
        return Ok(Conn::Plain(stream));
    };
    let host = addr.rsplit_once(':').map_or(addr, |(h, _)| h);
    let host = host.trim_start_matches('[').trim_end_matches(']');
    let name = ServerName::try_from(host.to_string())
        .map_err(|e| io::Error::new(io::ErrorKind::InvalidInput, format!("{host}: {e}")))?;
    let conn = ClientConnection::new(tls.client.clone(), name).map_err(io::Error::other)?;
    let mut s = StreamOwned::new(conn, stream);
    while s.conn.is_handshaking() {
        s.conn.complete_io(&mut s.sock)?;
    }
    Ok(Conn::Client(Box::new(s)))
}

/// The server side of an accepted connection: completes the TLS handshake
/// (the client must present a certificate chaining to our CA) within `timeout`.
pub fn accept(stream: TcpStream, tls: Option<&Tls>, timeout: Duration, allowed: &[u32]) -> io::Result<Conn> {
    stream.set_nodelay(true)?;
    let Some(tls) = tls else {
        check_loopback_uid(&stream, allowed, "peer")?;
        return Ok(Conn::Plain(stream));
    };
    stream.set_read_timeout(Some(timeout))?;
    stream.set_write_timeout(Some(timeout))?;
    let conn = ServerConnection::new(tls.server.clone()).map_err(io::Error::other)?;
    let mut s = StreamOwned::new(conn, stream);
    while s.conn.is_handshaking() {
        s.conn.complete_io(&mut s.sock)?;
    }
    Ok(Conn::Server(Box::new(s)))
}

/// Without TLS (literal loopback only), the other end must run as our uid or
/// an `allowed` one.
fn check_loopback_uid(stream: &TcpStream, allowed: &[u32], what: &str) -> io::Result<()> {
    let uid = loopback_peer_uid(stream)?;
    let me = orbitkv_shm::peer::my_uid();
    if uid == me || allowed.contains(&uid) {
        Ok(())
    } else {
        Err(io::Error::new(
            io::ErrorKind::PermissionDenied,
            format!(
                "plain-TCP {what} runs as uid {uid}, not the Manager's uid {me} (nor an --allow-uid); configure mutual TLS to trust other users"
            ),
        ))
    }
}

/// The uid owning the other end of a loopback TCP connection, from
/// `/proc/net/tcp{,6}` (the row whose local address is our remote one and whose
/// remote address is our local one). This is plain loopback's stand-in for the
/// Unix socket's `SO_PEERCRED`: without TLS, a peer must run as our uid (or an
/// `--allow-uid`), so another local user can neither read our blocks nor pose
/// as a source.
pub fn loopback_peer_uid(stream: &TcpStream) -> io::Result<u32> {
    let local = stream.local_addr()?;
    let remote = stream.peer_addr()?;
    let (want_local, want_remote) = (proc_addr(&remote), proc_addr(&local));
    let table = if remote.is_ipv4() {
        "/proc/net/tcp"
    } else {
        "/proc/net/tcp6"
    };
    let text = std::fs::read_to_string(table)?;
    for line in text.lines().skip(1) {
        let f: Vec<&str> = line.split_whitespace().collect();
        if f.len() > 7 && f[1] == want_local && f[2] == want_remote {
            return f[7]
                .parse()
                .map_err(|_| io::Error::other(format!("{table}: bad uid {:?}", f[7])));
        }
    }
    Err(io::Error::new(
        io::ErrorKind::NotFound,
        format!("the other end of {local} <-> {remote} is not in {table}"),
    ))
}

/// An address as `/proc/net/tcp{,6}` prints it: the IP's 32-bit words in host
/// byte order, then the port, in upper-case hex.
fn proc_addr(a: &std::net::SocketAddr) -> String {
    match a {
        std::net::SocketAddr::V4(v4) => {
            format!("{:08X}:{:04X}", u32::from_ne_bytes(v4.ip().octets()), v4.port())
        }
        std::net::SocketAddr::V6(v6) => {
            let o = v6.ip().octets();
            let mut s = String::with_capacity(38);
            for w in o.chunks_exact(4) {
                s.push_str(&format!("{:08X}", u32::from_ne_bytes([w[0], w[1], w[2], w[3]])));
            }
            format!("{s}:{:04X}", v6.port())
        }
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]
    use super::*;

    #[test]
    fn a_loopback_connection_of_this_process_is_ours() {
        let l = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
        let c = TcpStream::connect(l.local_addr().expect("addr")).expect("connect");
        let (s, _) = l.accept().expect("accept");
        let me = orbitkv_shm::peer::my_uid();
        assert_eq!(loopback_peer_uid(&c).expect("client side"), me);
        assert_eq!(loopback_peer_uid(&s).expect("server side"), me);
    }
}
