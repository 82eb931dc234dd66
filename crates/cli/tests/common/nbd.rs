//! A raw NBD client for tests that must send what real clients do not:
//! just the greeting read, or an old-style EXPORT_NAME.

use std::io::{Read, Write};
use std::net::TcpStream;
use std::time::Duration;

pub const IHAVEOPT: u64 = 0x4948_4156_454F_5054;
pub const OPT_EXPORT_NAME: u32 = 1;

/// Connect and read the greeting (None: the server closed at once).
pub fn greeted(addr: &str) -> Option<TcpStream> {
    let mut s = TcpStream::connect(addr).ok()?;
    s.set_read_timeout(Some(Duration::from_secs(20))).ok()?;
    let mut hello = [0u8; 18];
    s.read_exact(&mut hello).ok()?;
    Some(s)
}

/// A connection that opened `export` with EXPORT_NAME (None: refused).
pub fn opened(addr: &str, export: &str) -> Option<TcpStream> {
    let mut s = greeted(addr)?;
    // FIXED_NEWSTYLE | NO_ZEROES.
    let mut m = 3u32.to_be_bytes().to_vec();
    m.extend_from_slice(&IHAVEOPT.to_be_bytes());
    m.extend_from_slice(&OPT_EXPORT_NAME.to_be_bytes());
    m.extend_from_slice(&(export.len() as u32).to_be_bytes());
    m.extend_from_slice(export.as_bytes());
    s.write_all(&m).ok()?;
    let mut answer = [0u8; 10];
    s.read_exact(&mut answer).ok()?;
    Some(s)
}
