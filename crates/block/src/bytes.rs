//! Byte-granular I/O on a sector-granular [`BlockDevice`].
//!
//! A file read or written through FUSE, or a request of an NBD client
//! that did not agree to the server's block sizes, may start and end
//! anywhere; the device takes only whole 512-byte sectors. Aligned requests go straight
//! to the device. An unaligned write reads the partial first and last
//! sectors into an aligned bounce buffer, lays the new bytes over them and
//! writes the whole sectors back (read-modify-write).
//!
//! Two writes that share a sector must not both read the old sector and
//! each write back its own copy: the second would undo the first. So every
//! write takes the file's lock: shared for an aligned write (it reads
//! nothing, and aligned writes to one sector are ordinary overlapping
//! writes), exclusive for a read-modify-write (no other write may land in
//! its sectors between its read and its write). Reads take no lock. The
//! lock orders the writes of those who take it: one per exported file
//! for FUSE, one per export for NBD's byte-granular clients (NBD clients
//! that agreed to 512-byte blocks, whose writes are always whole sectors,
//! do not take it).
//!
//! Callers clamp requests to the device size first; the device size is a
//! multiple of 512, so rounding out to whole sectors never passes the end.

use crate::{AlignedBuf, BlockDevice, BlockResult, ZeroOptions, SECTOR_BYTES};
use parking_lot::RwLock;

const S: u64 = SECTOR_BYTES;

/// `x` rounded down to a sector boundary.
pub fn down(x: u64) -> u64 {
    x - x % S
}

/// `x` rounded up to a sector boundary.
pub fn up(x: u64) -> u64 {
    down(x + S - 1)
}

/// Whether `[off, off+len)` is whole sectors.
pub fn aligned(off: u64, len: u64) -> bool {
    off.is_multiple_of(S) && len.is_multiple_of(S)
}

/// The byte-level view of one device, with the lock that orders its
/// read-modify-writes (one lock per exported file, shared by its handles).
pub struct ByteIo<'a> {
    pub dev: &'a dyn BlockDevice,
    pub lock: &'a RwLock<()>,
}

impl ByteIo<'_> {
    /// Fill `buf` from `off`. The range must lie within the device.
    pub fn read(&self, buf: &mut [u8], off: u64) -> BlockResult<()> {
        let len = buf.len() as u64;
        if len == 0 {
            return Ok(());
        }
        if aligned(off, len) {
            self.dev.read_at(buf, off)?;
            return Ok(());
        }
        let start = down(off);
        let end = up(off + len);
        let mut bounce = AlignedBuf::zeroed((end - start) as usize);
        self.dev.read_at(&mut bounce, start)?;
        let at = (off - start) as usize;
        buf.copy_from_slice(&bounce[at..at + buf.len()]);
        Ok(())
    }

    /// Write `data` at `off`; durable before returning when `fua`. The range
    /// must lie within the device.
    pub fn write(&self, data: &[u8], off: u64, fua: bool) -> BlockResult<()> {
        let len = data.len() as u64;
        if len == 0 {
            return Ok(());
        }
        if aligned(off, len) {
            let _shared = self.lock.read();
            return self.dev.write_at(data, off, fua);
        }
        let _excl = self.lock.write();
        let start = down(off);
        let end = up(off + len);
        let mut bounce = AlignedBuf::zeroed((end - start) as usize);
        self.fill_edges(&mut bounce, start, off, off + len)?;
        let at = (off - start) as usize;
        bounce[at..at + data.len()].copy_from_slice(data);
        self.dev.write_at(&bounce, start, fua)
    }

    /// Make `[off, off+len)` read as zeros: whole sectors inside the range
    /// go to `whole` (unmap or write_zeroes), partial sectors at its edges
    /// get zeros by read-modify-write. The range must lie within the device.
    pub fn zero(
        &self,
        off: u64,
        len: u64,
        whole: &dyn Fn(&dyn BlockDevice, u64, u64) -> BlockResult<()>,
    ) -> BlockResult<()> {
        if len == 0 {
            return Ok(());
        }
        let end = off + len;
        let inner_start = up(off);
        let inner_end = down(end);
        if inner_start >= inner_end {
            // Within one sector, or across one sector boundary: no whole
            // sector inside, just zero bytes.
            return self.write(&vec![0u8; len as usize], off, false);
        }
        if off < inner_start {
            self.write(&vec![0u8; (inner_start - off) as usize], off, false)?;
        }
        {
            let _shared = self.lock.read();
            whole(self.dev, inner_start, inner_end - inner_start)?;
        }
        if inner_end < end {
            self.write(&vec![0u8; (end - inner_end) as usize], inner_end, false)?;
        }
        Ok(())
    }

    /// Read into `bounce` (covering `[start, start+bounce.len())`) the
    /// sectors that `[from, to)` covers only in part.
    fn fill_edges(&self, bounce: &mut [u8], start: u64, from: u64, to: u64) -> BlockResult<()> {
        let end = start + bounce.len() as u64;
        let head = !from.is_multiple_of(S);
        let tail = !to.is_multiple_of(S);
        if head {
            self.dev.read_at(&mut bounce[..S as usize], start)?;
        }
        // The last sector, unless it is the first one and was read above.
        if tail && !(head && end - start == S) {
            let at = bounce.len() - S as usize;
            self.dev.read_at(&mut bounce[at..], end - S)?;
        }
        Ok(())
    }
}

/// Zero whole sectors by unmapping them (`fallocate(PUNCH_HOLE)`).
pub fn unmap_whole(dev: &dyn BlockDevice, off: u64, len: u64) -> BlockResult<()> {
    dev.unmap(off, len)
}

/// Zero whole sectors with `write_zeroes` (`fallocate(ZERO_RANGE)`).
pub fn write_zeroes_whole(dev: &dyn BlockDevice, off: u64, len: u64) -> BlockResult<()> {
    dev.write_zeroes(off, len, ZeroOptions::default())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{check_range, Extent, Fill, ReadFill};
    use parking_lot::Mutex;
    use rand::{Rng, SeedableRng};
    use std::sync::atomic::{AtomicU64, Ordering};
    use std::sync::Arc;

    /// A RAM device that enforces the sector rule, counts unmaps, and can
    /// be slowed between the read and the write of a read-modify-write (to
    /// widen the window a missing lock would lose data in).
    struct Mem {
        data: Mutex<Vec<u8>>,
        unmapped: AtomicU64,
        slow_reads: bool,
    }

    impl Mem {
        fn new(size: usize) -> Mem {
            Mem {
                data: Mutex::new((0..size).map(|i| (i * 7 % 253) as u8).collect()),
                unmapped: AtomicU64::new(0),
                slow_reads: false,
            }
        }
    }

    impl BlockDevice for Mem {
        fn size_bytes(&self) -> u64 {
            self.data.lock().len() as u64
        }
        fn read_only(&self) -> bool {
            false
        }
        fn read_at(&self, buf: &mut [u8], off: u64) -> BlockResult<ReadFill> {
            check_range(off, buf.len() as u64, self.size_bytes())?;
            let d = self.data.lock();
            buf.copy_from_slice(&d[off as usize..off as usize + buf.len()]);
            drop(d);
            if self.slow_reads {
                std::thread::yield_now();
                std::thread::sleep(std::time::Duration::from_micros(50));
            }
            let mut f = ReadFill::new();
            f.push(buf.len() as u64, Fill::Data);
            Ok(f)
        }
        fn write_at(&self, buf: &[u8], off: u64, _fua: bool) -> BlockResult<()> {
            check_range(off, buf.len() as u64, self.size_bytes())?;
            self.data.lock()[off as usize..off as usize + buf.len()].copy_from_slice(buf);
            Ok(())
        }
        fn flush(&self) -> BlockResult<()> {
            Ok(())
        }
        fn unmap(&self, off: u64, len: u64) -> BlockResult<()> {
            check_range(off, len, self.size_bytes())?;
            self.data.lock()[off as usize..(off + len) as usize].fill(0);
            self.unmapped.fetch_add(len, Ordering::Relaxed);
            Ok(())
        }
        fn write_zeroes(&self, off: u64, len: u64, _: ZeroOptions) -> BlockResult<()> {
            check_range(off, len, self.size_bytes())?;
            self.data.lock()[off as usize..(off + len) as usize].fill(0);
            Ok(())
        }
        fn block_status(&self, _: u64, len_bytes: u64) -> BlockResult<Vec<Extent>> {
            Ok(vec![Extent {
                len_bytes,
                hole: false,
                zero: false,
            }])
        }
    }

    #[test]
    fn random_unaligned_io_matches_a_byte_array() {
        let size = 16 * 1024;
        let dev = Mem::new(size);
        let lock = RwLock::new(());
        let io = ByteIo {
            dev: &dev,
            lock: &lock,
        };
        let mut model: Vec<u8> = dev.data.lock().clone();
        let mut rng = rand::rngs::StdRng::seed_from_u64(11);
        for round in 0..3000 {
            let off = rng.gen_range(0..size);
            let len = rng.gen_range(0..=(size - off).min(3000));
            match rng.gen_range(0..4) {
                0 => {
                    let mut buf = vec![0xeeu8; len];
                    io.read(&mut buf, off as u64).unwrap();
                    assert_eq!(buf, model[off..off + len], "round {round} read {off}+{len}");
                }
                1 | 2 => {
                    let data: Vec<u8> = (0..len).map(|_| rng.gen()).collect();
                    io.write(&data, off as u64, false).unwrap();
                    model[off..off + len].copy_from_slice(&data);
                }
                _ => {
                    io.zero(off as u64, len as u64, &unmap_whole).unwrap();
                    model[off..off + len].fill(0);
                }
            }
        }
        assert_eq!(*dev.data.lock(), model);
    }

    #[test]
    fn edge_cases_single_sector_and_boundaries() {
        let dev = Mem::new(4096);
        let lock = RwLock::new(());
        let io = ByteIo {
            dev: &dev,
            lock: &lock,
        };
        let before = dev.data.lock().clone();
        // One byte in the middle of a sector.
        io.write(&[0xab], 700, false).unwrap();
        // Across one boundary without a whole sector inside.
        io.write(&[1, 2, 3, 4], 1022, false).unwrap();
        // Last byte of the device.
        io.write(&[9], 4095, false).unwrap();
        let mut want = before.clone();
        want[700] = 0xab;
        want[1022..1026].copy_from_slice(&[1, 2, 3, 4]);
        want[4095] = 9;
        assert_eq!(*dev.data.lock(), want);
        let mut b = [0u8; 3];
        io.read(&mut b, 4093).unwrap();
        assert_eq!(b, want[4093..]);
        // Zero: partial head, whole sectors unmapped, partial tail.
        io.zero(100, 2000, &unmap_whole).unwrap();
        want[100..2100].fill(0);
        assert_eq!(*dev.data.lock(), want);
        assert_eq!(dev.unmapped.load(Ordering::Relaxed), 1536);
        // A zero range with no whole sector inside unmaps nothing.
        io.zero(3000, 10, &unmap_whole).unwrap();
        assert_eq!(dev.unmapped.load(Ordering::Relaxed), 1536);
    }

    #[test]
    fn device_errors_come_back_and_touch_nothing() {
        let dev = Mem::new(1024);
        let lock = RwLock::new(());
        let io = ByteIo {
            dev: &dev,
            lock: &lock,
        };
        // Callers clamp; if they did not, the device refuses, nothing panics.
        assert!(io.write(&[1, 2], 1023, false).is_err());
        let mut b = [0u8; 10];
        assert!(io.read(&mut b, 1020).is_err());
        assert_eq!(*dev.data.lock(), Mem::new(1024).data.into_inner());
    }

    #[test]
    fn concurrent_unaligned_writes_to_one_sector_lose_nothing() {
        // Each thread owns some bytes of the same two sectors and writes them
        // one at a time, unaligned: every write is a read-modify-write of a
        // sector the other threads write too. Without the exclusive lock a
        // thread writes back a stale copy of the others' bytes.
        let dev = Arc::new(Mem {
            slow_reads: true,
            ..Mem::new(4096)
        });
        let lock = Arc::new(RwLock::new(()));
        let threads = 4;
        let hs: Vec<_> = (0..threads)
            .map(|t| {
                let dev = dev.clone();
                let lock = lock.clone();
                std::thread::spawn(move || {
                    let io = ByteIo {
                        dev: &*dev,
                        lock: &lock,
                    };
                    for round in 1..=20u8 {
                        for i in (t..1024).step_by(threads * 16) {
                            io.write(&[round, round], 256 + i as u64, false).unwrap();
                        }
                    }
                })
            })
            .collect();
        for h in hs {
            h.join().unwrap();
        }
        let d = dev.data.lock();
        for t in 0..threads {
            for i in (t..1024).step_by(threads * 16) {
                assert_eq!(d[256 + i], 20, "byte {} of thread {t} lost", 256 + i);
            }
        }
    }
}
