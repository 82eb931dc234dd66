//! Replies: simple and structured, the chunks of a READ (data and
//! holes), error chunks, all written whole under the connection's
//! output lock.

use super::*;

/// Header of an OFFSET_DATA chunk carrying `len` bytes read at `offset`.
fn data_chunk_header(out: &mut [u8], flags: u16, cookie: u64, offset: u64, len: u32) {
    chunk_header(out, flags, CHUNK_OFFSET_DATA, cookie, 8 + len);
    out[CHUNK_HEADER_BYTES..DATA_CHUNK_HEADER_BYTES].copy_from_slice(&offset.to_be_bytes());
}

/// The chunks of a structured READ reply of `len` bytes, in order, as
/// `(range in the buffer, is a hole)`: each `Zeros` run of at least
/// [`HOLE_CHUNK_MIN`] becomes a hole, everything between is data. A fill
/// that does not cover exactly the buffer (a device breaking its contract)
/// is not trusted: the reply is then all data, which is always correct.
fn read_chunks(fill: &ReadFill, len: u64) -> Vec<(Range<u64>, bool)> {
    if fill.len_bytes() != len {
        tracing::warn!(
            "NBD: the device described {} bytes of a {len}-byte read; sending it all as data",
            fill.len_bytes()
        );
        return vec![(0..len, false)];
    }
    let mut chunks: Vec<(Range<u64>, bool)> = Vec::new();
    for (range, f) in fill.runs() {
        let hole = f == Fill::Zeros && range.end - range.start >= HOLE_CHUNK_MIN;
        match chunks.last_mut() {
            Some((last, false)) if !hole => last.end = range.end,
            _ => chunks.push((range, hole)),
        }
    }
    chunks
}

impl<S: NbdStream> Conn<S> {
    /// Write one whole reply.
    pub(super) fn send(&self, buf: &[u8]) -> io::Result<()> {
        self.out.lock().write_all(buf)
    }

    /// Write one whole reply made of `parts` (headers and data buffers),
    /// with as few `writev` calls as the socket allows.
    fn send_parts(&self, mut parts: &mut [IoSlice<'_>]) -> io::Result<()> {
        let mut out = self.out.lock();
        IoSlice::advance_slices(&mut parts, 0);
        while !parts.is_empty() {
            match out.write_vectored(parts) {
                Ok(0) => return Err(io::ErrorKind::WriteZero.into()),
                Ok(n) => IoSlice::advance_slices(&mut parts, n),
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) => return Err(e),
            }
        }
        Ok(())
    }

    pub(super) fn mark_broken(&self, e: &io::Error) {
        if !self.broken.swap(true, Ordering::Relaxed) {
            tracing::debug!("NBD: cannot write a reply, dropping the connection: {e}");
            // Wake the reader, which may be blocked on the socket.
            let _ = self.out.lock().shutdown_stream(Shutdown::Both);
        }
    }

    pub(super) fn reply_ok(&self, req: &Request) -> io::Result<()> {
        let mut b = [0u8; SIMPLE_REPLY_BYTES];
        simple_reply(&mut b, 0, req.cookie);
        self.send(&b)
    }

    /// An error reply: an ERROR chunk with a message once structured
    /// replies are on (required for READ, preferred for the rest).
    pub(super) fn reply_error(&self, req: &Request, errno: u32, msg: &str) -> io::Result<()> {
        if !self.structured {
            let mut b = [0u8; SIMPLE_REPLY_BYTES];
            simple_reply(&mut b, errno, req.cookie);
            return self.send(&b);
        }
        let msg = truncate_utf8(msg, ERROR_MESSAGE_MAX).as_bytes();
        let mut b = vec![0u8; CHUNK_HEADER_BYTES + 6 + msg.len()];
        chunk_header(
            &mut b,
            CHUNK_DONE,
            CHUNK_ERROR,
            req.cookie,
            6 + msg.len() as u32,
        );
        b[20..24].copy_from_slice(&errno.to_be_bytes());
        b[24..26].copy_from_slice(&(msg.len() as u16).to_be_bytes());
        b[26..].copy_from_slice(msg);
        self.send(&b)
    }

    pub(super) fn reply_result(&self, req: &Request, r: Result<(), BlockError>) -> io::Result<()> {
        match r {
            Ok(()) => self.reply_ok(req),
            Err(e) => self.reply_error(req, errno_of(&e), &e.to_string()),
        }
    }

    pub(super) fn send_read(&self, req: &Request, data: &[u8], fill: &ReadFill) -> io::Result<()> {
        if !self.structured {
            let mut head = [0u8; SIMPLE_REPLY_BYTES];
            simple_reply(&mut head, 0, req.cookie);
            return self.send_parts(&mut [IoSlice::new(&head), IoSlice::new(data)]);
        }
        let holes = req.flags & FLAG_DF == 0 && req.len >= HOLE_READ_MIN;
        if !holes || fill.is_all(Fill::Data) {
            let mut head = [0u8; DATA_CHUNK_HEADER_BYTES];
            data_chunk_header(&mut head, CHUNK_DONE, req.cookie, req.offset, req.len);
            return self.send_parts(&mut [IoSlice::new(&head), IoSlice::new(data)]);
        }
        let chunks = read_chunks(fill, data.len() as u64);
        // Every header first (a hole chunk's is its whole chunk), then the
        // slices that interleave them with the data.
        let mut heads = vec![0u8; chunks.len() * HOLE_CHUNK_BYTES];
        let mut at = 0;
        for (i, (range, hole)) in chunks.iter().enumerate() {
            let flags = if i + 1 == chunks.len() { CHUNK_DONE } else { 0 };
            let offset = req.offset + range.start;
            // Chunks lie inside the u32 request length.
            let len = (range.end - range.start) as u32;
            if *hole {
                let b = &mut heads[at..at + HOLE_CHUNK_BYTES];
                chunk_header(b, flags, CHUNK_OFFSET_HOLE, req.cookie, 12);
                b[CHUNK_HEADER_BYTES..CHUNK_HEADER_BYTES + 8]
                    .copy_from_slice(&offset.to_be_bytes());
                b[CHUNK_HEADER_BYTES + 8..].copy_from_slice(&len.to_be_bytes());
                at += HOLE_CHUNK_BYTES;
            } else {
                let b = &mut heads[at..at + DATA_CHUNK_HEADER_BYTES];
                data_chunk_header(b, flags, req.cookie, offset, len);
                at += DATA_CHUNK_HEADER_BYTES;
            }
        }
        let mut parts = Vec::with_capacity(chunks.len() * 2);
        let mut rest = &heads[..];
        for (range, hole) in &chunks {
            let n = if *hole {
                HOLE_CHUNK_BYTES
            } else {
                DATA_CHUNK_HEADER_BYTES
            };
            let (head, tail) = rest.split_at(n);
            rest = tail;
            parts.push(IoSlice::new(head));
            if !hole {
                parts.push(IoSlice::new(
                    &data[range.start as usize..range.end as usize],
                ));
            }
        }
        self.send_parts(&mut parts)
    }
}
