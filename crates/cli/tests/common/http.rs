//! A small HTTP/1.1 client for tests against a server's `--http` address
//! (metrics, the JSON API) and ChromeDriver, and free loopback ports.

use std::io::{Read, Write};
use std::time::{Duration, Instant};

/// A loopback port nothing listens on right now.
pub fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

/// `127.0.0.1:PORT` with a [`free_port`].
pub fn free_addr() -> String {
    format!("127.0.0.1:{}", free_port())
}

/// An answer: status, the head as sent (status line and headers) and the
/// body (de-chunked).
pub struct Reply {
    pub status: u16,
    pub head: String,
    pub body: String,
}

/// One exchange on a connection of its own (`Connection: close`), with
/// `Host: ADDR` unless `headers` name one: status and body.
pub fn http(
    addr: &str,
    method: &str,
    path: &str,
    headers: &[(&str, &str)],
    body: &str,
) -> (u16, String) {
    let r = request(addr, method, path, headers, body)
        .unwrap_or_else(|e| panic!("{method} http://{addr}{path}: {e}"));
    (r.status, r.body)
}

/// `GET path`.
pub fn get(addr: &str, path: &str) -> Reply {
    request(addr, "GET", path, &[], "").unwrap_or_else(|e| panic!("GET http://{addr}{path}: {e}"))
}

/// The Prometheus text of a server's `--http` address.
pub fn metrics(addr: &str) -> String {
    get(addr, "/metrics").body
}

/// The value of `sample` (a metric's name, with its labels if it has
/// any: `name{k="v"}`) in a /metrics text.
pub fn sample(body: &str, sample: &str) -> f64 {
    body.lines()
        .find_map(|l| l.strip_prefix(sample)?.strip_prefix(' '))
        .unwrap_or_else(|| panic!("no sample {sample} in /metrics:\n{body}"))
        .trim()
        .parse()
        .unwrap()
}

pub fn request(
    addr: &str,
    method: &str,
    path: &str,
    headers: &[(&str, &str)],
    body: &str,
) -> std::io::Result<Reply> {
    let mut s = std::net::TcpStream::connect(addr)?;
    s.set_read_timeout(Some(Duration::from_secs(60)))?;
    let mut req = format!("{method} {path} HTTP/1.1\r\nConnection: close\r\n");
    if !headers.iter().any(|(k, _)| k.eq_ignore_ascii_case("host")) {
        req.push_str(&format!("Host: {addr}\r\n"));
    }
    for (k, v) in headers {
        req.push_str(&format!("{k}: {v}\r\n"));
    }
    req.push_str(&format!("Content-Length: {}\r\n\r\n{body}", body.len()));
    s.write_all(req.as_bytes())?;
    // Read the head, then the body by its length (a server may keep the
    // connection open despite 'close'), chunked, or to the end.
    let mut r = Vec::new();
    let mut buf = [0u8; 65536];
    let head_end = loop {
        if let Some(i) = r.windows(4).position(|w| w == b"\r\n\r\n") {
            break i;
        }
        let n = s.read(&mut buf)?;
        if n == 0 {
            return Ok(Reply {
                status: 0,
                head: String::from_utf8_lossy(&r).to_string(),
                body: String::new(),
            });
        }
        r.extend_from_slice(&buf[..n]);
    };
    let head = String::from_utf8_lossy(&r[..head_end]).to_string();
    let mut body = r[head_end + 4..].to_vec();
    let status = head
        .split_whitespace()
        .nth(1)
        .and_then(|c| c.parse().ok())
        .unwrap_or(0);
    let header = |name: &str| {
        head.lines().find_map(|l| {
            let (k, v) = l.split_once(':')?;
            k.trim()
                .eq_ignore_ascii_case(name)
                .then(|| v.trim().to_string())
        })
    };
    let length: Option<usize> = header("content-length").and_then(|v| v.parse().ok());
    let chunked = header("transfer-encoding").is_some_and(|v| v.eq_ignore_ascii_case("chunked"));
    loop {
        let done = match length {
            Some(n) => body.len() >= n,
            None => chunked && body.ends_with(b"0\r\n\r\n"),
        };
        if done {
            break;
        }
        let n = s.read(&mut buf)?;
        if n == 0 {
            break;
        }
        body.extend_from_slice(&buf[..n]);
    }
    let body = String::from_utf8_lossy(&body).to_string();
    let body = if chunked { dechunk(&body) } else { body };
    Ok(Reply { status, head, body })
}

fn dechunk(mut s: &str) -> String {
    let mut out = String::new();
    while let Some((len, rest)) = s.split_once("\r\n") {
        let n = usize::from_str_radix(len.trim(), 16).unwrap_or(0);
        if n == 0 || rest.len() < n {
            break;
        }
        out.push_str(&rest[..n]);
        s = rest[n..].trim_start_matches("\r\n");
    }
    out
}

/// Wait until the server's HTTP listener answers.
pub fn wait_http(addr: &str) {
    let t = Instant::now();
    while std::net::TcpStream::connect(addr).is_err() {
        assert!(t.elapsed() < Duration::from_secs(20), "no HTTP on {addr}");
        std::thread::sleep(Duration::from_millis(20));
    }
}
