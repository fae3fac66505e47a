//! Prometheus `/metrics` and `/health` over HTTP/1.0 on a loopback address.

use std::io::{BufRead, BufReader, Read, Write};
use std::net::{TcpListener, TcpStream};
use std::time::Duration;

use crate::parts::Shutdown;
use crate::stats;

pub fn serve(stats: &stats::View<'_>, shutdown: &Shutdown, listener: TcpListener) {
    for conn in listener.incoming() {
        if shutdown.requested() {
            return;
        }
        match conn {
            Ok(s) => {
                if let Err(e) = answer(stats, s) {
                    log!(Debug, "metrics request failed: {e}");
                }
            }
            Err(e) => log!(Warn, "metrics accept failed: {e}"),
        }
    }
}

fn answer(stats: &stats::View<'_>, mut s: TcpStream) -> std::io::Result<()> {
    s.set_read_timeout(Some(Duration::from_secs(2)))?;
    let mut line = String::new();
    // The request line only, bounded to 8 KiB.
    BufReader::new(Read::take(&s, 8192)).read_line(&mut line)?;
    let mut parts = line.split_whitespace();
    let (method, path) = (parts.next().unwrap_or(""), parts.next().unwrap_or(""));
    let (status, ctype, body) = match (method, path) {
        ("GET", "/metrics") => ("200 OK", "text/plain; version=0.0.4", stats::prometheus(stats)),
        ("GET", "/health") => ("200 OK", "text/plain", "ok\n".to_string()),
        ("GET", _) => ("404 Not Found", "text/plain", "not found\n".to_string()),
        _ => (
            "405 Method Not Allowed",
            "text/plain",
            "method not allowed\n".to_string(),
        ),
    };
    write!(
        s,
        "HTTP/1.0 {status}\r\nContent-Type: {ctype}\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
        body.len()
    )?;
    s.flush()
}
