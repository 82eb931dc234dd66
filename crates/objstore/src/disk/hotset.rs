//! Hot sets (§11.5b): the segments a writer read recorded, fetched ahead
//! by the next host that opens the disk.

use super::*;

impl ObjectDisk {
    /// Record the disk's hot set (§11.5b) if this process writes it: the
    /// objects that hold, at the newest manifest, the data of the regions
    /// this handle's reads went to most, with the segments of the map
    /// nodes walked to them. `Ok(false)`: nothing to record (not the
    /// writer, no reads, recorded already).
    pub fn record_hot_set(&self) -> Result<bool> {
        let man = {
            let st = self.state.lock().unwrap();
            if !st.owner || st.fenced.is_some() || self.snapshot.is_some() {
                return Ok(false);
            }
            st.man.clone()
        };
        if self.reads.unchanged(man.seq) {
            return Ok(false);
        }
        let total = self.reads.total();
        let segments = self.hot_segments(&man)?;
        if segments.is_empty() {
            return Ok(false);
        }
        let host = &self.ds.config().me.name;
        let h = crate::hot::HotSet::new(self.id, man.seq, host, segments);
        self.reads.record(self.store(), &h, total)?;
        Ok(true)
    }

    /// The objects behind the most read regions at `man`, each weighed by
    /// the reads of the grains it serves there (a node's segment by those
    /// of every grain walked through it), until [`crate::hot::HOT_MAX`]
    /// are found.
    pub(super) fn hot_segments(&self, man: &Manifest) -> Result<Vec<crate::hot::HotSeg>> {
        let end = man.size_bytes.div_ceil(G);
        let mut weight: HashMap<SegId, u64> = HashMap::new();
        let mut used = Vec::new();
        for (region, reads) in self.reads.hottest() {
            if weight.len() >= crate::hot::HOT_MAX {
                break;
            }
            for vg in region.start..region.end.min(end) {
                used.clear();
                if let Some(e) = self.locate(man, vg, &mut used)? {
                    used.push(e.seg);
                }
                for s in &used {
                    *weight.entry(*s).or_default() += reads;
                }
            }
        }
        // Per grain of a region: its reads over its grains.
        let per = 1u64 << self.reads.shift();
        Ok(weight
            .into_iter()
            .map(|(seg, w)| crate::hot::HotSeg {
                seg,
                reads: w.div_ceil(per),
            })
            .collect())
    }

    /// Record the hot set in the background if it is due (§11.5b), one
    /// record at a time.
    pub(super) fn maybe_record_hot_set(&self) {
        if !self.reads.due() || !self.reads.begin() {
            return;
        }
        let Some(me) = self.me.upgrade() else {
            self.reads.end();
            return;
        };
        let spawned = std::thread::Builder::new()
            .name("strata-hot-set".into())
            .spawn(move || {
                if let Err(e) = me.record_hot_set() {
                    tracing::warn!("recording the hot set of '{}': {e}", me.name);
                }
                me.reads.end();
            });
        if spawned.is_err() {
            self.reads.end();
        }
    }

    /// Fetch the segments of the disk's newest hot set (§11.5b) into the
    /// cache in the background ([`HOT_FETCHERS`] at once), the most read
    /// first, up to half the cache's bound. Client reads do not wait for
    /// it.
    pub fn prefetch_hot_set(&self) {
        let Some(me) = self.me.upgrade() else { return };
        let _ = std::thread::Builder::new()
            .name("strata-hot-fetch".into())
            .spawn(move || {
                let h = match crate::hot::newest(me.store(), me.id) {
                    Ok(Some(h)) => h,
                    Ok(None) => return,
                    Err(e) => {
                        tracing::warn!("the hot set of '{}' is not used: {e}", me.name);
                        return;
                    }
                };
                let next = std::sync::atomic::AtomicUsize::new(0);
                let stop = std::sync::atomic::AtomicBool::new(false);
                std::thread::scope(|sc| {
                    for _ in 0..HOT_FETCHERS {
                        sc.spawn(|| me.fetch_hot_part(&h.segments, &next, &stop));
                    }
                });
            });
    }

    /// One of the hot set fetchers: takes the next segment until none is
    /// left, the cache is half full, or the store fails.
    pub(super) fn fetch_hot_part(
        &self,
        segs: &[crate::hot::HotSeg],
        next: &std::sync::atomic::AtomicUsize,
        stop: &std::sync::atomic::AtomicBool,
    ) {
        use std::sync::atomic::Ordering::Relaxed;
        while !stop.load(Relaxed) {
            let Some(s) = segs.get(next.fetch_add(1, Relaxed)) else {
                return;
            };
            let c = self.ds.cache.stats();
            if c.bytes >= c.bound_bytes / 2 {
                return;
            }
            match self.ds.cache.fetch_hot(self.store(), s.seg) {
                Ok(_) => {}
                // Collected since it was recorded.
                Err(e) if e.kind == ErrorKind::NotFound => {}
                Err(e) => {
                    if !stop.swap(true, Relaxed) {
                        tracing::warn!("fetching the hot set of '{}' stopped: {e}", self.name);
                    }
                    return;
                }
            }
        }
    }
}
