//! Hot sets (docs/FORMAT.md §11.5b): where the data a disk's writer read
//! most is now, recorded in the store so that the next host to serve the
//! disk fetches those objects before its clients ask.

use std::sync::atomic::AtomicBool;
use std::sync::atomic::AtomicU64;
use std::sync::atomic::Ordering::{AcqRel, Relaxed, Release};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use serde::{Deserialize, Serialize};
use strata_s3::{Bytes, ObjectStore};

use crate::envelope;
use crate::layout::SegId;
use crate::{now_ms, Error, ErrorKind, Result};

const MAGIC_HOT: &[u8; 8] = b"STRHOT01";
/// Segments a hot set names at most.
pub const HOT_MAX: usize = 16384;
/// A writer records its hot set this often while its reads change.
pub const HOT_EVERY: Duration = Duration::from_secs(300);

/// One segment of a hot set and the reads it served.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct HotSeg {
    pub seg: SegId,
    pub reads: u64,
}

/// `disks/ID8/h/SEQ16`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct HotSet {
    pub disk: u32,
    pub seq: u64,
    pub written_ms: u64,
    pub host: String,
    pub segments: Vec<HotSeg>,
}

impl HotSet {
    /// The hot set `host` writes of `disk` at manifest `seq`: the
    /// [`HOT_MAX`] heaviest of `segments`, heaviest first.
    pub fn new(disk: u32, seq: u64, host: &str, mut segments: Vec<HotSeg>) -> HotSet {
        segments.sort_by(|a, b| b.reads.cmp(&a.reads).then(a.seg.cmp(&b.seg)));
        segments.truncate(HOT_MAX);
        HotSet {
            disk,
            seq,
            written_ms: now_ms(),
            host: host.to_string(),
            segments,
        }
    }
}

pub fn hot_dir(disk: u32) -> String {
    format!("disks/{disk:08x}/h/")
}

pub fn hot_key(disk: u32, seq: u64) -> String {
    format!("{}{seq:016x}", hot_dir(disk))
}

/// The disk and sequence of a hot set's key.
pub fn hot_of_key(key: &str) -> Option<(u32, u64)> {
    let rest = key.strip_prefix("disks/")?;
    let (disk, seq) = rest.split_once("/h/")?;
    if disk.len() != 8 || seq.len() != 16 {
        return None;
    }
    Some((
        u32::from_str_radix(disk, 16).ok()?,
        u64::from_str_radix(seq, 16).ok()?,
    ))
}

/// Regions a disk's reads are counted in at most: a region is 1 MiB, or
/// larger on a disk of more than 4 GiB.
const REGIONS_MAX: u64 = 4096;
/// The smallest region, in grains (1 MiB).
const REGION_MIN_GRAINS: u64 = 256;

/// A handle's reads per region of its virtual disk (§11.5b: where the
/// data read is *now* is looked up when a record is written, so data
/// rewritten or compacted since it was read is named where it went), and
/// when its hot set was last recorded.
pub struct Reads {
    /// A region is `1 << shift` grains.
    shift: u32,
    regions: Box<[AtomicU64]>,
    /// The manifest sequence and the read total of the last record.
    recorded: Mutex<Option<(u64, u64, Instant)>>,
    /// A background record is under way.
    recording: AtomicBool,
}

impl Reads {
    /// Counts for a disk of `grains` grains (a disk extended later counts
    /// its new grains in its last region).
    pub fn new(grains: u64) -> Self {
        let mut shift = REGION_MIN_GRAINS.trailing_zeros();
        while grains.div_ceil(1 << shift) > REGIONS_MAX {
            shift += 1;
        }
        let n = grains.div_ceil(1 << shift).max(1);
        Reads {
            shift,
            regions: (0..n).map(|_| AtomicU64::new(0)).collect(),
            recorded: Mutex::new(None),
            recording: AtomicBool::new(false),
        }
    }

    /// A region's grains, as a power of two.
    pub fn shift(&self) -> u32 {
        self.shift
    }

    /// `n` grains read from grain `first` on.
    pub fn count(&self, first: u64, n: u64) {
        let last = self.regions.len() - 1;
        let mut vg = first;
        let end = first + n;
        while vg < end {
            let r = (vg >> self.shift) as usize;
            let next = ((vg >> self.shift) + 1) << self.shift;
            let here = next.min(end) - vg;
            self.regions[r.min(last)].fetch_add(here, Relaxed);
            vg += here;
        }
    }

    /// The regions read, the most read first: their grains and reads.
    pub fn hottest(&self) -> Vec<(std::ops::Range<u64>, u64)> {
        let mut v: Vec<_> = self
            .regions
            .iter()
            .enumerate()
            .filter_map(|(i, c)| {
                let reads = c.load(Relaxed);
                let first = (i as u64) << self.shift;
                (reads > 0).then_some((first..first + (1 << self.shift), reads))
            })
            .collect();
        v.sort_by(|a, b| b.1.cmp(&a.1).then(a.0.start.cmp(&b.0.start)));
        v
    }

    /// Start a background record: false if one is under way.
    pub fn begin(&self) -> bool {
        !self.recording.swap(true, AcqRel)
    }

    /// The background record has ended.
    pub fn end(&self) {
        self.recording.store(false, Release);
    }

    /// Whether a periodic record is due.
    pub fn due(&self) -> bool {
        match *self.recorded.lock().unwrap() {
            None => self.total() > 0,
            Some((_, total, at)) => at.elapsed() >= HOT_EVERY && self.total() != total,
        }
    }

    /// Grains read so far.
    pub fn total(&self) -> u64 {
        self.regions.iter().map(|c| c.load(Relaxed)).sum()
    }

    /// Whether a record at manifest `seq` would say nothing new (nothing
    /// read, or nothing read or committed since the last one).
    pub fn unchanged(&self, seq: u64) -> bool {
        let total = self.total();
        total == 0
            || self
                .recorded
                .lock()
                .unwrap()
                .is_some_and(|(s, t, _)| s == seq && t == total)
    }

    /// Write hot set `h` (create-only; a key already there is left
    /// alone). `total` is [`Self::total`] when its segments were found.
    pub fn record(&self, store: &ObjectStore, h: &HotSet, total: u64) -> Result<()> {
        let (disk, seq) = (h.disk, h.seq);
        let body = serde_json::to_vec(h).expect("json");
        store.put_create(
            &hot_key(disk, seq),
            Bytes::from(envelope::seal(MAGIC_HOT, &body)),
        )?;
        *self.recorded.lock().unwrap() = Some((seq, total, Instant::now()));
        Ok(())
    }
}

/// The newest hot set of `disk`, if there is one.
pub fn newest(store: &ObjectStore, disk: u32) -> Result<Option<HotSet>> {
    let Some(l) = store
        .list(&hot_dir(disk), None)?
        .into_iter()
        .filter(|l| hot_of_key(&l.key).is_some())
        .max_by(|a, b| a.key.cmp(&b.key))
    else {
        return Ok(None);
    };
    let Some(obj) = store.get_opt(&l.key)? else {
        // Collected since the listing: a newer one exists, next time.
        return Ok(None);
    };
    let body = envelope::open(MAGIC_HOT, &l.key, &obj)?;
    let h: HotSet = serde_json::from_slice(body)
        .map_err(|e| Error::new(ErrorKind::Corrupt, format!("{}: {e}", l.key)))?;
    if h.disk != disk {
        return Err(Error::new(
            ErrorKind::Corrupt,
            format!("{}: the hot set says it is of disk {:08x}", l.key, h.disk),
        ));
    }
    Ok(Some(h))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_round_trip() {
        let k = hot_key(0xdead_beef, 42);
        assert_eq!(k, "disks/deadbeef/h/000000000000002a");
        assert_eq!(hot_of_key(&k), Some((0xdead_beef, 42)));
        assert_eq!(hot_of_key("disks/deadbeef/m/000000000000002a"), None);
        assert_eq!(hot_of_key("disks/deadbeef/h/2a"), None);
    }

    #[test]
    fn reads_are_counted_per_region_and_ranked() {
        // 1 GiB: 1 MiB regions.
        let r = Reads::new(1 << 18);
        assert_eq!(r.regions.len(), 1024);
        r.count(250, 10); // 6 grains in region 0, 4 in region 1
        r.count(256 * 7, 256);
        r.count(256 * 7, 1);
        let h = r.hottest();
        assert_eq!(h[0], (256 * 7..256 * 8, 257));
        assert_eq!(h[1], (0..256, 6));
        assert_eq!(h[2], (256..512, 4));
        assert_eq!(h.len(), 3);
        assert_eq!(r.total(), 267);
        // Past the end (a disk extended since it opened): the last region.
        r.count((1 << 18) + 5, 1);
        assert_eq!(
            r.hottest()
                .iter()
                .find(|x| x.0.start == 1023 * 256)
                .unwrap()
                .1,
            1
        );
        // 1 TiB: regions grow so that there are at most 4,096.
        let big = Reads::new(1 << 28);
        assert_eq!(big.regions.len(), 4096);
        assert_eq!(big.shift, 16);
        assert_eq!(Reads::new(0).regions.len(), 1);
    }
}
