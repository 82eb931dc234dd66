//! QEMU's NBD metadata contexts (docs/BACKUP.md).
//!
//! `qemu:dirty-bitmap:BASE`: what backup clients that speak QEMU's
//! protocol (libvirt's pull-mode backup, virtnbdbackup, `qemu-img map
//! --image-opts ...,x-dirty-bitmap=`, nbdinfo) read to copy only what
//! changed. strata keeps no per-write bitmap: the bitmap of export
//! `DISK@SNAP` against BASE is `strata diff DISK@SNAP --from BASE`, every
//! range of it (data or zeros) dirty.
//!
//! `qemu:allocation-depth`: where in the version's ancestry its data was
//! written, as QEMU reports a backing chain's layers: 0 unmapped, 1 since
//! the version's parent (the head's current snapshot, a snapshot's parent
//! snapshot), 2 between the parent and the grandparent, and so on, through
//! a linked clone's origin snapshot into the origin's ancestry. Each layer
//! is one diff of neighbouring versions (the walk skips what they share).
//!
//! A snapshot never changes, so its context is computed once, when a
//! client selects it, and answered from memory. The head's is a live view,
//! recomputed for each BLOCK_STATUS (backups read a snapshot).

use std::io;
use std::sync::Arc;

use strata_api::DiffRange;
use strata_datastore::{Datastore, Error};
use strata_format::split_target;
use strata_nbd::MetaContext;

/// The prefix of the dirty-bitmap contexts.
pub const PREFIX: &str = "qemu:dirty-bitmap:";
/// The allocation-depth context.
pub const DEPTH: &str = "qemu:allocation-depth";
/// Most versions followed up an ancestry (a loop guard).
const ANCESTRY_MAX: usize = 4096;

/// The bit QEMU defines for a dirty range.
const DIRTY: u32 = 1;

/// The contexts of export `target` of `ds`: its allocation depth, and a
/// dirty bitmap per other snapshot of its disk (the snapshots a client
/// can have backed up before).
pub fn names(ds: &dyn Datastore, target: &str) -> Vec<String> {
    let (disk, snap) = split_target(target);
    match ds.snapshots(disk) {
        Ok(list) => std::iter::once(DEPTH.to_string())
            .chain(
                list.into_iter()
                    .filter(|s| Some(s.name.as_str()) != snap)
                    .map(|s| format!("{PREFIX}{}", s.name)),
            )
            .collect(),
        Err(_) => Vec::new(),
    }
}

/// Context `name` of export `target`, or None if it is not one of
/// [`names`] (or its base vanished meanwhile).
pub fn open(ds: Arc<dyn Datastore>, target: &str, name: &str) -> Option<Arc<dyn MetaContext>> {
    if !names(&*ds, target).iter().any(|n| n == name) {
        return None;
    }
    let what = match name.strip_prefix(PREFIX) {
        Some(base) => Values::Dirty(base.to_string()),
        None => Values::Depth,
    };
    let target = target.to_string();
    if split_target(&target).1.is_some() {
        let next = what.read_next_flags();
        return Some(Arc::new(Fixed(what.ranges(&*ds, &target).ok()?, next)));
    }
    Some(Arc::new(Live { ds, target, what }))
}

/// What a context's runs say.
enum Values {
    /// Dirty against this base.
    Dirty(String),
    /// The allocation depth.
    Depth,
}

impl Values {
    /// What a copying client reads next: the dirty ranges.
    fn read_next_flags(&self) -> Option<u32> {
        match self {
            Values::Dirty(_) => Some(DIRTY),
            Values::Depth => None,
        }
    }

    /// Ascending, disjoint `(offset, length, value)` ranges; what they do
    /// not cover has value 0.
    fn ranges(&self, ds: &dyn Datastore, target: &str) -> io::Result<Vec<(u64, u64, u32)>> {
        match self {
            Values::Dirty(base) => dirty(ds, target, base),
            Values::Depth => depths(ds, target),
        }
        .map_err(|e| io::Error::other(e.message))
    }
}

/// The dirty ranges of `target` against `base`, ascending.
fn dirty(ds: &dyn Datastore, target: &str, base: &str) -> Result<Vec<(u64, u64, u32)>, Error> {
    let r = crate::changes::diff(ds, target, base, false)?;
    Ok(r.ranges
        .unwrap_or_default()
        .iter()
        .map(|x: &DiffRange| (x.offset, x.length, DIRTY))
        .collect())
}

/// `target` and its ancestors, nearest first: its parent snapshot (the
/// head's current one), theirs, then a linked clone's origin snapshot and
/// its ancestry.
fn ancestry(ds: &dyn Datastore, target: &str) -> Result<Vec<String>, Error> {
    let mut chain = vec![target.to_string()];
    let mut at = target.to_string();
    loop {
        let disk = split_target(&at).0.to_string();
        let path = ds.snapshot_path(&at)?;
        chain.extend(path.iter().rev().map(|s| format!("{disk}@{s}")));
        match ds.disk_info(&disk)?.parent {
            Some(origin) if chain.len() < ANCESTRY_MAX && !chain.contains(&origin) => {
                chain.push(origin.clone());
                at = origin;
            }
            _ => return Ok(chain),
        }
    }
}

/// `target`'s mapped ranges, each with the depth of the layer that wrote
/// it: 1 + the first k where version k and version k+1 of [`ancestry`]
/// differ there (the last version is compared with an empty disk).
fn depths(ds: &dyn Datastore, target: &str) -> Result<Vec<(u64, u64, u32)>, Error> {
    let chain = ancestry(ds, target)?;
    // What no layer has claimed yet: the target's mapped ranges.
    let mut todo: Ranges = ds
        .changed_ranges(None, target)?
        .into_iter()
        .filter(|r| r.mapped)
        .map(|r| (r.offset, r.len))
        .collect();
    let mut out = Vec::new();
    for (k, version) in chain.iter().enumerate() {
        if todo.is_empty() {
            break;
        }
        let layer: Ranges = ds
            .changed_ranges(chain.get(k + 1).map(String::as_str), version)?
            .into_iter()
            .filter(|r| r.mapped)
            .map(|r| (r.offset, r.len))
            .collect();
        let (hit, rest) = split(&todo, &layer);
        out.extend(hit.into_iter().map(|(o, l)| (o, l, k as u32 + 1)));
        todo = rest;
    }
    out.sort_unstable();
    Ok(out)
}

/// Ascending, disjoint `(offset, length)` ranges.
type Ranges = Vec<(u64, u64)>;

/// `a` (ascending, disjoint) cut by `b` (the same): (the parts of `a` in
/// `b`, the parts not in `b`).
fn split(a: &[(u64, u64)], b: &[(u64, u64)]) -> (Ranges, Ranges) {
    let (mut inside, mut outside) = (Vec::new(), Vec::new());
    let mut j = 0;
    for &(o, l) in a {
        let end = o + l;
        let mut at = o;
        while j < b.len() && b[j].0 + b[j].1 <= at {
            j += 1;
        }
        let mut i = j;
        while at < end {
            match b.get(i) {
                Some(&(bo, bl)) if bo < end => {
                    if bo > at {
                        outside.push((at, bo - at));
                        at = bo;
                    }
                    let stop = (bo + bl).min(end);
                    if stop > at {
                        inside.push((at, stop - at));
                        at = stop;
                    }
                    if bo + bl <= end {
                        i += 1;
                    } else {
                        break;
                    }
                }
                _ => {
                    outside.push((at, end - at));
                    at = end;
                }
            }
        }
    }
    (inside, outside)
}

/// A snapshot's context, computed once, with its read-next flags.
struct Fixed(Vec<(u64, u64, u32)>, Option<u32>);

impl MetaContext for Fixed {
    fn extents(&self, offset: u64, len: u64) -> io::Result<Vec<(u64, u32)>> {
        Ok(runs(&self.0, offset, len))
    }

    fn read_next_flags(&self) -> Option<u32> {
        self.1
    }
}

/// The head's context, computed for each request.
struct Live {
    ds: Arc<dyn Datastore>,
    target: String,
    what: Values,
}

impl MetaContext for Live {
    fn extents(&self, offset: u64, len: u64) -> io::Result<Vec<(u64, u32)>> {
        Ok(runs(
            &self.what.ranges(&*self.ds, &self.target)?,
            offset,
            len,
        ))
    }

    fn read_next_flags(&self) -> Option<u32> {
        self.what.read_next_flags()
    }
}

/// `[offset, offset + len)` as runs of `(length, value)`, from ascending,
/// disjoint ranges (0 between them); neighbours of one value merged.
fn runs(ranges: &[(u64, u64, u32)], offset: u64, len: u64) -> Vec<(u64, u32)> {
    let end = offset + len;
    let mut out: Vec<(u64, u32)> = Vec::new();
    let mut push = |l: u64, v: u32| match out.last_mut() {
        Some(last) if last.1 == v => last.0 += l,
        _ => out.push((l, v)),
    };
    let mut at = offset;
    // The first range that ends after `offset`.
    let first = ranges.partition_point(|&(o, l, _)| o + l <= offset);
    for &(o, l, v) in &ranges[first..] {
        if o >= end {
            break;
        }
        if o > at {
            push(o - at, 0);
            at = o;
        }
        let stop = (o + l).min(end);
        if stop > at {
            push(stop - at, v);
            at = stop;
        }
    }
    if at < end {
        push(end - at, 0);
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn split_cuts_ranges_by_others() {
        let a = [(0, 100), (200, 100)];
        let b = [(50, 200), (290, 5)];
        assert_eq!(
            split(&a, &b),
            (
                vec![(50, 50), (200, 50), (290, 5)],
                vec![(0, 50), (250, 40), (295, 5)]
            )
        );
        assert_eq!(split(&a, &[]), (vec![], a.to_vec()));
        assert_eq!(split(&[], &b), (vec![], vec![]));
        // One b range spanning several a ranges.
        assert_eq!(split(&a, &[(0, 1000)]), (a.to_vec(), vec![]));
    }

    #[test]
    fn runs_cover_the_range_exactly() {
        let d = [(4096, 8192, DIRTY), (65536, 4096, DIRTY)];
        assert_eq!(
            runs(&d, 0, 1 << 20),
            [
                (4096, 0),
                (8192, DIRTY),
                (65536 - 12288, 0),
                (4096, DIRTY),
                ((1 << 20) - 69632, 0)
            ]
        );
        // Starting inside a dirty range, ending inside a clean one.
        assert_eq!(runs(&d, 8192, 8192), [(4096, DIRTY), (4096, 0)]);
        assert_eq!(runs(&[], 0, 4096), [(4096, 0)]);
        assert_eq!(runs(&d, 65536, 4096), [(4096, DIRTY)]);
        // Depths: neighbours of one value merge.
        assert_eq!(
            runs(&[(0, 4096, 2), (4096, 4096, 2), (8192, 4096, 1)], 0, 16384),
            [(8192, 2), (4096, 1), (4096, 0)]
        );
    }
}
