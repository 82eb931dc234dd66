//! The pool's layout (FORMAT.md §10): a disk's fragments, the free-extent
//! scan, defrag, and free-space consolidation (evacuating the tail, lowering
//! the pool end, punching free runs back to the host).

use std::sync::atomic::Ordering;

use strata_format::{BLOCK_GRAINS, GRAIN_BYTES};

use crate::error::{err, ErrorKind, Result};
use strata_api::{DefragReport, FreeSpaceReport, PoolLayout, FREE_EXTENT_CLASSES};

use crate::layout::FREE_STEP_BLOCKS;
use crate::meta::{FreeExtents, ZoneGrain, ZoneScan};
use crate::work::Pacer;

use super::{Datastore, SpaceWork, PUNCH_MIN_GRAINS};

impl Datastore {
    // ------------------------------------------------------------ layout (FORMAT.md §10)

    /// The live disk's fragments (FORMAT.md §10.1) and the bytes of its
    /// head held packed (§18.8), from one walk of its map.
    pub fn disk_fragments(&self, name: &str) -> Result<(u64, u64)> {
        let f = self.open_keyless(name)?.head_layout()?;
        Ok((f.fragments, f.packed * GRAIN_BYTES))
    }

    /// How the pool's space lies (FORMAT.md §10.1), scanned a few blocks
    /// per hold of the metadata lock.
    pub fn pool_layout(&self) -> Result<PoolLayout> {
        let mut acc = FreeExtents::default();
        let mut b = 0;
        let pool_bytes = loop {
            let mut m = self.inner.meta.lock();
            let blocks = m.pool_blocks();
            if b >= blocks {
                break m.hwm() * GRAIN_BYTES;
            }
            b = m.free_extents_step(b, b + FREE_STEP_BLOCKS, &mut acc)?;
        };
        acc.end_run();
        Ok(PoolLayout {
            free_extents: acc.extents,
            free_extent_histogram: FREE_EXTENT_CLASSES
                .iter()
                .zip(acc.histogram)
                .map(|(&(name, _), n)| (name.to_string(), n))
                .collect(),
            free_in_pool_bytes: acc.free_grains * GRAIN_BYTES,
            pool_bytes,
            pool_file_bytes: self.inner.pool.allocated_bytes()?,
        })
    }

    /// Lay a live disk's grains out in logical order (`strata defrag`,
    /// FORMAT.md §10.3), keeping what snapshots and clones share shared.
    /// Online, a region at a time, paced; commits every 64 MiB and at the
    /// end. With `dry_run`, reports what it would move and moves nothing.
    pub fn defrag_disk(
        &self,
        name: &str,
        dry_run: bool,
        opts: &SpaceWork,
        progress: &mut dyn FnMut(u64, u64),
    ) -> Result<DefragReport> {
        if !dry_run {
            self.inner.check_writable()?;
        }
        if name.contains('@') {
            return err(
                ErrorKind::InvalidArgument,
                format!(
                    "'{name}' is a snapshot: defragment its disk; what the snapshot shares moves with it"
                ),
            );
        }
        // Moves copy ciphertext as it is: a locked disk is defragmented too.
        let h = self.open_keyless(name)?;
        let (fragments_before, mapped) = h.fragments()?;
        let mut pacer = Pacer::new(opts.rate_bytes_per_sec, opts.control.as_deref())
            .resting(crate::work::LAYOUT_BUSY_REST);
        let mut clients = self.inner.client_watch();
        let t = h.defrag(dry_run, progress, &mut |n| pacer.pace(n, clients.busy()))?;
        let fragments_after = if dry_run {
            fragments_before
        } else {
            h.fragments()?.0
        };
        Ok(DefragReport {
            disk: name.to_string(),
            dry_run,
            fragments_before,
            fragments_after,
            mapped_bytes: mapped * GRAIN_BYTES,
            moved_bytes: t.moved,
            regions_moved: t.regions_moved,
            regions_skipped: t.skipped,
            grains_kept: t.kept,
        })
    }

    /// Free-space consolidation (`strata defrag --free-space`, FORMAT.md
    /// §10.4): live grains above what the used space needs are moved down
    /// into free grains, the pool end comes down to match, and the free
    /// grains left inside the pool are punched out of the host file. Paced
    /// like the other space work; each step is bounded.
    pub fn consolidate_free_space(
        &self,
        opts: &SpaceWork,
        progress: &mut dyn FnMut(u64, u64),
    ) -> Result<FreeSpaceReport> {
        self.inner.check_writable()?;
        if self.inner.consolidating.swap(true, Ordering::AcqRel) {
            return err(
                ErrorKind::Refused,
                "a free-space consolidation is already running (see 'strata jobs')",
            );
        }
        struct Running<'a>(&'a std::sync::atomic::AtomicBool);
        impl Drop for Running<'_> {
            fn drop(&mut self) {
                self.0.store(false, Ordering::Release);
            }
        }
        let _running = Running(&self.inner.consolidating);
        // Deleted maps first: what they hold is free space too.
        while self.reclaim(1 << 16)? {}
        self.inner.commit(false)?;
        let before = self.pool_layout()?;
        let mut pacer = Pacer::new(opts.rate_bytes_per_sec, opts.control.as_deref())
            .resting(crate::work::LAYOUT_BUSY_REST);
        let mut clients = self.inner.client_watch();
        let mut pace = |n: u64| pacer.pace(n, clients.busy());
        let mut r = FreeSpaceReport {
            pool_bytes_before: before.pool_bytes,
            pool_file_bytes_before: before.pool_file_bytes,
            ..Default::default()
        };
        let (used, hwm) = {
            let m = self.inner.meta.lock();
            (m.used_grains(), m.hwm())
        };
        // Room kept below the new end for clients' writes meanwhile.
        let slack = (1u64 << 10).max(used / 32);
        let end = (used + slack + 1).div_ceil(BLOCK_GRAINS) * BLOCK_GRAINS;
        // Progress counts grains (moved, then looked at) and is reported
        // in bytes, as every job's is.
        let total = hwm.saturating_sub(end) + hwm;
        let mut report = |g: u64| progress(g.min(total) * GRAIN_BYTES, total * GRAIN_BYTES);
        let mut done = 0u64;
        if end < hwm {
            self.lower_pool_end_to(end, &mut r, &mut pace, &mut |n| {
                done = n;
                report(done)
            })?;
        }
        let mut watch = self.inner.client_watch();
        (r.punched_bytes, r.short_runs_bytes) =
            self.punch_free_grains(&mut pace, &mut || watch.busy(), &mut |g| report(done + g))?;
        let after = self.pool_layout()?;
        r.used_bytes = self.info().used_bytes;
        r.pool_bytes_after = after.pool_bytes;
        r.pool_file_bytes_after = after.pool_file_bytes;
        Ok(r)
    }

    /// Consolidation's second step (FORMAT.md §10.4, "Evacuate the top"):
    /// with allocations held below `end`, the live grains at or above it
    /// move down; when none is left there and no client needed the room,
    /// the pool end comes down to `end`, the superblock takes it and the
    /// file is cut there (the reserved tail held again past it). Otherwise
    /// `r.note` says why the end stays. `progress` gets the grains moved.
    fn lower_pool_end_to(
        &self,
        end: u64,
        r: &mut FreeSpaceReport,
        pace: &mut dyn FnMut(u64) -> Result<()>,
        progress: &mut dyn FnMut(u64),
    ) -> Result<()> {
        let t = std::time::Instant::now();
        self.inner.meta.lock().set_alloc_limit(Some(end));
        let moved = self.evacuate(end, r, pace, progress);
        let lifted = self.inner.meta.lock().set_alloc_limit(None);
        moved?;
        // The moved grains' old places become free once committed.
        self.inner.commit(false)?;
        self.inner.commit(false)?;
        let lowered = !lifted && self.inner.meta.lock().lower_pool_end(end);
        if lowered {
            // The superblock takes the new end; only then the file
            // shrinks, and the reserved tail is held again past it.
            self.inner.checkpoint(true)?;
            // Under the lock: a client may have grown the pool again
            // since; everything below the tail's end stays.
            let mut m = self.inner.meta.lock();
            let end = m.tail_end();
            m.truncate_tail(end)?;
            self.inner.hold_reservation(&mut m, 0, 0)?;
        } else {
            r.note = Some(if lifted {
                "clients needed room above the planned end while grains moved; \
                 run it again when writes are quieter"
                    .to_string()
            } else {
                "grains above the planned end are still in use; run it again".to_string()
            });
        }
        tracing::info!(
            "free space: {} MiB moved below grain {end} in {:.1} s{}",
            r.moved_bytes >> 20,
            t.elapsed().as_secs_f64(),
            if lowered { "" } else { "; the end stays" }
        );
        Ok(())
    }

    /// Consolidation's last step (FORMAT.md §10.4, "Punch"): the free
    /// grains left below the pool end give their space to the host, a few
    /// blocks at a time (clients find the rest allocatable), and so does
    /// the space readied ahead of first writes (§7.1; a writer that grows
    /// the pool readies it again). While `clients_busy()` says client I/O
    /// is in flight, runs shorter than `PUNCH_MIN_GRAINS` are left on the
    /// host: a punch of a grain or two costs the clients as much as a long
    /// one (each takes the file's lock and cuts the host's extent map), and
    /// thousands of them ran the clients at a third of their speed.
    /// `progress` gets the grains looked at. Returns the bytes given back
    /// and the bytes of the short runs left.
    pub(super) fn punch_free_grains(
        &self,
        pace: &mut dyn FnMut(u64) -> Result<()>,
        clients_busy: &mut dyn FnMut() -> bool,
        progress: &mut dyn FnMut(u64),
    ) -> Result<(u64, u64)> {
        let t = std::time::Instant::now();
        let (mut bytes, mut short) = (0, 0);
        let blocks = self.inner.meta.lock().pool_blocks();
        let mut b = 0;
        while b < blocks {
            let mut held = Vec::new();
            b = self.inner.meta.lock().hold_free_step(b, b + 8, &mut held)?;
            let min_run = if clients_busy() {
                PUNCH_MIN_GRAINS as u64
            } else {
                1
            };
            let punched = self.punch_runs(&held, min_run);
            self.inner.meta.lock().release(&held);
            let (p, s) = punched?;
            bytes += p;
            short += s;
            pace(8 * BLOCK_GRAINS * GRAIN_BYTES)?;
            progress(b * BLOCK_GRAINS);
        }
        bytes += self.inner.meta.lock().drop_readied()?;
        tracing::info!(
            "free space: {} MiB given back to the host in {:.1} s; {} MiB of free runs under {} KiB \
             left alone while clients wrote",
            bytes >> 20,
            t.elapsed().as_secs_f64(),
            short >> 20,
            (PUNCH_MIN_GRAINS as u64 * GRAIN_BYTES) >> 10
        );
        Ok((bytes, short))
    }

    /// What consolidation could give back, cheaply (no scan): bytes of the
    /// pool above what is used, and bytes the pool file holds on the host
    /// above what is used and what thick disks hold in reserve (the tail,
    /// or their reservation where it is larger). The background policy
    /// decides on the second (FORMAT.md §10.4): the first includes blocks
    /// placement claimed (§10.5), which are holes on the host.
    pub fn free_space_gap(&self) -> Result<(u64, u64)> {
        let (used, pool, held) = {
            let m = self.inner.meta.lock();
            let tail = m.tail_end() - m.hwm();
            (
                m.used_grains() * GRAIN_BYTES,
                m.hwm() * GRAIN_BYTES,
                tail.max(m.reserved_grains()) * GRAIN_BYTES,
            )
        };
        let file = self.inner.pool.allocated_bytes()?;
        Ok((pool.saturating_sub(used), file.saturating_sub(used + held)))
    }

    /// Punch the runs of `sorted` (grains held out of the allocator) of at
    /// least `min_run` grains. Returns the bytes punched and the bytes of
    /// the shorter runs left alone.
    fn punch_runs(&self, sorted: &[u64], min_run: u64) -> Result<(u64, u64)> {
        let (mut bytes, mut short) = (0, 0);
        let mut i = 0;
        while i < sorted.len() {
            let mut j = i + 1;
            while j < sorted.len() && sorted[j] == sorted[j - 1] + 1 {
                j += 1;
            }
            let n = (j - i) as u64;
            if n < min_run {
                short += n * GRAIN_BYTES;
                i = j;
                continue;
            }
            self.inner.meta.lock().mark_unbacked(sorted[i], n);
            let (off, len) = (sorted[i] * GRAIN_BYTES, n * GRAIN_BYTES);
            // A hole already (a freed disk's runs, punched when reclaimed):
            // a punch would only take the file's lock from the clients.
            if !self.inner.pool.is_hole(off, len)? {
                self.inner.pool.punch_hole(off, len)?;
                bytes += len;
            }
            i = j;
        }
        Ok((bytes, short))
    }

    /// Move every live grain at or above `zone` down (FORMAT.md §10.4): up
    /// to three passes of a walk of every version finding them, then moves
    /// in batches of 64 with client I/O drained (the gate held for writing:
    /// no write is in flight, so none can write a grain in place while it
    /// is copied). Stops early, leaving the end where it is, when a client
    /// lifted the allocation limit or no free grain is left below `zone`.
    #[expect(clippy::too_many_lines)]
    fn evacuate(
        &self,
        zone: u64,
        r: &mut FreeSpaceReport,
        pace: &mut dyn FnMut(u64) -> Result<()>,
        progress: &mut dyn FnMut(u64),
    ) -> Result<()> {
        const BATCH: usize = 64;
        let mut since_commit = 0u64;
        for _pass in 0..3 {
            let (found, streams) = self.zone_scan(zone)?;
            if (found.is_empty() && streams.is_empty())
                || self.inner.meta.lock().alloc_limit_lifted()
            {
                return Ok(());
            }
            let mut low = 1u64;
            let mut full = false;
            let mut buf = vec![0u8; GRAIN_BYTES as usize];
            for batch in found.chunks(BATCH) {
                if self.inner.meta.lock().alloc_limit_lifted() {
                    // Clients needed the room: the end cannot come down
                    // this time, and more moves would be churn.
                    return Ok(());
                }
                // Bring the batch's data grains into the host's cache while
                // clients still run: the copies below, with client I/O
                // drained, then read from memory. (Only a warm-up: the copy
                // reads the grain again under the gate.)
                for z in batch {
                    if let ZoneGrain::Data { g, .. } = *z {
                        self.inner.pool.will_need(g * GRAIN_BYTES, GRAIN_BYTES);
                    }
                }
                for z in batch {
                    if let ZoneGrain::Data { g, .. } = *z {
                        self.inner.pool.read_at(&mut buf, g * GRAIN_BYTES)?;
                    }
                }
                {
                    let _drain = self.inner.gate.write();
                    let mut m = self.inner.meta.lock();
                    self.inner.guarded(&mut m, |m| {
                        for z in batch {
                            let g = z.grain();
                            if m.ref_get(g)? == 0 {
                                continue; // freed since the walk
                            }
                            let Some(to) = m.alloc_low(&mut low, zone)? else {
                                full = true; // no room below: the end stays
                                return Ok(());
                            };
                            let ok = match *z {
                                ZoneGrain::Data { v, g } => {
                                    self.inner.pool.read_at(&mut buf, g * GRAIN_BYTES)?;
                                    self.inner.pool.write_at(&buf, to * GRAIN_BYTES)?;
                                    m.move_grain(v, g, to)?
                                }
                                ZoneGrain::Node { base, level, g } => {
                                    m.move_node(base, level, g, to)?
                                }
                            };
                            if ok {
                                r.moved_bytes += GRAIN_BYTES;
                            } else {
                                m.abort_alloc(to)?;
                                r.grains_kept += 1;
                            }
                        }
                        Ok(())
                    })?;
                }
                self.inner
                    .mutations
                    .fetch_add(1, std::sync::atomic::Ordering::Release);
                if full {
                    return Ok(());
                }
                since_commit += BATCH as u64 * GRAIN_BYTES;
                if since_commit >= 64 << 20 {
                    self.inner.commit(false)?;
                    since_commit = 0;
                }
                pace(BATCH as u64 * GRAIN_BYTES)?;
                progress(r.moved_bytes / GRAIN_BYTES);
            }
            self.inner.commit(false)?;
            self.repack_zone(zone, &streams, r, pace)?;
        }
        Ok(())
    }

    /// The grains at or above `zone` every version reaches (FORMAT.md
    /// §10.4), a few leaves per hold of the metadata lock: data grains
    /// and map nodes, each once, and the regions (their first virtual
    /// grain) whose packed entries name a stream grain there, sorted.
    fn zone_scan(&self, zone: u64) -> Result<(Vec<ZoneGrain>, Vec<u64>)> {
        const STEP: u64 = 64 * 512;
        let (mut found, mut streams) = (Vec::new(), Vec::new());
        let versions = self.inner.meta.lock().version_ids();
        for ver in versions {
            let reach = match self.inner.meta.lock().version_state(ver) {
                Some(st) => 1u64 << (strata_format::MAP_FANOUT_SHIFT * st.levels as u32),
                None => continue,
            };
            let mut v = 0;
            while v < reach {
                let t = reach.min(v + STEP);
                let mut m = self.inner.meta.lock();
                if m.version_state(ver).is_none() {
                    break;
                }
                let mut scan = ZoneScan {
                    zone,
                    found: &mut found,
                    streams: &mut streams,
                };
                m.zone_scan_step(ver, v, t, &mut scan)?;
                v = t;
            }
        }
        let mut seen = std::collections::HashSet::new();
        found.retain(|z| seen.insert(z.grain()));
        let shift = crate::settled::REGION_SHIFT;
        let mut regions: Vec<u64> = streams.iter().map(|v| v >> shift << shift).collect();
        regions.sort_unstable();
        regions.dedup();
        Ok((found, regions))
    }

    /// Repack the regions whose stream grains lie at or above `zone`, so
    /// that their live fragments move below it (§10.4; streams are not
    /// moved grain by grain).
    fn repack_zone(
        &self,
        zone: u64,
        regions: &[u64],
        r: &mut FreeSpaceReport,
        pace: &mut dyn FnMut(u64) -> Result<()>,
    ) -> Result<()> {
        let low = [std::cell::Cell::new(1), std::cell::Cell::new(1)];
        for &first in regions {
            if self.inner.meta.lock().alloc_limit_lifted() {
                return Ok(());
            }
            let (moved, read) = self.repack_region_below(first, zone, &low)?;
            r.repacked_bytes += moved;
            pace(read)?;
        }
        if !regions.is_empty() {
            self.inner.commit(false)?;
        }
        Ok(())
    }
}
