//! `strata move`: move a served disk to another datastore while clients
//! write it (docs/MOVE.md): copy its snapshots, copy its head, copy again
//! what clients changed meanwhile until little is left, then hold client
//! I/O for a last pass, commit the new place and switch the export's slot.

use std::collections::HashSet;
use std::sync::Arc;
use std::time::Instant;

use strata_api::{MoveReport, Request, Response};
use strata_block::{BlockDevice, ZeroOptions};
use strata_engine::{Error, ErrorKind, Provisioning, WorkControl};

use crate::copier::{io, Copier, Pass};
use crate::ops::Mover;
use strata_datastore::{Capability, ChangedRange as Changed, SnapshotInfo};

use crate::placement::{Location, MoveEntry, Phase, Places, Store};

/// Stop converging when a pass finds at most this much changed...
const CONVERGED_BYTES: u64 = 8 << 20;
/// ...else, once at least `PASSES_MIN` passes ran and clients changed more
/// than half of what the previous one copied (the passes are not
/// shrinking), or after `PASSES_MAX`, mirror client writes into the target
/// (which converges whatever the load). Mirroring doubles the work of
/// every client write, which costs clients more than copy passes do
/// (bench `move`: IOPS during a 2 GiB move under 4k random writes 0.48x
/// when mirroring after one pass, 0.56x after two), so it comes late.
const PASSES_MIN: u32 = 2;
const PASSES_MAX: u32 = 6;

pub use crate::move_settings::{Mirror, MoveSettings, MoveStep, StepHook};

fn bytes(r: &[Changed]) -> u64 {
    r.iter().map(|r| r.len).sum()
}

/// Changed blocks closer than this are copied as one range (the blocks
/// between are copied again too, which is harmless: they are read from
/// the source as it is now): one 64 KiB read instead of sixteen 4 KiB ones
/// where random writes left the blocks dense.
const COALESCE_GAP: u64 = 64 * 1024;

fn dirty_ranges(d: Vec<(u64, u64)>) -> Vec<Changed> {
    let mut out: Vec<Changed> = Vec::with_capacity(d.len());
    for (offset, len) in d {
        match out.last_mut() {
            Some(r) if offset <= r.offset + r.len + COALESCE_GAP => {
                r.len = offset + len - r.offset;
            }
            _ => out.push(Changed {
                offset,
                len,
                mapped: true,
            }),
        }
    }
    out
}

struct Args<'a> {
    name: &'a str,
    to: &'a std::path::Path,
    head_only: bool,
    provisioning: Option<Provisioning>,
    rate: Option<u64>,
}

/// Run a `move` request.
pub fn run(
    places: &Places,
    req: &Request,
    control: Option<Arc<WorkControl>>,
    progress: &mut dyn FnMut(u64, u64),
) -> Result<MoveReport, Error> {
    let Request::Move {
        name,
        to,
        head_only,
        provisioning,
        rate_bytes_per_sec,
    } = req
    else {
        unreachable!("moving::run is given move requests")
    };
    let a = Args {
        name,
        to,
        head_only: *head_only,
        provisioning: *provisioning,
        rate: *rate_bytes_per_sec,
    };
    let r = run_marked(places, &a, control, progress);
    places.end_move(name);
    r
}

/// The move of a disk marked as moving (`Places::begin_move`).
fn run_marked(
    places: &Places,
    a: &Args<'_>,
    control: Option<Arc<WorkControl>>,
    progress: &mut dyn FnMut(u64, u64),
) -> Result<MoveReport, Error> {
    let name = a.name;
    if name.contains('@') {
        return Err(Error::new(
            ErrorKind::InvalidArgument,
            format!("'{name}' is a snapshot: a move takes a disk (its snapshots go with it)"),
        ));
    }
    let from = places.place_of(name);
    let src = places.store(&from)?;
    if !src.exists(name) {
        return Err(Error::new(
            ErrorKind::NotFound,
            format!("no disk named '{name}' here"),
        ));
    }
    // A group lives in one datastore, and the source could not be
    // removed at the end.
    src.outside_groups(name)?;
    let to = Location::of(a.to)?;
    if to == from {
        return Err(Error::new(
            ErrorKind::Refused,
            format!(
                "disk '{name}' is in {} already (to change its type in place: 'strata convert')",
                to.dir.display()
            ),
        ));
    }
    let dst = places.store(&to)?;
    let r = if dst.exists(name) {
        Err(Error::new(
            ErrorKind::AlreadyExists,
            format!("{} has a disk named '{name}' already", to.dir.display()),
        ))
    } else {
        Move {
            places,
            a,
            from: &from,
            src: &src,
            to: &to,
            dst: &dst,
        }
        .run(control, progress)
    };
    // The datastore left (or not reached) is closed if nothing else
    // lives there.
    drop((src, dst));
    places.release_unused(&from);
    places.release_unused(&to);
    r
}

/// One move under way: what was asked, and where from and to.
struct Move<'a> {
    places: &'a Places,
    a: &'a Args<'a>,
    from: &'a Location,
    src: &'a Store,
    to: &'a Location,
    dst: &'a Store,
}

impl Move<'_> {
    /// The provisioning of the copy: the one asked for, else the
    /// source's; thin where the target has no thick disks (noted).
    fn provisioning(
        &self,
        src_prov: Provisioning,
        notes: &mut Vec<String>,
    ) -> Result<Provisioning, Error> {
        let name = self.a.name;
        Ok(
            match (self.dst.supports(Capability::Thick), self.a.provisioning) {
                (Err(e), Some(p)) if p.is_thick() => {
                    return Err(Error::new(
                        e.kind,
                        format!("--type {}: {}", p.as_str(), e.message),
                    ))
                }
                (Err(_), _) => {
                    if src_prov.is_thick() {
                        notes.push(format!(
                            "'{name}' was {}; {} disks are thin, so it is thin now",
                            src_prov.as_str(),
                            self.to.kind.noun()
                        ));
                    }
                    Provisioning::Thin
                }
                (Ok(()), p) => p.unwrap_or(src_prov),
            },
        )
    }

    /// Record the move as copying in the placement file (a start after a
    /// crash finds it and undoes the move).
    fn record(&self) -> Result<(), Error> {
        self.places.update(|f| {
            f.moves.insert(
                self.a.name.to_string(),
                MoveEntry {
                    from: self.from.clone(),
                    to: self.to.clone(),
                    phase: Phase::Copying,
                },
            );
        })
    }

    /// After a failure: remove the partial copy and the move's record
    /// (both retried at the next start if this fails), and return `e`.
    fn undo(&self, e: Error) -> Error {
        let name = self.a.name;
        if self.dst.exists(name) {
            if let Err(u) = self.dst.remove(name) {
                tracing::warn!(
                    "removing the partial copy of {name} in {} failed (retried at the \
                     next start): {}",
                    self.to.dir.display(),
                    u.message
                );
                return e;
            }
        }
        let _ = self.places.update(|f| {
            f.moves.remove(name);
        });
        e
    }

    /// The target disk, created at the size of the first version copied
    /// into it (each snapshot keeps its own size: a revert there restores
    /// it, and a diff from it counts what lies past it).
    fn create_target(&self, size: u64, prov: Provisioning) -> Result<(), Error> {
        let name = self.a.name;
        let first_size = match self.a.head_only {
            true => size,
            false => self
                .src
                .snapshots(name)?
                .first()
                .map_or(size, |f| f.size_bytes.min(size)),
        };
        let landing = crate::cloning::Landing {
            src_disk: name,
            name,
            size_bytes: first_size,
            provisioning: prov,
        };
        crate::cloning::create_landing(&**self.src, &**self.dst, &landing)
    }

    fn run(
        &self,
        control: Option<Arc<WorkControl>>,
        progress: &mut dyn FnMut(u64, u64),
    ) -> Result<MoveReport, Error> {
        let (name, from, to) = (self.a.name, self.from, self.to);
        let started = Instant::now();
        let info = self.src.disk_info(name)?;
        let mut notes = Vec::new();
        let prov = self.provisioning(info.provisioning, &mut notes)?;
        // The record first, so that a crash from here on is undone at start.
        self.record()?;
        let slot = self
            .create_target(info.size_bytes, prov)
            .and_then(|()| self.places.slot(name))
            .map_err(|e| self.undo(e))?;
        let dirty = slot.track();
        let mut copier = Copier::new(control, self.a.rate, progress);
        copier.seen = slot.requests();
        let (snapshots, passes, switch, mirrored) =
            match self.copy_and_switch(&slot, &dirty, &mut copier) {
                Ok(x) => x,
                Err(mut e) => {
                    slot.untrack();
                    if let Some(why) = copier.control.as_ref().and_then(|c| c.stopped_by(&e)) {
                        e.message = format!(
                            "{why}: '{name}' stays in {}, the partial copy in {} was removed",
                            from.dir.display(),
                            to.dir.display()
                        );
                    }
                    return Err(self.undo(e));
                }
            };
        self.places.moves().reached(name, MoveStep::Switched);
        // The target is the disk now; the source goes.
        if let Err(e) = self.src.remove(name) {
            tracing::warn!(
                "the move of {name} is done but removing the source in {} failed (retried \
                 at the next start): {}",
                from.dir.display(),
                e.message
            );
        } else {
            self.places.update(|f| {
                f.moves.remove(name);
            })?;
        }
        Ok(MoveReport {
            disk: name.to_string(),
            from: from.dir.clone(),
            to: to.dir.clone(),
            provisioning: prov,
            snapshots,
            copied_bytes: copier.copied,
            passes,
            mirrored,
            switch_ms: switch.as_secs_f64() * 1e3,
            seconds: started.elapsed().as_secs_f64(),
            notes,
        })
    }
    /// Snapshots, head, converging passes, switch. Returns the snapshots
    /// re-created, the passes, how long I/O was held and whether client
    /// writes were mirrored.
    fn copy_and_switch(
        &self,
        slot: &crate::slot::Slot,
        dirty: &crate::slot::DirtyMap,
        copier: &mut Copier<'_>,
    ) -> Result<(Vec<String>, u32, std::time::Duration, bool), Error> {
        let (places, name, src, dst, to) = (self.places, self.a.name, self.src, self.dst, self.to);
        let target = dst.open(name)?;
        let (recreated, head_base) = self.copy_snapshots(&target, copier)?;
        // The head: what differs from its base now (tracking is on, so what
        // changes after this is copied again).
        let source = slot.device();
        let ranges = src.changed_ranges(
            head_base.as_ref().map(|b| format!("{name}@{b}")).as_deref(),
            name,
        )?;
        copier.total += bytes(&ranges);
        copier.copy(&*source, &*target, &ranges, Pass::Locked(slot))?;
        let moves = places.moves();
        moves.reached(name, MoveStep::Copied);
        let first = Converging {
            previous: bytes(&ranges),
            mirror: moves.mirror,
        };
        let (mut passes, mirrored) = converge(slot, dirty, copier, &target, first)?;
        target.flush().map_err(|e| io("flush the target", e))?;
        moves.reached(name, MoveStep::Converged);
        copier.checkpoint()?;
        let held = slot.switch(|| -> Result<Arc<dyn BlockDevice>, Error> {
            let d = dirty_ranges(dirty.take());
            copier.total += bytes(&d);
            copier.copy(&*source, &*target, &d, Pass::Held)?;
            target.flush().map_err(|e| io("flush the target", e))?;
            moves.reached(name, MoveStep::Switching);
            // The commit point.
            places.update(|f| {
                if to.dir == places.home_dir() {
                    f.disks.remove(name);
                } else {
                    f.disks.insert(name.to_string(), to.clone());
                }
                if let Some(m) = f.moves.get_mut(name) {
                    m.phase = Phase::Switched;
                }
            })?;
            Ok(target.clone())
        })?;
        passes += 1;
        // Connections to the disk's snapshots follow it (or, with
        // --head-only, find them gone).
        for (export, s) in places.snapshot_slots(name) {
            let next = dst
                .open(&export)
                .unwrap_or_else(|e| Arc::new(Gone(e.message)));
            let _ = s.switch(|| Ok::<_, Error>(next));
        }
        Ok((recreated, passes, held, mirrored))
    }

    /// Re-create the disk's snapshots in the target, each from a state the
    /// target has (its parent, or for a root after the first, the first one
    /// copied), then bring the target to the head's base at the head's
    /// size. Returns the snapshots made and the head's base.
    fn copy_snapshots(
        &self,
        target: &Arc<dyn BlockDevice>,
        copier: &mut Copier<'_>,
    ) -> Result<(Vec<String>, Option<String>), Error> {
        let (name, src, dst) = (self.a.name, self.src, self.dst);
        let (snaps, current) = if self.a.head_only {
            (Vec::new(), None)
        } else {
            let snaps = src.snapshots(name)?;
            let current = snaps.iter().find(|s| s.current).map(|s| s.name.clone());
            (snaps, current)
        };
        let mut plan: Vec<(Option<String>, &str, u64, Vec<Changed>)> = Vec::new();
        let mut copied: HashSet<&str> = HashSet::new();
        let mut first: Option<&str> = None;
        for s in &snaps {
            let base = match &s.parent {
                Some(p) if copied.contains(p.as_str()) => Some(p.clone()),
                _ => first.map(str::to_string),
            };
            let ranges = src.changed_ranges(
                base.as_ref().map(|b| format!("{name}@{b}")).as_deref(),
                &format!("{name}@{}", s.name),
            )?;
            copier.total += bytes(&ranges);
            plan.push((base, &s.name, s.size_bytes, ranges));
            copied.insert(&s.name);
            first.get_or_insert(&s.name);
        }
        let head_base = match &current {
            Some(c) if copied.contains(c.as_str()) => Some(c.clone()),
            _ => first.map(str::to_string),
        };
        let mut at: Option<String> = None;
        let mut recreated = Vec::new();
        // A version larger than the state it is built from was extended
        // since: so is the copy (a revert restores a snapshot's size).
        let grow = |to: u64| -> Result<(), Error> {
            if dst.disk_info(name)?.size_bytes < to {
                dst.extend(name, to)?;
            }
            Ok(())
        };
        for (base, snap, snap_size, ranges) in plan {
            if base.is_some() && base != at {
                dst.snapshot_revert(name, base.as_deref().expect("some"))?;
            }
            grow(snap_size)?;
            let sdev = src.open(&format!("{name}@{snap}"))?;
            copier.copy(&*sdev, &**target, &ranges, Pass::Paced)?;
            dst.snapshot_create(name, snap, &description_of(&snaps, snap))?;
            at = Some(snap.to_string());
            recreated.push(snap.to_string());
        }
        if head_base.is_some() && head_base != at {
            dst.snapshot_revert(name, head_base.as_deref().expect("some"))?;
        }
        grow(src.disk_info(name)?.size_bytes)?;
        Ok((recreated, head_base))
    }
}

/// How converging starts: what the head's first pass copied, and when
/// to mirror.
#[derive(Clone, Copy)]
struct Converging {
    previous: u64,
    mirror: Mirror,
}

/// Copy again what clients changed (`dirty`) until a pass finds little,
/// or, when passes do not shrink (or `first.mirror` says always), mirror
/// client writes into `target` and copy once more what they changed
/// before; then copy what the last look found. Returns the passes and
/// whether writes are mirrored.
fn converge(
    slot: &crate::slot::Slot,
    dirty: &crate::slot::DirtyMap,
    copier: &mut Copier<'_>,
    target: &Arc<dyn BlockDevice>,
    first: Converging,
) -> Result<(u32, bool), Error> {
    let source = slot.device();
    let always = first.mirror == Mirror::Always;
    let mut previous = first.previous;
    let mut passes = 0;
    let mut mirrored = false;
    let mut last = loop {
        let d = dirty_ranges(dirty.take());
        let small = bytes(&d) <= CONVERGED_BYTES;
        if small && !always {
            break d;
        }
        let shrinking = bytes(&d) <= previous / 2;
        if (!shrinking && passes >= PASSES_MIN) || passes >= PASSES_MAX || always {
            // Writes outpace the copy: from here clients write both
            // copies, and what they changed before is copied once more.
            slot.mirror(target.clone());
            mirrored = true;
            let mut d = d;
            d.extend(dirty_ranges(dirty.take()));
            d.sort_by_key(|r| r.offset);
            break d;
        }
        passes += 1;
        previous = bytes(&d);
        copier.total += previous;
        copier.copy(&*source, &**target, &d, Pass::Locked(slot))?;
    };
    // Again what the last look found, then flush the bulk before holding
    // I/O so the switch's flush is small.
    last.sort_by_key(|r| r.offset);
    copier.total += bytes(&last);
    copier.copy(&*source, &**target, &last, Pass::Locked(slot))?;
    if mirrored {
        passes += 1;
    }
    Ok((passes, mirrored))
}

fn description_of(snaps: &[SnapshotInfo], name: &str) -> String {
    snaps
        .iter()
        .find(|s| s.name == name)
        .map(|s| s.description.clone())
        .unwrap_or_default()
}

/// A snapshot export whose snapshot did not move (`--head-only`): every
/// request fails with the reason.
struct Gone(String);

impl BlockDevice for Gone {
    fn size_bytes(&self) -> u64 {
        0
    }
    fn read_only(&self) -> bool {
        true
    }
    fn read_at(&self, _: &mut [u8], _: u64) -> strata_block::BlockResult<strata_block::ReadFill> {
        Err(self.err())
    }
    fn write_at(&self, _: &[u8], _: u64, _: bool) -> strata_block::BlockResult<()> {
        Err(self.err())
    }
    fn flush(&self) -> strata_block::BlockResult<()> {
        Ok(())
    }
    fn unmap(&self, _: u64, _: u64) -> strata_block::BlockResult<()> {
        Err(self.err())
    }
    fn write_zeroes(&self, _: u64, _: u64, _: ZeroOptions) -> strata_block::BlockResult<()> {
        Err(self.err())
    }
    fn block_status(&self, _: u64, _: u64) -> strata_block::BlockResult<Vec<strata_block::Extent>> {
        Err(self.err())
    }
}

impl Gone {
    fn err(&self) -> strata_block::BlockError {
        strata_block::BlockError::new(
            strata_block::ErrorKind::Io,
            format!("the snapshot did not move with its disk: {}", self.0),
        )
    }
}

/// A server's placement as requests see it: routing by `Places`, moves
/// here.
impl Mover for Places {
    fn route(
        &self,
        req: &Request,
        progress: &mut dyn FnMut(u64, u64),
    ) -> Option<Result<Response, Error>> {
        self.route_request(req, progress)
    }

    fn reserve_move(&self, req: &Request) -> Result<(), Error> {
        match req {
            Request::Move { name, .. } => self.begin_move(name),
            _ => Ok(()),
        }
    }

    fn run_move(
        &self,
        req: &Request,
        control: Option<Arc<WorkControl>>,
        progress: &mut dyn FnMut(u64, u64),
    ) -> Result<Response, Error> {
        run(self, req, control, progress).map(Response::Moved)
    }

    fn clone_full(
        &self,
        req: &Request,
        control: Option<Arc<WorkControl>>,
        progress: &mut dyn FnMut(u64, u64),
    ) -> Result<Response, Error> {
        Places::clone_full(self, req, control, progress)
    }

    fn serves(&self, name: &str) -> bool {
        self.serves_placed(name)
    }

    fn forget(&self, name: &str, with_snapshots: bool) {
        self.forget_slots(name, with_snapshots);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn close_dirty_blocks_are_copied_as_one_range() {
        let k = 4096;
        let r = dirty_ranges(vec![(0, k), (8 * k, k), (200 * k, 2 * k), (220 * k, k)]);
        assert_eq!(
            r.iter().map(|c| (c.offset, c.len)).collect::<Vec<_>>(),
            vec![(0, 9 * k), (200 * k, 2 * k), (220 * k, k)]
        );
        assert!(r.iter().all(|c| c.mapped));
    }
}
