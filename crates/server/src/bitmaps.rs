//! NBD metadata contexts `qemu:dirty-bitmap:BASE` (docs/BACKUP.md): what
//! backup clients that speak QEMU's protocol (libvirt's pull-mode backup,
//! virtnbdbackup, `qemu-img map --image-opts ...,x-dirty-bitmap=`, nbdinfo)
//! read to copy only what changed. strata keeps no per-write bitmap: the
//! bitmap of export `DISK@SNAP` against BASE is `strata diff DISK@SNAP
//! --from BASE`, every range of it (data or zeros) dirty.
//!
//! A snapshot never changes, so its bitmap is computed once, when a client
//! selects it, and answered from memory. The head's is a live view,
//! recomputed for each BLOCK_STATUS (backups read a snapshot).

use std::io;
use std::sync::Arc;

use strata_datastore::Datastore;
use strata_format::split_target;
use strata_nbd::MetaContext;

use crate::api::DiffRange;

/// The prefix of the contexts this module offers.
pub const PREFIX: &str = "qemu:dirty-bitmap:";

/// The bit QEMU defines for a dirty range.
const DIRTY: u32 = 1;

/// The contexts of export `target` of `ds`: one per other snapshot of its
/// disk (the snapshots a client can have backed up before).
pub fn names(ds: &dyn Datastore, target: &str) -> Vec<String> {
    let (disk, snap) = split_target(target);
    match ds.snapshots(disk) {
        Ok(list) => list
            .into_iter()
            .filter(|s| Some(s.name.as_str()) != snap)
            .map(|s| format!("{PREFIX}{}", s.name))
            .collect(),
        Err(_) => Vec::new(),
    }
}

/// Context `name` of export `target`, or None if it is not one of
/// [`names`] (or its base vanished meanwhile).
pub fn open(ds: Arc<dyn Datastore>, target: &str, name: &str) -> Option<Arc<dyn MetaContext>> {
    let base = name.strip_prefix(PREFIX)?;
    if !names(&*ds, target).iter().any(|n| n == name) {
        return None;
    }
    let target = target.to_string();
    let base = base.to_string();
    if split_target(&target).1.is_some() {
        let ranges = dirty(&*ds, &target, &base).ok()?;
        return Some(Arc::new(Fixed(ranges)));
    }
    Some(Arc::new(Live { ds, target, base }))
}

/// The dirty ranges of `target` against `base`, ascending.
fn dirty(ds: &dyn Datastore, target: &str, base: &str) -> io::Result<Vec<(u64, u64)>> {
    let r =
        crate::changes::diff(ds, target, base, false).map_err(|e| io::Error::other(e.message))?;
    Ok(r.ranges
        .unwrap_or_default()
        .iter()
        .map(|x: &DiffRange| (x.offset, x.length))
        .collect())
}

/// A snapshot's bitmap, computed once.
struct Fixed(Vec<(u64, u64)>);

impl MetaContext for Fixed {
    fn extents(&self, offset: u64, len: u64) -> io::Result<Vec<(u64, u32)>> {
        Ok(runs(&self.0, offset, len))
    }
}

/// The head's bitmap, computed for each request.
struct Live {
    ds: Arc<dyn Datastore>,
    target: String,
    base: String,
}

impl MetaContext for Live {
    fn extents(&self, offset: u64, len: u64) -> io::Result<Vec<(u64, u32)>> {
        Ok(runs(
            &dirty(&*self.ds, &self.target, &self.base)?,
            offset,
            len,
        ))
    }
}

/// `[offset, offset + len)` as runs of `(length, DIRTY or 0)`, from
/// ascending, disjoint dirty ranges.
fn runs(dirty: &[(u64, u64)], offset: u64, len: u64) -> Vec<(u64, u32)> {
    let end = offset + len;
    let mut out = Vec::new();
    let mut at = offset;
    // The first range that ends after `offset`.
    let first = dirty.partition_point(|&(o, l)| o + l <= offset);
    for &(o, l) in &dirty[first..] {
        if o >= end {
            break;
        }
        if o > at {
            out.push((o - at, 0));
            at = o;
        }
        let stop = (o + l).min(end);
        if stop > at {
            out.push((stop - at, DIRTY));
            at = stop;
        }
    }
    if at < end {
        out.push((end - at, 0));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn runs_cover_the_range_exactly() {
        let d = [(4096, 8192), (65536, 4096)];
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
    }
}
