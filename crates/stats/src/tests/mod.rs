//! Tests of the stats crate, with a small in-memory device to wrap.

mod charts;
mod edges;
mod output;
mod workload;

use std::sync::{Arc, Barrier};

use parking_lot::Mutex;
use strata_block::{
    check_range, BlockDevice, BlockError, BlockResult, ErrorKind, Extent, ReadFill, ZeroOptions,
};

use crate::{DiskStats, StatsDevice};

/// A RAM disk. Reads can be made to wait on a barrier (to hold several
/// commands in flight at once) or to panic.
pub(crate) struct MemDisk {
    data: Mutex<Vec<u8>>,
    read_barrier: Option<Barrier>,
    panic_on_read: bool,
}

impl MemDisk {
    pub(crate) fn new(size_bytes: usize) -> Self {
        Self {
            data: Mutex::new(vec![0; size_bytes]),
            read_barrier: None,
            panic_on_read: false,
        }
    }

    pub(crate) fn with_read_barrier(mut self, parties: usize) -> Self {
        self.read_barrier = Some(Barrier::new(parties));
        self
    }

    pub(crate) fn panicking_on_read(mut self) -> Self {
        self.panic_on_read = true;
        self
    }

    fn range(&self, offset: u64, len: u64) -> BlockResult<std::ops::Range<usize>> {
        check_range(offset, len, self.size_bytes())?;
        Ok(offset as usize..(offset + len) as usize)
    }
}

impl BlockDevice for MemDisk {
    fn size_bytes(&self) -> u64 {
        self.data.lock().len() as u64
    }

    fn read_only(&self) -> bool {
        false
    }

    fn read_at(&self, buf: &mut [u8], offset_bytes: u64) -> BlockResult<ReadFill> {
        if self.panic_on_read {
            panic!("MemDisk told to panic");
        }
        if let Some(barrier) = &self.read_barrier {
            barrier.wait();
        }
        let r = self.range(offset_bytes, buf.len() as u64)?;
        buf.copy_from_slice(&self.data.lock()[r]);
        Ok(ReadFill::all_data(buf.len() as u64))
    }

    fn write_at(&self, buf: &[u8], offset_bytes: u64, _fua: bool) -> BlockResult<()> {
        let r = self.range(offset_bytes, buf.len() as u64)?;
        self.data.lock()[r].copy_from_slice(buf);
        Ok(())
    }

    fn flush(&self) -> BlockResult<()> {
        Ok(())
    }

    fn unmap(&self, offset_bytes: u64, len_bytes: u64) -> BlockResult<()> {
        let r = self.range(offset_bytes, len_bytes)?;
        self.data.lock()[r].fill(0);
        Ok(())
    }

    fn write_zeroes(
        &self,
        offset_bytes: u64,
        len_bytes: u64,
        opts: ZeroOptions,
    ) -> BlockResult<()> {
        if opts.fast_only {
            return Err(BlockError::new(ErrorKind::Unsupported, "no fast zero"));
        }
        self.unmap(offset_bytes, len_bytes)
    }

    fn block_status(&self, offset_bytes: u64, len_bytes: u64) -> BlockResult<Vec<Extent>> {
        self.range(offset_bytes, len_bytes)?;
        Ok(vec![Extent {
            len_bytes,
            hole: false,
            zero: false,
        }])
    }

    fn preferred_block_bytes(&self) -> u32 {
        512
    }
}

/// A fresh `DiskStats` and a `StatsDevice` over a RAM disk of `size_bytes`.
pub(crate) fn stats_over_mem(size_bytes: usize) -> (Arc<DiskStats>, StatsDevice) {
    let stats = Arc::new(DiskStats::new());
    let dev = StatsDevice::new(Arc::new(MemDisk::new(size_bytes)), Arc::clone(&stats));
    (stats, dev)
}

/// 1000 sequential 4 KiB writes from offset 0.
pub(crate) fn sequential_writes(dev: &dyn BlockDevice) {
    let buf = [0xa5u8; 4096];
    for i in 0..1000u64 {
        dev.write_at(&buf, i * 4096, false).unwrap();
    }
}
