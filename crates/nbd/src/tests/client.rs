//! A deliberately small NBD client speaking raw bytes, for the tests. It
//! checks every magic it reads and fails loudly (with a timeout) instead
//! of hanging.

use std::io::{ErrorKind, Read, Write};
use std::net::TcpStream;
use std::os::unix::net::UnixStream;
use std::path::Path;
use std::time::Duration;

use crate::proto::*;

pub const TIMEOUT: Duration = Duration::from_secs(20);

pub trait Stream: Read + Write + Send {
    fn dup(&self) -> Box<dyn Stream>;
}

impl Stream for UnixStream {
    fn dup(&self) -> Box<dyn Stream> {
        Box::new(self.try_clone().expect("clone socket"))
    }
}

impl Stream for TcpStream {
    fn dup(&self) -> Box<dyn Stream> {
        Box::new(self.try_clone().expect("clone socket"))
    }
}

#[derive(Debug)]
pub struct OptReply {
    pub opt: u32,
    pub ty: u32,
    pub data: Vec<u8>,
}

#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct Export {
    pub size: u64,
    pub flags: u16,
    pub name: Option<String>,
    pub description: Option<String>,
    pub block: Option<(u32, u32, u32)>,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Reply {
    Simple {
        errno: u32,
        cookie: u64,
    },
    Chunk {
        flags: u16,
        ty: u16,
        cookie: u64,
        payload: Vec<u8>,
    },
}

impl Reply {
    pub fn cookie(&self) -> u64 {
        match self {
            Reply::Simple { cookie, .. } | Reply::Chunk { cookie, .. } => *cookie,
        }
    }
}

pub struct Client {
    pub s: Box<dyn Stream>,
    next_cookie: u64,
    /// Structured replies negotiated.
    pub structured: bool,
}

pub fn be_string(s: &str) -> Vec<u8> {
    let mut b = (s.len() as u32).to_be_bytes().to_vec();
    b.extend_from_slice(s.as_bytes());
    b
}

pub fn info_payload(name: &str, items: &[u16]) -> Vec<u8> {
    let mut b = be_string(name);
    b.extend_from_slice(&(items.len() as u16).to_be_bytes());
    for i in items {
        b.extend_from_slice(&i.to_be_bytes());
    }
    b
}

pub fn meta_payload(name: &str, queries: &[&str]) -> Vec<u8> {
    let mut b = be_string(name);
    b.extend_from_slice(&(queries.len() as u32).to_be_bytes());
    for q in queries {
        b.extend_from_slice(&be_string(q));
    }
    b
}

pub fn header(magic: u32, flags: u16, ty: u16, cookie: u64, offset: u64, len: u32) -> Vec<u8> {
    let mut b = Vec::with_capacity(REQUEST_BYTES);
    b.extend_from_slice(&magic.to_be_bytes());
    b.extend_from_slice(&flags.to_be_bytes());
    b.extend_from_slice(&ty.to_be_bytes());
    b.extend_from_slice(&cookie.to_be_bytes());
    b.extend_from_slice(&offset.to_be_bytes());
    b.extend_from_slice(&len.to_be_bytes());
    b
}

/// (errno, message) of an ERROR chunk payload.
pub fn error_chunk(payload: &[u8]) -> (u32, String) {
    assert!(payload.len() >= 6, "short ERROR chunk");
    let errno = u32::from_be_bytes(payload[..4].try_into().unwrap());
    let n = u16::from_be_bytes(payload[4..6].try_into().unwrap()) as usize;
    assert_eq!(payload.len(), 6 + n, "ERROR chunk message length");
    (
        errno,
        String::from_utf8(payload[6..].to_vec()).expect("UTF-8"),
    )
}

impl Client {
    pub fn unix(path: &Path) -> Client {
        let s = UnixStream::connect(path).expect("connect to the NBD socket");
        s.set_read_timeout(Some(TIMEOUT)).unwrap();
        s.set_write_timeout(Some(TIMEOUT)).unwrap();
        Client::over(Box::new(s))
    }

    pub fn tcp(addr: std::net::SocketAddr) -> Client {
        let s = TcpStream::connect(addr).expect("connect to the NBD port");
        s.set_read_timeout(Some(TIMEOUT)).unwrap();
        s.set_write_timeout(Some(TIMEOUT)).unwrap();
        Client::over(Box::new(s))
    }

    pub fn over(s: Box<dyn Stream>) -> Client {
        Client {
            s,
            next_cookie: 1,
            structured: false,
        }
    }

    /// Read the greeting and answer with `flags`.
    pub fn hello(mut self, flags: u32) -> Client {
        assert_eq!(self.u64(), NBDMAGIC, "greeting NBDMAGIC");
        assert_eq!(self.u64(), IHAVEOPT, "greeting IHAVEOPT");
        assert_eq!(
            self.u16(),
            HS_FIXED_NEWSTYLE | HS_NO_ZEROES,
            "handshake flags"
        );
        self.send(&flags.to_be_bytes());
        self
    }

    /// Connected and ready to send options, with NO_ZEROES.
    pub fn negotiating(path: &Path) -> Client {
        Client::unix(path).hello(CLIENT_FIXED_NEWSTYLE | CLIENT_NO_ZEROES)
    }

    /// Negotiate and GO; panics on failure.
    pub fn open(path: &Path, name: &str, structured: bool, meta: bool) -> (Client, Export) {
        let c = Client::negotiating(path);
        c.setup(name, structured, meta)
    }

    pub fn setup(mut self, name: &str, structured: bool, meta: bool) -> (Client, Export) {
        if structured {
            self.option(OPT_STRUCTURED_REPLY, &[]);
            let r = self.opt_reply();
            assert_eq!((r.opt, r.ty), (OPT_STRUCTURED_REPLY, REP_ACK));
            self.structured = true;
        }
        if meta {
            let ids = self.set_meta(name, &[BASE_ALLOCATION]);
            assert_eq!(ids.len(), 1, "base:allocation selected");
            assert_eq!(ids[0].1, BASE_ALLOCATION);
        }
        // As qemu and libnbd do: asking for the block sizes holds this
        // client to them (512-byte alignment, EINVAL otherwise).
        let e = self.info(OPT_GO, name, &[INFO_BLOCK_SIZE]).expect("GO");
        (self, e)
    }

    pub fn send(&mut self, b: &[u8]) {
        self.s.write_all(b).expect("send to the server");
    }

    pub fn recv(&mut self, n: usize) -> Vec<u8> {
        let mut b = vec![0u8; n];
        self.s.read_exact(&mut b).expect("receive from the server");
        b
    }

    pub fn u16(&mut self) -> u16 {
        u16::from_be_bytes(self.recv(2).try_into().unwrap())
    }
    pub fn u32(&mut self) -> u32 {
        u32::from_be_bytes(self.recv(4).try_into().unwrap())
    }
    pub fn u64(&mut self) -> u64 {
        u64::from_be_bytes(self.recv(8).try_into().unwrap())
    }

    /// True if the server closed the connection (EOF or reset) before
    /// sending anything more.
    pub fn closed(&mut self) -> bool {
        let mut b = [0u8; 1];
        loop {
            match self.s.read(&mut b) {
                Ok(0) => return true,
                Ok(_) => return false,
                Err(e) if e.kind() == ErrorKind::Interrupted => continue,
                Err(e) if e.kind() == ErrorKind::ConnectionReset => return true,
                Err(e) => panic!("waiting for the server to hang up: {e}"),
            }
        }
    }

    pub fn option(&mut self, opt: u32, data: &[u8]) {
        let mut b = IHAVEOPT.to_be_bytes().to_vec();
        b.extend_from_slice(&opt.to_be_bytes());
        b.extend_from_slice(&(data.len() as u32).to_be_bytes());
        b.extend_from_slice(data);
        self.send(&b);
    }

    pub fn opt_reply(&mut self) -> OptReply {
        assert_eq!(self.u64(), OPT_REPLY_MAGIC, "option reply magic");
        let opt = self.u32();
        let ty = self.u32();
        let len = self.u32() as usize;
        assert!(len <= 1 << 20, "option reply of {len} bytes");
        let data = self.recv(len);
        OptReply { opt, ty, data }
    }

    /// INFO or GO; `Err(reply type)` for an error reply.
    pub fn info(&mut self, opt: u32, name: &str, items: &[u16]) -> Result<Export, u32> {
        self.option(opt, &info_payload(name, items));
        let mut e = Export::default();
        let mut seen_export = false;
        loop {
            let r = self.opt_reply();
            assert_eq!(r.opt, opt, "reply to the option asked");
            match r.ty {
                REP_INFO => {
                    assert!(r.data.len() >= 2);
                    let d = &r.data[2..];
                    match u16::from_be_bytes([r.data[0], r.data[1]]) {
                        INFO_EXPORT => {
                            assert_eq!(d.len(), 10, "INFO_EXPORT length");
                            e.size = u64::from_be_bytes(d[..8].try_into().unwrap());
                            e.flags = u16::from_be_bytes(d[8..].try_into().unwrap());
                            seen_export = true;
                        }
                        INFO_NAME => e.name = Some(String::from_utf8(d.to_vec()).unwrap()),
                        INFO_DESCRIPTION => {
                            e.description = Some(String::from_utf8(d.to_vec()).unwrap())
                        }
                        INFO_BLOCK_SIZE => {
                            assert_eq!(d.len(), 12, "INFO_BLOCK_SIZE length");
                            let v = |i: usize| u32::from_be_bytes(d[i..i + 4].try_into().unwrap());
                            e.block = Some((v(0), v(4), v(8)));
                        }
                        t => panic!("unexpected info type {t}"),
                    }
                }
                REP_ACK => {
                    assert!(seen_export, "ACK without INFO_EXPORT");
                    return Ok(e);
                }
                t => {
                    assert!(t & (1 << 31) != 0, "unexpected reply type {t:#x}");
                    assert!(!seen_export, "error after INFO_EXPORT");
                    return Err(t);
                }
            }
        }
    }

    /// LIST: the export names, or the error reply type.
    pub fn list(&mut self) -> Result<Vec<(String, String)>, u32> {
        self.option(OPT_LIST, &[]);
        let mut out = Vec::new();
        loop {
            let r = self.opt_reply();
            assert_eq!(r.opt, OPT_LIST);
            match r.ty {
                REP_SERVER => {
                    let n = u32::from_be_bytes(r.data[..4].try_into().unwrap()) as usize;
                    assert!(4 + n <= r.data.len());
                    let name = String::from_utf8(r.data[4..4 + n].to_vec()).unwrap();
                    let rest = String::from_utf8(r.data[4 + n..].to_vec()).unwrap();
                    out.push((name, rest));
                }
                REP_ACK => return Ok(out),
                t => return Err(t),
            }
        }
    }

    /// LIST or SET_META_CONTEXT: the (id, name) replies, or the error.
    pub fn meta(
        &mut self,
        opt: u32,
        name: &str,
        queries: &[&str],
    ) -> Result<Vec<(u32, String)>, u32> {
        self.option(opt, &meta_payload(name, queries));
        let mut out = Vec::new();
        loop {
            let r = self.opt_reply();
            assert_eq!(r.opt, opt);
            match r.ty {
                REP_META_CONTEXT => {
                    let id = u32::from_be_bytes(r.data[..4].try_into().unwrap());
                    out.push((id, String::from_utf8(r.data[4..].to_vec()).unwrap()));
                }
                REP_ACK => return Ok(out),
                t => return Err(t),
            }
        }
    }

    pub fn set_meta(&mut self, name: &str, queries: &[&str]) -> Vec<(u32, String)> {
        self.meta(OPT_SET_META_CONTEXT, name, queries)
            .expect("SET_META_CONTEXT")
    }

    /// Send a request; returns its cookie.
    pub fn request(&mut self, flags: u16, ty: u16, offset: u64, len: u32, data: &[u8]) -> u64 {
        let cookie = self.next_cookie;
        self.next_cookie += 1;
        let mut b = header(REQUEST_MAGIC, flags, ty, cookie, offset, len);
        b.extend_from_slice(data);
        self.send(&b);
        cookie
    }

    /// Read one reply; READ data of a simple reply is not consumed.
    pub fn reply(&mut self) -> Reply {
        match self.u32() {
            SIMPLE_REPLY_MAGIC => {
                let errno = self.u32();
                let cookie = self.u64();
                Reply::Simple { errno, cookie }
            }
            STRUCTURED_REPLY_MAGIC => {
                let flags = self.u16();
                let ty = self.u16();
                let cookie = self.u64();
                let len = self.u32() as usize;
                assert!(len <= 64 << 20, "chunk of {len} bytes");
                let payload = self.recv(len);
                Reply::Chunk {
                    flags,
                    ty,
                    cookie,
                    payload,
                }
            }
            m => panic!("bad reply magic {m:#x}"),
        }
    }

    /// The errno of a reply to a command without data (simple or chunk).
    pub fn status_of(&mut self, cookie: u64) -> u32 {
        match self.reply() {
            Reply::Simple { errno, cookie: c } => {
                assert_eq!(c, cookie, "reply cookie");
                errno
            }
            Reply::Chunk {
                flags,
                ty,
                cookie: c,
                payload,
            } => {
                assert_eq!(c, cookie, "reply cookie");
                assert_eq!(flags & CHUNK_DONE, CHUNK_DONE);
                match ty {
                    0 => 0,
                    CHUNK_ERROR => error_chunk(&payload).0,
                    t => panic!("unexpected chunk type {t}"),
                }
            }
        }
    }

    pub fn cmd(&mut self, ty: u16, flags: u16, offset: u64, len: u32) -> u32 {
        let c = self.request(flags, ty, offset, len, &[]);
        self.status_of(c)
    }

    pub fn write(&mut self, offset: u64, data: &[u8]) -> u32 {
        self.write_flags(0, offset, data)
    }

    pub fn write_flags(&mut self, flags: u16, offset: u64, data: &[u8]) -> u32 {
        let c = self.request(flags, CMD_WRITE, offset, data.len() as u32, data);
        self.status_of(c)
    }

    /// READ in whichever reply mode was negotiated.
    pub fn read(&mut self, offset: u64, len: u32) -> Result<Vec<u8>, u32> {
        let c = self.request(0, CMD_READ, offset, len, &[]);
        self.read_reply(c, offset, len)
    }

    pub fn read_reply(&mut self, cookie: u64, offset: u64, len: u32) -> Result<Vec<u8>, u32> {
        if !self.structured {
            return match self.reply() {
                Reply::Simple { errno, cookie: c } => {
                    assert_eq!(c, cookie, "reply cookie");
                    if errno == 0 {
                        Ok(self.recv(len as usize))
                    } else {
                        Err(errno)
                    }
                }
                r => panic!("structured reply without negotiation: {r:?}"),
            };
        }
        let mut data = vec![0u8; len as usize];
        let mut covered = 0u64;
        let mut error = None;
        loop {
            let Reply::Chunk {
                flags,
                ty,
                cookie: c,
                payload,
            } = self.reply()
            else {
                panic!("simple reply to a structured READ");
            };
            assert_eq!(c, cookie, "chunk cookie");
            match ty {
                CHUNK_OFFSET_DATA => {
                    let at = u64::from_be_bytes(payload[..8].try_into().unwrap());
                    let n = payload.len() as u64 - 8;
                    assert!(at >= offset && at + n <= offset + len as u64);
                    let i = (at - offset) as usize;
                    data[i..i + n as usize].copy_from_slice(&payload[8..]);
                    covered += n;
                }
                CHUNK_OFFSET_HOLE => {
                    assert_eq!(payload.len(), 12, "OFFSET_HOLE length");
                    let at = u64::from_be_bytes(payload[..8].try_into().unwrap());
                    let n = u32::from_be_bytes(payload[8..].try_into().unwrap()) as u64;
                    assert!(n > 0 && at >= offset && at + n <= offset + len as u64);
                    let i = (at - offset) as usize;
                    data[i..i + n as usize].fill(0);
                    covered += n;
                }
                CHUNK_ERROR => error = Some(error_chunk(&payload).0),
                t => panic!("unexpected READ chunk type {t}"),
            }
            if flags & CHUNK_DONE != 0 {
                break;
            }
        }
        match error {
            Some(e) => Err(e),
            None => {
                assert_eq!(covered, len as u64, "READ chunks cover the request");
                Ok(data)
            }
        }
    }

    /// BLOCK_STATUS: descriptors of base:allocation, or the errno.
    pub fn block_status(
        &mut self,
        flags: u16,
        offset: u64,
        len: u32,
    ) -> Result<Vec<(u32, u32)>, u32> {
        let cookie = self.request(flags, CMD_BLOCK_STATUS, offset, len, &[]);
        match self.reply() {
            Reply::Simple { errno, cookie: c } => {
                assert_eq!(c, cookie);
                assert_ne!(errno, 0, "simple success to BLOCK_STATUS");
                Err(errno)
            }
            Reply::Chunk {
                flags,
                ty,
                cookie: c,
                payload,
            } => {
                assert_eq!(c, cookie);
                assert_eq!(flags, CHUNK_DONE, "one chunk, flagged DONE");
                match ty {
                    CHUNK_BLOCK_STATUS => {
                        assert!(payload.len() >= 12 && (payload.len() - 4) % 8 == 0);
                        let id = u32::from_be_bytes(payload[..4].try_into().unwrap());
                        assert_eq!(id, BASE_ALLOCATION_ID, "context id");
                        Ok(payload[4..]
                            .chunks(8)
                            .map(|d| {
                                (
                                    u32::from_be_bytes(d[..4].try_into().unwrap()),
                                    u32::from_be_bytes(d[4..].try_into().unwrap()),
                                )
                            })
                            .collect())
                    }
                    CHUNK_ERROR => Err(error_chunk(&payload).0),
                    t => panic!("unexpected BLOCK_STATUS chunk type {t}"),
                }
            }
        }
    }

    pub fn disc(&mut self) {
        self.request(0, CMD_DISC, 0, 0, &[]);
    }
}
