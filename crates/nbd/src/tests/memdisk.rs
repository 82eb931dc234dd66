//! An in-memory block device for the tests: bytes behind a mutex, a map of
//! allocated 4 KiB blocks for block status, a log of what it was asked, and
//! a gate that can hold reads of one offset until the test releases them.

use std::sync::Arc;

use parking_lot::{Condvar, Mutex};
use strata_block::{
    check_range, BlockDevice, BlockError, BlockResult, ErrorKind, Extent, Fill, ReadFill,
    ZeroOptions,
};

pub const BLOCK: u64 = 4096;

/// A call the device received, for tests that check flags get through.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Call {
    Write {
        offset: u64,
        len: u64,
        fua: bool,
    },
    Flush,
    Unmap {
        offset: u64,
        len: u64,
    },
    Zero {
        offset: u64,
        len: u64,
        opts: ZeroOptions,
    },
}

#[derive(Default)]
struct GateState {
    /// Reads at `offset` wait while this is true.
    closed: bool,
    offset: u64,
    /// Reads currently held.
    waiting: usize,
}

#[derive(Default)]
pub struct Gate {
    state: Mutex<GateState>,
    changed: Condvar,
}

impl Gate {
    /// Hold every read of `offset` until [`open`](Self::open).
    pub fn close_at(&self, offset: u64) {
        let mut g = self.state.lock();
        g.closed = true;
        g.offset = offset;
    }

    pub fn open(&self) {
        self.state.lock().closed = false;
        self.changed.notify_all();
    }

    /// Wait until `n` reads are held at the gate.
    pub fn wait_for_held(&self, n: usize) {
        let mut g = self.state.lock();
        while g.waiting < n {
            self.changed.wait(&mut g);
        }
    }

    fn pass(&self, offset: u64) {
        let mut g = self.state.lock();
        if !g.closed || g.offset != offset {
            return;
        }
        g.waiting += 1;
        self.changed.notify_all();
        while g.closed {
            self.changed.wait(&mut g);
        }
        g.waiting -= 1;
    }
}

struct Store {
    bytes: Vec<u8>,
    allocated: Vec<bool>,
}

pub struct MemDisk {
    store: Mutex<Store>,
    read_only: bool,
    fast_zero: bool,
    /// Reads at this offset panic.
    panic_at: Option<u64>,
    /// block_status ignores the requested length (a sloppy device).
    sloppy_status: bool,
    pub calls: Mutex<Vec<Call>>,
    /// read_at and block_status calls received (whatever their outcome
    /// after the range check).
    pub reads: Mutex<u64>,
    pub statuses: Mutex<u64>,
    pub gate: Gate,
}

impl MemDisk {
    pub fn new(size: u64) -> MemDisk {
        let blocks = size.div_ceil(BLOCK) as usize;
        MemDisk {
            store: Mutex::new(Store {
                bytes: vec![0; size as usize],
                allocated: vec![false; blocks],
            }),
            read_only: false,
            fast_zero: true,
            panic_at: None,
            sloppy_status: false,
            calls: Mutex::new(Vec::new()),
            reads: Mutex::new(0),
            statuses: Mutex::new(0),
            gate: Gate::default(),
        }
    }

    pub fn read_only(mut self) -> Self {
        self.read_only = true;
        self
    }

    pub fn without_fast_zero(mut self) -> Self {
        self.fast_zero = false;
        self
    }

    pub fn panicking_at(mut self, offset: u64) -> Self {
        self.panic_at = Some(offset);
        self
    }

    pub fn sloppy_status(mut self) -> Self {
        self.sloppy_status = true;
        self
    }

    pub fn arc(self) -> Arc<MemDisk> {
        Arc::new(self)
    }

    /// Fill a range directly, bypassing the server.
    pub fn fill(&self, offset: u64, data: &[u8]) {
        let mut s = self.store.lock();
        s.bytes[offset as usize..offset as usize + data.len()].copy_from_slice(data);
        mark(&mut s.allocated, offset, data.len() as u64, true, false);
    }

    pub fn contents(&self, offset: u64, len: usize) -> Vec<u8> {
        self.store.lock().bytes[offset as usize..offset as usize + len].to_vec()
    }

    pub fn take_calls(&self) -> Vec<Call> {
        std::mem::take(&mut *self.calls.lock())
    }

    fn check(&self, offset: u64, len: u64, write: bool) -> BlockResult<()> {
        if write && self.read_only {
            return Err(BlockError::new(ErrorKind::ReadOnly, "memdisk"));
        }
        check_range(offset, len, self.size_bytes())
    }

    fn deallocate(&self, offset: u64, len: u64) {
        let mut s = self.store.lock();
        s.bytes[offset as usize..(offset + len) as usize].fill(0);
        mark(&mut s.allocated, offset, len, false, true);
    }
}

/// Set the allocation of the blocks `[offset, offset+len)` touches; when
/// `whole_only`, only blocks it covers entirely.
fn mark(allocated: &mut [bool], offset: u64, len: u64, value: bool, whole_only: bool) {
    if len == 0 {
        return;
    }
    let (first, end) = if whole_only {
        (offset.div_ceil(BLOCK), (offset + len) / BLOCK)
    } else {
        (offset / BLOCK, (offset + len).div_ceil(BLOCK))
    };
    for b in first..end {
        allocated[b as usize] = value;
    }
}

impl BlockDevice for MemDisk {
    fn size_bytes(&self) -> u64 {
        self.store.lock().bytes.len() as u64
    }

    fn read_only(&self) -> bool {
        self.read_only
    }

    fn read_at(&self, buf: &mut [u8], offset: u64) -> BlockResult<ReadFill> {
        self.check(offset, buf.len() as u64, false)?;
        if self.panic_at == Some(offset) {
            panic!("memdisk told to panic at {offset}");
        }
        self.gate.pass(offset);
        *self.reads.lock() += 1;
        let s = self.store.lock();
        buf.copy_from_slice(&s.bytes[offset as usize..offset as usize + buf.len()]);
        // Unallocated blocks are holes (what block_status reports).
        let mut fill = ReadFill::new();
        let end = offset + buf.len() as u64;
        let mut at = offset;
        while at < end {
            let block = at / BLOCK;
            let next = ((block + 1) * BLOCK).min(end);
            let hole = !s.allocated[block as usize];
            fill.push(next - at, if hole { Fill::Zeros } else { Fill::Data });
            at = next;
        }
        Ok(fill)
    }

    fn write_at(&self, buf: &[u8], offset: u64, fua: bool) -> BlockResult<()> {
        self.check(offset, buf.len() as u64, true)?;
        self.calls.lock().push(Call::Write {
            offset,
            len: buf.len() as u64,
            fua,
        });
        self.fill(offset, buf);
        Ok(())
    }

    fn flush(&self) -> BlockResult<()> {
        self.calls.lock().push(Call::Flush);
        Ok(())
    }

    fn unmap(&self, offset: u64, len: u64) -> BlockResult<()> {
        self.check(offset, len, true)?;
        self.calls.lock().push(Call::Unmap { offset, len });
        self.deallocate(offset, len);
        Ok(())
    }

    fn write_zeroes(&self, offset: u64, len: u64, opts: ZeroOptions) -> BlockResult<()> {
        self.check(offset, len, true)?;
        self.calls.lock().push(Call::Zero { offset, len, opts });
        if opts.fast_only && !self.fast_zero {
            return Err(BlockError::new(ErrorKind::Unsupported, "no fast zero here"));
        }
        if opts.may_unmap {
            self.deallocate(offset, len);
        } else {
            let mut s = self.store.lock();
            s.bytes[offset as usize..(offset + len) as usize].fill(0);
            mark(&mut s.allocated, offset, len, true, false);
        }
        Ok(())
    }

    fn block_status(&self, offset: u64, len: u64) -> BlockResult<Vec<Extent>> {
        self.check(offset, len, false)?;
        *self.statuses.lock() += 1;
        let s = self.store.lock();
        if self.sloppy_status {
            // Wrong on purpose: one extent far longer than asked.
            return Ok(vec![Extent {
                len_bytes: u64::MAX / 2,
                hole: false,
                zero: false,
            }]);
        }
        let end = offset + len;
        let mut out: Vec<Extent> = Vec::new();
        let mut at = offset;
        while at < end {
            let block = at / BLOCK;
            let next = ((block + 1) * BLOCK).min(end);
            let hole = !s.allocated[block as usize];
            match out.last_mut() {
                Some(last) if last.hole == hole => last.len_bytes += next - at,
                _ => out.push(Extent {
                    len_bytes: next - at,
                    hole,
                    zero: hole,
                }),
            }
            at = next;
        }
        Ok(out)
    }
}
