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
    export_name(&mut s, export).ok()?;
    Some(s)
}

/// After the greeting: ask for `export` with EXPORT_NAME (fixed newstyle,
/// no zeroes) and read the answer; the export's size.
fn export_name(s: &mut (impl Read + Write), export: &str) -> std::io::Result<u64> {
    // FIXED_NEWSTYLE | NO_ZEROES.
    let mut m = 3u32.to_be_bytes().to_vec();
    m.extend_from_slice(&IHAVEOPT.to_be_bytes());
    m.extend_from_slice(&OPT_EXPORT_NAME.to_be_bytes());
    m.extend_from_slice(&(export.len() as u32).to_be_bytes());
    m.extend_from_slice(export.as_bytes());
    s.write_all(&m)?;
    let mut answer = [0u8; 10];
    s.read_exact(&mut answer)?;
    Ok(u64::from_be_bytes(answer[..8].try_into().unwrap()))
}

pub const CMD_READ: u16 = 0;
pub const CMD_WRITE: u16 = 1;
pub const CMD_FLUSH: u16 = 3;
/// Command flag: answer only once the command's writes are durable.
pub const CMD_FLAG_FUA: u16 = 1;

/// A client of one export over a Unix socket that keeps several requests
/// in flight (simple replies only: it asks for no structured replies), for
/// tests that must know which writes were answered before which flush.
pub struct Pipelined {
    s: std::os::unix::net::UnixStream,
    /// The export's size in bytes.
    pub size: u64,
}

/// One simple reply: the request's handle and its error (0: success).
pub struct Reply {
    pub handle: u64,
    pub error: u32,
}

impl Pipelined {
    /// Open `export` with EXPORT_NAME (fixed newstyle, no zeroes).
    pub fn open(sock: &std::path::Path, export: &str) -> std::io::Result<Pipelined> {
        let mut s = std::os::unix::net::UnixStream::connect(sock)?;
        s.set_read_timeout(Some(Duration::from_secs(60)))?;
        let mut hello = [0u8; 18];
        s.read_exact(&mut hello)?;
        if &hello[..16] != b"NBDMAGICIHAVEOPT" {
            return Err(std::io::Error::other("not a fixed-newstyle NBD greeting"));
        }
        let size = export_name(&mut s, export)?;
        Ok(Pipelined { s, size })
    }

    /// A second handle on the same connection, so that one thread can send
    /// while another reads the replies.
    #[allow(dead_code)]
    pub fn try_clone(&self) -> std::io::Result<Pipelined> {
        Ok(Pipelined {
            s: self.s.try_clone()?,
            size: self.size,
        })
    }

    /// Send one request (`data` is a WRITE's payload); does not wait.
    pub fn send(
        &mut self,
        cmd: u16,
        handle: u64,
        offset: u64,
        len: u32,
        data: &[u8],
    ) -> std::io::Result<()> {
        self.send_flagged(cmd, 0, handle, offset, len, data)
    }

    /// [`send`](Self::send) with command flags (`CMD_FLAG_FUA`).
    pub fn send_flagged(
        &mut self,
        cmd: u16,
        flags: u16,
        handle: u64,
        offset: u64,
        len: u32,
        data: &[u8],
    ) -> std::io::Result<()> {
        let mut m = Vec::with_capacity(28 + data.len());
        m.extend_from_slice(&0x2560_9513u32.to_be_bytes());
        m.extend_from_slice(&flags.to_be_bytes());
        m.extend_from_slice(&cmd.to_be_bytes());
        m.extend_from_slice(&handle.to_be_bytes());
        m.extend_from_slice(&offset.to_be_bytes());
        m.extend_from_slice(&len.to_be_bytes());
        m.extend_from_slice(data);
        self.s.write_all(&m)
    }

    /// Send bytes as they are (a request cut short, say).
    pub fn send_raw(&mut self, bytes: &[u8]) -> std::io::Result<()> {
        self.s.write_all(bytes)
    }

    /// The next reply; a successful READ's payload (`read_len` bytes) is
    /// read into `buf`.
    pub fn reply(&mut self, buf: &mut [u8]) -> std::io::Result<Reply> {
        let mut h = [0u8; 16];
        self.s.read_exact(&mut h)?;
        let magic = u32::from_be_bytes(h[..4].try_into().unwrap());
        if magic != 0x6744_6698 {
            return Err(std::io::Error::other(format!("bad reply magic {magic:#x}")));
        }
        let error = u32::from_be_bytes(h[4..8].try_into().unwrap());
        let handle = u64::from_be_bytes(h[8..].try_into().unwrap());
        if error == 0 && !buf.is_empty() {
            self.s.read_exact(buf)?;
        }
        Ok(Reply { handle, error })
    }

    /// Send one request and wait for its reply (nothing else may be in
    /// flight): an error if it failed or the reply is another request's.
    fn one(&mut self, cmd: u16, offset: u64, data: &[u8], buf: &mut [u8]) -> std::io::Result<()> {
        let len = (data.len() + buf.len()) as u32;
        self.send(cmd, u64::MAX, offset, len, data)?;
        let r = self.reply(buf)?;
        if r.handle != u64::MAX {
            return Err(std::io::Error::other(format!(
                "a reply to handle {} where only {} was in flight",
                r.handle,
                u64::MAX
            )));
        }
        if r.error != 0 {
            return Err(std::io::Error::other(format!(
                "command {cmd} at {offset} failed: error {}",
                r.error
            )));
        }
        Ok(())
    }

    /// Read `buf.len()` bytes at `offset`, waiting for the answer (nothing
    /// else may be in flight).
    pub fn read_at(&mut self, buf: &mut [u8], offset: u64) -> std::io::Result<()> {
        self.one(CMD_READ, offset, &[], buf)
    }

    /// Write `data` at `offset`, waiting for the answer (nothing else may
    /// be in flight).
    pub fn write_at(&mut self, data: &[u8], offset: u64) -> std::io::Result<()> {
        self.one(CMD_WRITE, offset, data, &mut [])
    }

    /// Write and flush, waiting for both.
    pub fn write_flush(&mut self, data: &[u8], offset: u64) -> std::io::Result<()> {
        self.send(CMD_WRITE, 1, offset, data.len() as u32, data)?;
        self.send(CMD_FLUSH, 2, 0, 0, &[])?;
        for _ in 0..2 {
            let r = self.reply(&mut [])?;
            if r.error != 0 {
                return Err(std::io::Error::other(format!("error {}", r.error)));
            }
        }
        Ok(())
    }
}
