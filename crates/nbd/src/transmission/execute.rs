//! Checking and carrying out a request on the device: validation of a
//! request's command, flags and range, each command on a worker (or the
//! reader), the byte-granular variants, read-ahead, and BLOCK_STATUS.

use super::*;

impl<S: NbdStream> Conn<S> {
    /// Check a request before it is queued: `Err((errno, message))`.
    pub(super) fn validate(&self, r: &Request) -> Result<(), (u32, String)> {
        fn fail(errno: u32, msg: &str) -> Result<(), (u32, String)> {
            Err((errno, msg.to_string()))
        }
        if r.flags & !FLAGS_KNOWN != 0 {
            return fail(EINVAL, "unknown command flags");
        }
        let writes = matches!(r.ty, CMD_WRITE | CMD_TRIM | CMD_WRITE_ZEROES);
        match r.ty {
            CMD_READ | CMD_WRITE | CMD_TRIM | CMD_WRITE_ZEROES | CMD_CACHE | CMD_BLOCK_STATUS
            | CMD_FLUSH => {}
            _ => return fail(EINVAL, "unknown command"),
        }
        self.check_flags(r.ty, r.flags)?;
        if r.ty == CMD_FLUSH {
            return Ok(());
        }
        if writes && self.dev.read_only() {
            return fail(EPERM, "the export is read-only");
        }
        if r.ty == CMD_BLOCK_STATUS && self.contexts.is_empty() {
            return fail(EINVAL, "no metadata context was negotiated");
        }
        if r.len == 0 {
            return fail(EINVAL, "zero-length request");
        }
        if matches!(r.ty, CMD_READ | CMD_WRITE) && r.len > self.max_request {
            // EOVERFLOW is the protocol's answer for a READ only.
            let errno = if r.ty == CMD_READ { EOVERFLOW } else { EINVAL };
            return fail(errno, "request longer than the maximum block size");
        }
        self.check_extent(r)
    }

    /// Whether command flags `flags` go with command `ty`: FUA with any
    /// command, each other flag with one (clients must not send it
    /// elsewhere; qemu-nbd refuses it too). `Err` names the strays.
    fn check_flags(&self, ty: u16, flags: u16) -> Result<(), (u32, String)> {
        let valid = FLAG_FUA
            | match ty {
                CMD_READ if self.structured => FLAG_DF,
                CMD_WRITE_ZEROES => FLAG_NO_HOLE | FLAG_FAST_ZERO,
                CMD_BLOCK_STATUS => FLAG_REQ_ONE,
                _ => 0,
            };
        match flags & !valid {
            0 => Ok(()),
            stray => Err((
                EINVAL,
                format!("command flags {stray:#x} do not apply to this command"),
            )),
        }
    }

    /// Whether `r` lies inside the export, on sector boundaries unless
    /// the client is byte-granular. A write past the end is out of
    /// space (ENOSPC), anything else invalid.
    fn check_extent(&self, r: &Request) -> Result<(), (u32, String)> {
        let (len, size) = (r.len as u64, self.dev.size_bytes());
        let checked = match self.bytes {
            Some(_) => strata_block::check_extent(r.offset, len, size),
            None => check_range(r.offset, len, size),
        };
        checked.map_err(|e| {
            let errno = match (e.kind, r.ty) {
                (strata_block::ErrorKind::OutOfRange, CMD_WRITE | CMD_WRITE_ZEROES) => ENOSPC,
                _ => EINVAL,
            };
            (errno, e.to_string())
        })
    }

    /// The byte-level view of the device for a byte-granular client.
    fn byte_io<'a>(&'a self, lock: &'a RwLock<()>) -> ByteIo<'a> {
        ByteIo {
            dev: &*self.dev,
            lock,
        }
    }

    /// Run a validated request and send its reply. `Err` only when the
    /// reply could not be written.
    pub(super) fn execute(&self, req: &Request, payload: AlignedBuf) -> io::Result<()> {
        if let Some(lock) = &self.bytes {
            if let Some(r) = self.execute_bytes(req, &payload, lock) {
                self.recycle(payload);
                return r;
            }
        }
        let dev = &*self.dev;
        let fua = req.flags & FLAG_FUA != 0;
        let len = req.len as usize;
        match req.ty {
            CMD_READ => self.read(req),
            CMD_WRITE => {
                let r = dev.write_at(&payload[..len], req.offset, fua);
                self.recycle(payload);
                self.reply_result(req, r)
            }
            CMD_FLUSH => self.reply_result(req, dev.flush()),
            CMD_TRIM => {
                let r = dev.unmap(req.offset, req.len as u64);
                self.reply_result(req, flush_if_fua(dev, req, r))
            }
            CMD_WRITE_ZEROES => {
                let r = dev.write_zeroes(req.offset, req.len as u64, zero_options(req));
                self.reply_result(req, r)
            }
            CMD_CACHE => {
                dev.prefetch(req.offset, req.len as u64);
                self.reply_ok(req)
            }
            CMD_BLOCK_STATUS => self.block_status(req),
            // validate() let nothing else through.
            _ => self.reply_error(req, EINVAL, "unknown command"),
        }
    }

    /// For a byte-granular client, what differs from [`Conn::execute`]:
    /// writes, trims and zeroes under its export's lock (a write that
    /// cuts a sector by read-modify-write), misaligned reads through a
    /// bounce buffer, misaligned CACHE and BLOCK_STATUS rounded out to
    /// sectors. None: served as any other request.
    fn execute_bytes(
        &self,
        req: &Request,
        payload: &AlignedBuf,
        lock: &RwLock<()>,
    ) -> Option<io::Result<()>> {
        let io = self.byte_io(lock);
        let dev = &*self.dev;
        let (off, len) = (req.offset, req.len as u64);
        let r = match req.ty {
            CMD_WRITE => io.write(&payload[..len as usize], off, req.flags & FLAG_FUA != 0),
            CMD_TRIM => {
                // Only whole sectors are released; the edges keep their
                // bytes (a trim promises nothing about what reads back).
                let (from, to) = (bytes::up(off), bytes::down(off + len));
                let r = if from < to {
                    let _shared = lock.read();
                    dev.unmap(from, to - from)
                } else {
                    Ok(())
                };
                flush_if_fua(dev, req, r)
            }
            CMD_WRITE_ZEROES => {
                // Durable once all of it is done, edges included.
                let opts = ZeroOptions {
                    fua: false,
                    ..zero_options(req)
                };
                let r = io.zero(off, len, &|d, o, l| d.write_zeroes(o, l, opts));
                flush_if_fua(dev, req, r)
            }
            _ if bytes::aligned(off, len) => return None,
            CMD_READ => {
                let mut data = self.take_buffer(len as usize);
                let r = match io.read(&mut data, off) {
                    Ok(()) => self.send_read(req, &data, &ReadFill::all_data(len)),
                    Err(e) => self.reply_error(req, errno_of(&e), &e.to_string()),
                };
                self.recycle(data);
                return Some(r);
            }
            CMD_CACHE => {
                let from = bytes::down(off);
                dev.prefetch(from, bytes::up(off + len) - from);
                Ok(())
            }
            CMD_BLOCK_STATUS => return Some(self.block_status(req)),
            _ => return None,
        };
        Some(self.reply_result(req, r))
    }

    /// Read-ahead along what the client was told it reads next.
    pub(super) fn read_ahead(&self, req: &Request) {
        if self.guide.is_some() {
            let hints = self.plan.lock().on_read(req.offset, req.len as u64);
            if !hints.is_empty() {
                let mut p = self.prefetcher.lock();
                if p.is_none() {
                    *p = Prefetcher::start(self.dev.clone());
                }
                for (offset, len) in hints {
                    if let Some(p) = &*p {
                        p.hint(offset, len);
                    }
                }
            }
        }
    }

    /// READ: one pass over the device, which fills a page-aligned buffer
    /// and says where the holes are; the reply (header(s) and data) goes
    /// out in one vectored write.
    fn read(&self, req: &Request) -> io::Result<()> {
        self.read_ahead(req);
        let mut data = self.take_buffer(req.len as usize);
        let result = match self.dev.read_at(&mut data, req.offset) {
            Ok(fill) => self.send_read(req, &data, &fill),
            Err(e) => self.reply_error(req, errno_of(&e), &e.to_string()),
        };
        self.recycle(data);
        result
    }

    /// BLOCK_STATUS: one chunk per selected context (the last one marked
    /// done), each with neighbouring runs of equal flags merged, nothing
    /// past the requested range, one descriptor only with REQ_ONE. Every
    /// context is asked before anything is sent, so a failure is one error
    /// reply.
    fn block_status(&self, req: &Request) -> io::Result<()> {
        // A byte-granular client's range, rounded out to sectors for the
        // device; what lies before its offset is cut off the runs.
        let from = bytes::down(req.offset);
        let (skip, span) = (
            req.offset - from,
            bytes::up(req.offset + req.len as u64) - from,
        );
        let mut chunks = Vec::with_capacity(self.contexts.len());
        for (id, ctx) in &self.contexts {
            let runs = match ctx {
                Context::Allocation => match self.dev.block_status(from, span) {
                    Ok(extents) => extents
                        .iter()
                        .map(|x| {
                            let flags = if x.hole { STATE_HOLE } else { 0 }
                                | if x.zero { STATE_ZERO } else { 0 };
                            (x.len_bytes, flags)
                        })
                        .collect(),
                    Err(e) => return self.reply_error(req, errno_of(&e), &e.to_string()),
                },
                Context::Other(c) => match c.extents(from, span) {
                    Ok(runs) => runs,
                    Err(e) => return self.reply_error(req, EIO, &e.to_string()),
                },
            };
            let runs = skip_runs(runs, skip);
            let descs = descriptors(&runs, req.len as u64, req.flags & FLAG_REQ_ONE != 0);
            if descs.is_empty() {
                return self.reply_error(req, EIO, "the device reported no extent");
            }
            if let Some((_, next)) = self.guide.filter(|g| g.0 == *id) {
                let read_next = |flags: u32| match next {
                    Some(bits) => flags & bits != 0,
                    None => flags & (STATE_HOLE | STATE_ZERO) == 0,
                };
                let runs = descs.iter().map(|&(l, f)| (l as u64, read_next(f)));
                self.plan.lock().announced(req.offset, runs);
            }
            chunks.push((*id, descs));
        }
        let mut b = Vec::new();
        let n = chunks.len();
        for (i, (id, descs)) in chunks.into_iter().enumerate() {
            let payload = 4 + 8 * descs.len();
            let at = b.len();
            b.resize(at + CHUNK_HEADER_BYTES, 0);
            chunk_header(
                &mut b[at..],
                if i + 1 == n { CHUNK_DONE } else { 0 },
                CHUNK_BLOCK_STATUS,
                req.cookie,
                payload as u32,
            );
            b.extend_from_slice(&id.to_be_bytes());
            for (len, flags) in descs {
                b.extend_from_slice(&len.to_be_bytes());
                b.extend_from_slice(&flags.to_be_bytes());
            }
        }
        self.send(&b)
    }
}

/// What a WRITE_ZEROES request's flags ask of the device.
fn zero_options(req: &Request) -> ZeroOptions {
    ZeroOptions {
        may_unmap: req.flags & FLAG_NO_HOLE == 0,
        fast_only: req.flags & FLAG_FAST_ZERO != 0,
        fua: req.flags & FLAG_FUA != 0,
    }
}

/// `r`, then a flush of `dev` if it succeeded and `req` has FUA.
fn flush_if_fua(
    dev: &dyn BlockDevice,
    req: &Request,
    r: Result<(), BlockError>,
) -> Result<(), BlockError> {
    match r {
        Ok(()) if req.flags & FLAG_FUA != 0 => dev.flush(),
        r => r,
    }
}

/// `runs` of `(length, flags)` without their first `skip` bytes.
fn skip_runs(mut runs: Vec<(u64, u32)>, mut skip: u64) -> Vec<(u64, u32)> {
    if skip == 0 {
        return runs;
    }
    runs.retain_mut(|(len, _)| {
        let cut = skip.min(*len);
        *len -= cut;
        skip -= cut;
        *len > 0
    });
    runs
}

/// A BLOCK_STATUS chunk's descriptors from runs of `(length, flags)`:
/// equal neighbours merged, at most `len` bytes in all, one descriptor
/// only if `one` (REQ_ONE), at most [`DESCRIPTORS_MAX`].
fn descriptors(runs: &[(u64, u32)], len: u64, one: bool) -> Vec<(u32, u32)> {
    let mut descs: Vec<(u32, u32)> = Vec::with_capacity(runs.len().min(1024));
    let mut left = len;
    for &(run, flags) in runs {
        if left == 0 {
            break;
        }
        let n = run.min(left);
        if n == 0 {
            continue;
        }
        left -= n;
        // `n` fits: the total never exceeds the u32 request length.
        match descs.last_mut() {
            Some(last) if last.1 == flags => last.0 += n as u32,
            _ => {
                if (one && !descs.is_empty()) || descs.len() >= DESCRIPTORS_MAX {
                    break;
                }
                descs.push((n as u32, flags));
            }
        }
    }
    descs
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn descriptors_merge_cut_and_honour_req_one() {
        let runs = [(4096, 1), (4096, 1), (8192, 0), (1 << 20, 1)];
        assert_eq!(
            descriptors(&runs, 1 << 30, false),
            [(8192, 1), (8192, 0), (1 << 20, 1)]
        );
        assert_eq!(descriptors(&runs, 12288, false), [(8192, 1), (4096, 0)]);
        assert_eq!(descriptors(&runs, 1 << 30, true), [(8192, 1)]);
        assert!(descriptors(&[(0, 1)], 4096, false).is_empty());
    }
}
