//! The recording [`BlockDevice`] wrapper.

use std::sync::Arc;

use strata_block::{BlockDevice, BlockResult, Extent, IoHold, Planned, ReadFill, ZeroOptions};

use strata_api::stats::Op;

use crate::disk::{Command, DiskStats};

/// A planned read's command, finished when the read is over.
struct Recording(Command<Arc<DiskStats>>);

impl IoHold for Recording {
    fn done(self: Box<Self>, ok: bool) -> bool {
        self.0.finish(ok);
        ok
    }
}

/// A [`BlockDevice`] that forwards every call to `inner` and records it in
/// `stats`.
///
/// Give each client connection its own `StatsDevice` over the same inner
/// device and the same `Arc<DiskStats>`: the statistics are per disk.
/// `size_bytes`, `read_only` and `preferred_block_bytes` are forwarded
/// without being recorded, and so is everything while recording is paused
/// ([`DiskStats::set_recording`]).
pub struct StatsDevice {
    inner: Arc<dyn BlockDevice>,
    stats: Arc<DiskStats>,
}

impl StatsDevice {
    /// A plan of the inner device, with a command recorded until the plan
    /// is finished (a failed planning is recorded as a failed command).
    fn recorded(
        &self,
        op: Op,
        offset_bytes: u64,
        len: u64,
        planned: Option<BlockResult<Planned>>,
    ) -> Option<BlockResult<Planned>> {
        if !self.stats.recording() {
            return planned;
        }
        match planned {
            Some(Ok(Planned::Plan(mut plan))) => {
                let command = self.stats.begin_owned(op, offset_bytes, len);
                plan.holds.push(Box::new(Recording(command)));
                Some(Ok(Planned::Plan(plan)))
            }
            Some(Err(e)) => {
                self.stats.begin(op, offset_bytes, len).finish(false);
                Some(Err(e))
            }
            other => other,
        }
    }

    pub fn new(inner: Arc<dyn BlockDevice>, stats: Arc<DiskStats>) -> Self {
        Self { inner, stats }
    }

    /// The wrapped device.
    pub fn inner(&self) -> &Arc<dyn BlockDevice> {
        &self.inner
    }

    /// Where the calls are recorded.
    pub fn stats(&self) -> &Arc<DiskStats> {
        &self.stats
    }

    #[inline]
    fn record<T>(
        &self,
        op: Op,
        offset_bytes: u64,
        len_bytes: u64,
        call: impl FnOnce(&dyn BlockDevice) -> BlockResult<T>,
    ) -> BlockResult<T> {
        let result = if !self.stats.recording() {
            call(&*self.inner)
        } else {
            let command = self.stats.begin(op, offset_bytes, len_bytes);
            let result = call(&*self.inner);
            command.finish(result.is_ok());
            result
        };
        if result.is_ok() && matches!(op, Op::Write | Op::Unmap | Op::WriteZeroes) {
            self.stats.note_change();
        }
        result
    }
}

impl std::fmt::Debug for StatsDevice {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("StatsDevice")
            .field("size_bytes", &self.inner.size_bytes())
            .field("in_flight", &self.stats.in_flight())
            .finish_non_exhaustive()
    }
}

impl BlockDevice for StatsDevice {
    fn size_bytes(&self) -> u64 {
        self.inner.size_bytes()
    }

    fn read_only(&self) -> bool {
        self.inner.read_only()
    }

    fn read_at(&self, buf: &mut [u8], offset_bytes: u64) -> BlockResult<ReadFill> {
        self.record(Op::Read, offset_bytes, buf.len() as u64, |d| {
            d.read_at(buf, offset_bytes)
        })
    }

    fn write_at(&self, buf: &[u8], offset_bytes: u64, fua: bool) -> BlockResult<()> {
        self.record(Op::Write, offset_bytes, buf.len() as u64, |d| {
            d.write_at(buf, offset_bytes, fua)
        })
    }

    /// One read command, forwarded whole (the inner device may do better
    /// than the default bounce buffer).
    fn readv_at(&self, bufs: &mut [&mut [u8]], offset_bytes: u64) -> BlockResult<ReadFill> {
        let len: usize = bufs.iter().map(|b| b.len()).sum();
        self.record(Op::Read, offset_bytes, len as u64, |d| {
            d.readv_at(bufs, offset_bytes)
        })
    }

    /// One write command, forwarded whole.
    fn writev_at(&self, bufs: &[&[u8]], offset_bytes: u64, fua: bool) -> BlockResult<()> {
        let len: usize = bufs.iter().map(|b| b.len()).sum();
        self.record(Op::Write, offset_bytes, len as u64, |d| {
            d.writev_at(bufs, offset_bytes, fua)
        })
    }

    fn flush(&self) -> BlockResult<()> {
        self.record(Op::Flush, 0, 0, |d| d.flush())
    }

    fn unmap(&self, offset_bytes: u64, len_bytes: u64) -> BlockResult<()> {
        self.record(Op::Unmap, offset_bytes, len_bytes, |d| {
            d.unmap(offset_bytes, len_bytes)
        })
    }

    fn write_zeroes(
        &self,
        offset_bytes: u64,
        len_bytes: u64,
        opts: ZeroOptions,
    ) -> BlockResult<()> {
        self.record(Op::WriteZeroes, offset_bytes, len_bytes, |d| {
            d.write_zeroes(offset_bytes, len_bytes, opts)
        })
    }

    fn block_status(&self, offset_bytes: u64, len_bytes: u64) -> BlockResult<Vec<Extent>> {
        self.record(Op::BlockStatus, offset_bytes, len_bytes, |d| {
            d.block_status(offset_bytes, len_bytes)
        })
    }

    fn preferred_block_bytes(&self) -> u32 {
        self.inner.preferred_block_bytes()
    }

    /// Recorded from the end of the planning (a map lookup) to the end of
    /// the read. A device that does not plan, or is busy, records nothing:
    /// the caller then reads with `read_at` or asks again.
    fn plan_read(
        &self,
        buf: &mut [u8],
        offset_bytes: u64,
        wait: bool,
    ) -> Option<BlockResult<Planned>> {
        let planned = self.inner.plan_read(buf, offset_bytes, wait);
        self.recorded(Op::Read, offset_bytes, buf.len() as u64, planned)
    }

    /// As `plan_read`: from the end of the planning to the end of the write.
    fn plan_write(
        &self,
        buf: &[u8],
        offset_bytes: u64,
        wait: bool,
    ) -> Option<BlockResult<Planned>> {
        let planned = self.inner.plan_write(buf, offset_bytes, wait);
        // Noted as it is planned (it lands unless its I/O fails): a disk
        // written through the ring is as changed as one written by call
        // (`--compress-interval` asks which disks went unchanged).
        if let Some(Ok(Planned::Plan(_))) = &planned {
            self.stats.note_change();
        }
        self.recorded(Op::Write, offset_bytes, buf.len() as u64, planned)
    }

    /// Forwarded, not counted: a hint is no command of the client's.
    fn prefetch(&self, offset_bytes: u64, len_bytes: u64) {
        self.inner.prefetch(offset_bytes, len_bytes)
    }
}
