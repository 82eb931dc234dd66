//! Ceph's `rbd diff` stream (v1 written, v1 and v2 read): the portable
//! format of `export-diff` / `import-diff` (docs/BACKUP.md). Layout, all
//! integers little-endian:
//!
//! - banner: the 12 bytes `rbd diff v1\n` (or `v2`);
//! - metadata, before any data: `f` u32 length + from-snapshot name, `t`
//!   u32 length + to-snapshot name, `s` u64 image size;
//! - data, ascending and not overlapping: `w` u64 offset, u64 length, the
//!   bytes; `z` u64 offset, u64 length (reads as zeros);
//! - `e`: the end.
//!
//! In v2 every record but `e` has a u64 length of what follows its tag
//! after the tag, so a reader skips tags it does not know. The reader
//! checks everything and says at which byte of the stream what is wrong;
//! it never trusts a length before checking it.

use std::io::{self, Read, Write};

use strata_engine::{Error, ErrorKind};

pub const BANNER_V1: &[u8; 12] = b"rbd diff v1\n";
pub const BANNER_V2: &[u8; 12] = b"rbd diff v2\n";
/// Longest snapshot name read.
const NAME_MAX: u32 = 4096;
/// Most bytes one `w` record is written with.
pub const WRITE_MAX: usize = 4 << 20;

/// Writes a v1 stream: header, then data in ascending order, then [`Writer::end`].
pub struct Writer<W: Write> {
    w: W,
    next: u64,
    size: u64,
    /// Bytes written, for progress.
    pub written: u64,
}

impl<W: Write> Writer<W> {
    pub fn new(mut w: W, from: Option<&str>, to: Option<&str>, size: u64) -> io::Result<Self> {
        let mut head = BANNER_V1.to_vec();
        for (tag, name) in [(b'f', from), (b't', to)] {
            if let Some(n) = name {
                head.push(tag);
                head.extend_from_slice(&(n.len() as u32).to_le_bytes());
                head.extend_from_slice(n.as_bytes());
            }
        }
        head.push(b's');
        head.extend_from_slice(&size.to_le_bytes());
        w.write_all(&head)?;
        Ok(Writer {
            w,
            next: 0,
            size,
            written: head.len() as u64,
        })
    }

    fn record(&mut self, tag: u8, offset: u64, len: u64) -> io::Result<()> {
        assert!(
            len > 0 && offset >= self.next && offset + len <= self.size,
            "records ascend within the image"
        );
        let mut b = [0u8; 17];
        b[0] = tag;
        b[1..9].copy_from_slice(&offset.to_le_bytes());
        b[9..].copy_from_slice(&len.to_le_bytes());
        self.w.write_all(&b)?;
        self.next = offset + len;
        self.written += 17;
        Ok(())
    }

    /// A `w` record of `data` at `offset`.
    pub fn data(&mut self, offset: u64, data: &[u8]) -> io::Result<()> {
        self.record(b'w', offset, data.len() as u64)?;
        self.w.write_all(data)?;
        self.written += data.len() as u64;
        Ok(())
    }

    /// A `z` record: `[offset, offset + len)` reads as zeros.
    pub fn zero(&mut self, offset: u64, len: u64) -> io::Result<()> {
        self.record(b'z', offset, len)
    }

    /// The `e` record; the writer's sink.
    pub fn end(mut self) -> io::Result<W> {
        self.w.write_all(b"e")?;
        self.w.flush()?;
        Ok(self.w)
    }
}

/// A stream's metadata.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Header {
    pub version: u8,
    pub from: Option<String>,
    pub to: Option<String>,
    pub size: Option<u64>,
}

/// One data record; a `Data` record's bytes are read next with
/// [`Reader::read_data`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Record {
    Data { offset: u64, len: u64 },
    Zero { offset: u64, len: u64 },
    End,
}

/// Reads and checks a stream.
pub struct Reader<R: Read> {
    r: R,
    /// What the errors name as the stream (its file).
    name: String,
    at: u64,
    v2: bool,
    size: Option<u64>,
    /// End of the last data record: the next must start here or later.
    next: u64,
    /// Bytes of the current `w` record not read yet.
    pending: u64,
    /// The first data tag, read while looking for the end of the header.
    peeked: Option<u8>,
    ended: bool,
}

impl<R: Read> Reader<R> {
    /// Read the banner and the metadata records of stream `name`.
    pub fn open(r: R, name: &str) -> Result<(Self, Header), Error> {
        let mut rd = Reader {
            r,
            name: name.to_string(),
            at: 0,
            v2: false,
            size: None,
            next: 0,
            pending: 0,
            peeked: None,
            ended: false,
        };
        let mut banner = [0u8; 12];
        rd.exact(&mut banner, "the banner")?;
        let version = match &banner {
            b if b == BANNER_V1 => 1,
            b if b == BANNER_V2 => 2,
            _ => {
                return Err(rd.bad(
                    0,
                    "not an rbd diff stream (it must start with \"rbd diff v1\\n\" or v2)",
                ))
            }
        };
        rd.v2 = version == 2;
        let mut h = Header {
            version,
            ..Default::default()
        };
        loop {
            let start = rd.at;
            let tag = rd.u8("a record tag")?;
            match tag {
                b'f' | b't' => {
                    let field = if tag == b'f' { &mut h.from } else { &mut h.to };
                    if field.is_some() {
                        return Err(rd.bad(start, &format!("a second '{}' record", tag as char)));
                    }
                    *field = Some(rd.snapshot_name(start)?);
                }
                b's' => {
                    if h.size.is_some() {
                        return Err(rd.bad(start, "a second 's' record"));
                    }
                    if rd.v2 {
                        rd.u64("a record length")?;
                    }
                    h.size = Some(rd.u64("the image size")?);
                }
                b'w' | b'z' | b'e' => {
                    rd.peeked = Some(tag);
                    rd.size = h.size;
                    return Ok((rd, h));
                }
                other if rd.v2 => {
                    // v2: a tag this reader does not know is skipped.
                    let n = rd.u64("a record length")?;
                    rd.skip(n, &format!("record '{}'", other as char))?;
                }
                other => return Err(rd.bad(start, &format!("unknown record tag 0x{other:02x}"))),
            }
        }
    }

    /// The next data record (after the previous `w` record's bytes were
    /// read), or `End` once, after which the stream must end.
    pub fn record(&mut self) -> Result<Record, Error> {
        if self.pending > 0 {
            return Err(self.bad(self.at, "the data of the last 'w' record was not read"));
        }
        if self.ended {
            return Ok(Record::End);
        }
        loop {
            let start = self.at;
            let tag = match self.peeked.take() {
                Some(t) => t,
                None => self.u8("a record tag (the stream has no 'e' record)")?,
            };
            match tag {
                b'w' | b'z' => {
                    let framed = if self.v2 {
                        Some(self.u64("a record length")?)
                    } else {
                        None
                    };
                    let offset = self.u64("a record offset")?;
                    let len = self.u64("a record length")?;
                    if let Some(n) = framed {
                        // v2: what follows the tag is 16 bytes, and the
                        // data of a `w` record.
                        let want = if tag == b'w' {
                            len.checked_add(16)
                        } else {
                            Some(16)
                        };
                        if want != Some(n) {
                            return Err(self.bad(start, &format!("a record length of {n}")));
                        }
                    }
                    self.check_range(start, tag, offset, len)?;
                    self.next = offset + len;
                    return Ok(if tag == b'w' {
                        self.pending = len;
                        Record::Data { offset, len }
                    } else {
                        Record::Zero { offset, len }
                    });
                }
                b'e' => {
                    self.ended = true;
                    let mut one = [0u8; 1];
                    return match self.r.read(&mut one) {
                        Ok(0) => Ok(Record::End),
                        Ok(_) => Err(self.bad(self.at + 1, "data after the end record")),
                        Err(e) => Err(self.io(e)),
                    };
                }
                b'f' | b't' | b's' => {
                    return Err(self.bad(
                        start,
                        &format!("a '{}' record after data records", tag as char),
                    ))
                }
                other if self.v2 => {
                    let n = self.u64("a record length")?;
                    self.skip(n, &format!("record '{}'", other as char))?;
                }
                other => return Err(self.bad(start, &format!("unknown record tag 0x{other:02x}"))),
            }
        }
    }

    /// Read the next `buf.len()` bytes of the current `w` record.
    pub fn read_data(&mut self, buf: &mut [u8]) -> Result<(), Error> {
        if buf.len() as u64 > self.pending {
            return Err(self.bad(self.at, "reading past a 'w' record's data"));
        }
        self.exact(buf, "the data of a 'w' record")?;
        self.pending -= buf.len() as u64;
        Ok(())
    }

    /// Bytes of the stream read so far.
    pub fn position(&self) -> u64 {
        self.at
    }

    fn check_range(&self, start: u64, tag: u8, offset: u64, len: u64) -> Result<(), Error> {
        let t = tag as char;
        if len == 0 {
            return Err(self.bad(start, &format!("a '{t}' record of length 0")));
        }
        let Some(end) = offset.checked_add(len) else {
            return Err(self.bad(start, &format!("a '{t}' record past 2^64")));
        };
        if offset < self.next {
            return Err(self.bad(
                start,
                &format!(
                    "records out of order: '{t}' at offset {offset}, before the end of the \
                     previous one ({})",
                    self.next
                ),
            ));
        }
        if let Some(size) = self.size {
            if end > size {
                return Err(self.bad(
                    start,
                    &format!("a '{t}' record ends at {end}, past the image size {size}"),
                ));
            }
        }
        Ok(())
    }

    /// The rest of an `f` or `t` record that started at byte `start`: its
    /// snapshot name.
    fn snapshot_name(&mut self, start: u64) -> Result<String, Error> {
        if self.v2 {
            self.u64("a record length")?;
        }
        let n = self.u32("a name length")?;
        if n > NAME_MAX {
            return Err(self.bad(start, &format!("a snapshot name of {n} bytes")));
        }
        let mut b = vec![0u8; n as usize];
        self.exact(&mut b, "a snapshot name")?;
        String::from_utf8(b).map_err(|_| self.bad(start, "a snapshot name that is not UTF-8"))
    }

    /// What is wrong with the stream's content, at byte `at` of it.
    fn bad(&self, at: u64, what: &str) -> Error {
        Error::new(ErrorKind::InvalidArgument, what)
            .at(self.name.clone())
            .offset(at)
    }

    /// The stream itself failed (not its content).
    fn io(&self, e: io::Error) -> Error {
        Error::new(ErrorKind::Io, "reading the stream")
            .at(self.name.clone())
            .offset(self.at)
            .caused_by(e)
    }

    fn exact(&mut self, buf: &mut [u8], what: &str) -> Result<(), Error> {
        let mut got = 0;
        while got < buf.len() {
            match self.r.read(&mut buf[got..]) {
                Ok(0) => {
                    return Err(self.bad(
                        self.at + got as u64,
                        &format!("truncated: the stream ends inside {what}"),
                    ))
                }
                Ok(n) => got += n,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) => return Err(self.io(e)),
            }
        }
        self.at += buf.len() as u64;
        Ok(())
    }

    fn skip(&mut self, mut n: u64, what: &str) -> Result<(), Error> {
        let mut b = [0u8; 8192];
        while n > 0 {
            let k = n.min(b.len() as u64) as usize;
            self.exact(&mut b[..k], what)?;
            n -= k as u64;
        }
        Ok(())
    }

    fn u8(&mut self, what: &str) -> Result<u8, Error> {
        let mut b = [0u8; 1];
        self.exact(&mut b, what)?;
        Ok(b[0])
    }

    fn u32(&mut self, what: &str) -> Result<u32, Error> {
        let mut b = [0u8; 4];
        self.exact(&mut b, what)?;
        Ok(u32::from_le_bytes(b))
    }

    fn u64(&mut self, what: &str) -> Result<u64, Error> {
        let mut b = [0u8; 8];
        self.exact(&mut b, what)?;
        Ok(u64::from_le_bytes(b))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sample() -> Vec<u8> {
        let mut w = Writer::new(Vec::new(), Some("s1"), Some("s2"), 1 << 20).unwrap();
        w.data(4096, &[7u8; 8192]).unwrap();
        w.zero(65536, 4096).unwrap();
        w.end().unwrap()
    }

    /// The byte of the stream an error names.
    fn at(e: &Error) -> u64 {
        e.place.offset.expect("an offset")
    }

    fn read_all(b: &[u8]) -> Result<(Header, Vec<Record>), Error> {
        let (mut r, h) = Reader::open(b, "s")?;
        let mut out = Vec::new();
        loop {
            let rec = r.record()?;
            out.push(rec);
            match rec {
                Record::Data { len, .. } => {
                    let mut buf = vec![0u8; len as usize];
                    r.read_data(&mut buf)?;
                }
                Record::End => return Ok((h, out)),
                Record::Zero { .. } => {}
            }
        }
    }

    #[test]
    fn a_written_stream_reads_back_byte_for_byte_as_the_spec_lays_it_out() {
        let b = sample();
        // The layout, by hand: banner, f, t, s, w, data, z, e.
        let mut want = b"rbd diff v1\n".to_vec();
        want.extend_from_slice(b"f\x02\0\0\0s1t\x02\0\0\0s2s");
        want.extend_from_slice(&(1u64 << 20).to_le_bytes());
        want.push(b'w');
        want.extend_from_slice(&4096u64.to_le_bytes());
        want.extend_from_slice(&8192u64.to_le_bytes());
        want.extend_from_slice(&[7u8; 8192]);
        want.push(b'z');
        want.extend_from_slice(&65536u64.to_le_bytes());
        want.extend_from_slice(&4096u64.to_le_bytes());
        want.push(b'e');
        assert_eq!(b, want);
        let (h, recs) = read_all(&b).unwrap();
        assert_eq!(
            h,
            Header {
                version: 1,
                from: Some("s1".into()),
                to: Some("s2".into()),
                size: Some(1 << 20)
            }
        );
        assert_eq!(
            recs,
            [
                Record::Data {
                    offset: 4096,
                    len: 8192
                },
                Record::Zero {
                    offset: 65536,
                    len: 4096
                },
                Record::End
            ]
        );
    }

    #[test]
    fn every_damage_is_refused_with_its_byte_offset() {
        let b = sample();
        // Truncated anywhere: refused, never a clean end.
        for cut in 0..b.len() {
            let e = read_all(&b[..cut]).unwrap_err();
            assert!(e.message.contains("truncated"), "cut {cut}: {e}");
            assert!(at(&e) <= cut as u64, "cut {cut}: {e}");
        }
        // A bad banner; an unknown tag; a trailing byte.
        let mut x = b.clone();
        x[5] = b'X';
        assert_eq!(at(&read_all(&x).unwrap_err()), 0);
        let data_at = 12 + 7 + 7 + 9;
        let mut x = b.clone();
        x[data_at] = b'q';
        let e = read_all(&x).unwrap_err();
        assert_eq!(at(&e), data_at as u64, "{e}");
        assert!(e.message.contains("unknown record tag 0x71"), "{e}");
        let mut x = b.clone();
        x.push(0);
        assert!(read_all(&x).unwrap_err().message.contains("after the end"));
        // Out of order: the z record moved before the w record's end.
        let mut x = b.clone();
        let z_at = data_at + 17 + 8192;
        x[z_at + 1..z_at + 9].copy_from_slice(&8192u64.to_le_bytes());
        let e = read_all(&x).unwrap_err();
        assert_eq!(at(&e), z_at as u64);
        assert!(e.message.contains("out of order"), "{e}");
        // Past the image size, and a length of zero.
        let mut x = b.clone();
        x[z_at + 1..z_at + 9].copy_from_slice(&(1u64 << 20).to_le_bytes());
        assert!(read_all(&x)
            .unwrap_err()
            .message
            .contains("past the image size"));
        let mut x = b.clone();
        x[z_at + 9..z_at + 17].copy_from_slice(&0u64.to_le_bytes());
        assert!(read_all(&x).unwrap_err().message.contains("length 0"));
        // A huge name length is refused before anything is allocated.
        let mut x = b.clone();
        x[13..17].copy_from_slice(&u32::MAX.to_le_bytes());
        assert!(read_all(&x)
            .unwrap_err()
            .message
            .contains("snapshot name of"));
    }

    #[test]
    fn v2_streams_are_read_and_unknown_records_skipped() {
        let mut b = b"rbd diff v2\n".to_vec();
        b.push(b't');
        b.extend_from_slice(&(4u64 + 2).to_le_bytes());
        b.extend_from_slice(&2u32.to_le_bytes());
        b.extend_from_slice(b"s9");
        b.push(b's');
        b.extend_from_slice(&8u64.to_le_bytes());
        b.extend_from_slice(&65536u64.to_le_bytes());
        // An unknown record of 3 bytes.
        b.push(b'Q');
        b.extend_from_slice(&3u64.to_le_bytes());
        b.extend_from_slice(b"abc");
        b.push(b'w');
        b.extend_from_slice(&(16u64 + 4).to_le_bytes());
        b.extend_from_slice(&0u64.to_le_bytes());
        b.extend_from_slice(&4u64.to_le_bytes());
        b.extend_from_slice(b"data");
        b.push(b'e');
        let (h, recs) = read_all(&b).unwrap();
        assert_eq!(
            (h.version, h.to.as_deref(), h.size),
            (2, Some("s9"), Some(65536))
        );
        assert_eq!(recs, [Record::Data { offset: 0, len: 4 }, Record::End]);
    }
}
