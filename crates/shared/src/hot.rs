//! Hot sets (docs/FORMAT.md §11.5b): the segments a disk's writer read
//! most, recorded in the store so that the next host to serve the disk
//! fetches them before its clients ask.

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use serde::{Deserialize, Serialize};
use strata_objstore::{Bytes, ObjectStore};

use crate::envelope;
use crate::layout::SegId;
use crate::{now_ms, Error, ErrorKind, Result};

const MAGIC_HOT: &[u8; 8] = b"STRHOT01";
/// Segments a hot set names at most.
pub const HOT_MAX: usize = 1024;
/// A writer records its hot set this often while its reads change.
pub const HOT_EVERY: Duration = Duration::from_secs(300);
/// Segments counted per disk at most (the rest of a huge scan is not hot).
const COUNTED_MAX: usize = 65536;

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

/// A handle's reads per segment, and when its hot set was last recorded.
#[derive(Default)]
pub struct Reads {
    counts: Mutex<HashMap<SegId, u64>>,
    /// The manifest sequence and the read total of the last record.
    recorded: Mutex<Option<(u64, u64, Instant)>>,
    /// A background record is under way.
    recording: std::sync::atomic::AtomicBool,
}

impl Reads {
    /// One grain read from each of `segs`.
    pub fn count(&self, segs: &[SegId]) {
        if segs.is_empty() {
            return;
        }
        let mut c = self.counts.lock().unwrap();
        for s in segs {
            if let Some(n) = c.get_mut(s) {
                *n += 1;
            } else if c.len() < COUNTED_MAX {
                c.insert(*s, 1);
            }
        }
    }

    /// Start a background record: false if one is under way.
    pub fn begin(&self) -> bool {
        !self
            .recording
            .swap(true, std::sync::atomic::Ordering::AcqRel)
    }

    /// The background record has ended.
    pub fn end(&self) {
        self.recording
            .store(false, std::sync::atomic::Ordering::Release);
    }

    /// Whether a periodic record is due.
    pub fn due(&self) -> bool {
        match *self.recorded.lock().unwrap() {
            None => !self.counts.lock().unwrap().is_empty(),
            Some((_, total, at)) => at.elapsed() >= HOT_EVERY && self.total() != total,
        }
    }

    fn total(&self) -> u64 {
        self.counts.lock().unwrap().values().sum()
    }

    /// Write the hot set of `disk` at manifest `seq` (create-only; a key
    /// already there is left alone). `Ok(false)`: nothing to record.
    pub fn record(&self, store: &ObjectStore, disk: u32, seq: u64, host: &str) -> Result<bool> {
        let total = self.total();
        if total == 0 {
            return Ok(false);
        }
        if let Some((s, t, _)) = *self.recorded.lock().unwrap() {
            if s == seq && t == total {
                return Ok(false);
            }
        }
        let mut segments: Vec<HotSeg> = self
            .counts
            .lock()
            .unwrap()
            .iter()
            .map(|(seg, reads)| HotSeg {
                seg: *seg,
                reads: *reads,
            })
            .collect();
        segments.sort_by(|a, b| b.reads.cmp(&a.reads).then(a.seg.cmp(&b.seg)));
        segments.truncate(HOT_MAX);
        let h = HotSet {
            disk,
            seq,
            written_ms: now_ms(),
            host: host.to_string(),
            segments,
        };
        let body = serde_json::to_vec(&h).expect("json");
        store.put_create(
            &hot_key(disk, seq),
            Bytes::from(envelope::seal(MAGIC_HOT, &body)),
        )?;
        *self.recorded.lock().unwrap() = Some((seq, total, Instant::now()));
        Ok(true)
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
    let body =
        envelope::open(MAGIC_HOT, &l.key, &obj).map_err(|e| Error::new(ErrorKind::Corrupt, e))?;
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
}
