//! The disk as a [`BlockDevice`]: requests checked, then answered by the
//! read, write and commit paths.

use super::read::LeafCursor;
use super::*;

impl BlockDevice for ObjectDisk {
    fn size_bytes(&self) -> u64 {
        match &self.snapshot {
            Some(s) => s.size_bytes,
            None => self.state.lock().unwrap().man.size_bytes,
        }
    }

    fn read_only(&self) -> bool {
        self.read_only
    }

    fn read_at(&self, buf: &mut [u8], offset: u64) -> BlockResult<ReadFill> {
        check_range(offset, buf.len() as u64, self.size_bytes())?;
        self.throttle.admit(buf.len() as u64);
        self.refresh_if_stale();
        let first = offset / G;
        let end = (offset + buf.len() as u64).div_ceil(G);
        let read = |buf: &mut [u8]| {
            if offset.is_multiple_of(G) && buf.len().is_multiple_of(GRAIN) {
                self.read_grains(first, buf)
            } else {
                let mut tmp = vec![0u8; ((end - first) * G) as usize];
                self.read_grains(first, &mut tmp)?;
                let skip = (offset - first * G) as usize;
                buf.copy_from_slice(&tmp[skip..skip + buf.len()]);
                Ok(())
            }
        };
        match read(buf) {
            // Rule 5: what an older manifest named was collected; the
            // newest one names where it is now.
            Err(e) if e.kind == ErrorKind::NotFound && self.refresh_now() => read(buf)?,
            r => r?,
        }
        Ok(ReadFill::all_data(buf.len() as u64))
    }

    fn write_at(&self, buf: &[u8], offset: u64, fua: bool) -> BlockResult<()> {
        self.refuse_if_read_only()?;
        check_range(offset, buf.len() as u64, self.size_bytes())?;
        self.throttle.admit(buf.len() as u64);
        self.write_bytes(buf, offset)?;
        if fua {
            self.flush()?;
        }
        Ok(())
    }

    fn flush(&self) -> BlockResult<()> {
        if self.read_only {
            return Ok(());
        }
        // A fenced disk's commit fails with the fencing message.
        self.commit()
    }

    fn unmap(&self, offset: u64, len: u64) -> BlockResult<()> {
        self.refuse_if_read_only()?;
        check_range(offset, len, self.size_bytes())?;
        self.throttle.admit(0);
        // Only whole grains are released; a partial grain keeps its data
        // (unmap is advisory).
        let first = offset.div_ceil(G);
        let end = (offset + len) / G;
        if first < end {
            self.ensure_owner(false)?;
            self.put_grains((first..end).map(|vg| (vg, None)).collect())?;
        }
        Ok(())
    }

    /// Zeros are holes here whatever `may_unmap` says (FORMAT.md §11.4a: a
    /// commit stores no zero grain), and an object store has no space to
    /// provision ahead. `fast_only` refuses only a partial grain over data.
    fn write_zeroes(&self, offset: u64, len: u64, opts: ZeroOptions) -> BlockResult<()> {
        self.refuse_if_read_only()?;
        check_range(offset, len, self.size_bytes())?;
        self.throttle.admit(0);
        if opts.fast_only {
            if let Some(why) = self.slow_zeroing(offset, len)? {
                return Err(BlockError::new(
                    BErr::Unsupported,
                    format!("'{}': no fast zeroing here: {why}", self.name),
                ));
            }
        }
        self.zero_bytes(offset, len)?;
        if opts.fua {
            self.flush()?;
        }
        Ok(())
    }

    fn block_status(&self, offset: u64, len: u64) -> BlockResult<Vec<Extent>> {
        check_range(offset, len, self.size_bytes())?;
        let (overlay, man) = {
            let st = self.state.lock().unwrap();
            (
                self.overlay(&st, offset / G..(offset + len).div_ceil(G)),
                st.man.clone(),
            )
        };
        let (root, levels) = self.root(&man);
        let mut out: Vec<Extent> = Vec::new();
        let mut at = offset;
        let end = offset + len;
        let mut cur = LeafCursor::default();
        while at < end {
            let vg = at / G;
            let next = ((vg + 1) * G).min(end);
            let present = match overlay.get(&vg) {
                Some(p) => *p,
                None => self.lookup_at(&mut cur, root, levels, vg)?.is_some(),
            };
            let piece = next - at;
            match out.last_mut() {
                Some(l) if l.hole != present => l.len_bytes += piece,
                _ => out.push(Extent {
                    len_bytes: piece,
                    hole: !present,
                    zero: !present,
                }),
            }
            at = next;
        }
        Ok(out)
    }
}

impl ObjectDisk {
    /// A write, unmap or zeroing of a read-only open (a snapshot, a disk
    /// served read-only) is refused, naming the disk.
    fn refuse_if_read_only(&self) -> BlockResult<()> {
        if self.read_only {
            return Err(BlockError::new(
                BErr::ReadOnly,
                format!("'{}' is read-only", self.name),
            ));
        }
        Ok(())
    }
}
