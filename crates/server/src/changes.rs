//! `strata diff`: where one version of a disk differs from a base, for
//! incremental backups (docs/BACKUP.md). The datastore compares maps
//! (`changed_ranges`); this module resolves the base (a snapshot by name
//! or id, or another version that shares history), refuses one that does
//! not exist, and counts everything past the base's size as changed.

use strata_api::{DiffRange, DiffReport, RangeKind};
use strata_datastore::{ChangedRange, Datastore};
use strata_engine::{Error, ErrorKind};
use strata_format::split_target;

/// A version as the diff names it: its target string, snapshot id and
/// size.
struct Version {
    target: String,
    id: Option<u64>,
    size_bytes: u64,
}

/// A full backup is the way on when the base is gone: said in every
/// refusal of a missing base.
const FULL: &str = "an incremental backup needs its base: take a full one";

/// `target` (`DISK` or `DISK@SNAP`) against `from` (docs/BACKUP.md, BASE).
pub fn diff(
    ds: &dyn Datastore,
    target: &str,
    from: &str,
    totals: bool,
) -> Result<DiffReport, Error> {
    let disk = split_target(target).0;
    let to = version(ds, target)?;
    let base = base(ds, disk, from)?;
    let changed = ds.changed_ranges(Some(&base.target), &to.target)?;
    let ranges = past_base(&changed, base.size_bytes, to.size_bytes);
    let sum = |k: RangeKind| -> u64 {
        ranges
            .iter()
            .filter(|r| r.kind == k)
            .map(|r| r.length)
            .sum()
    };
    Ok(DiffReport {
        disk: disk.to_string(),
        data_bytes: sum(RangeKind::Data),
        zero_bytes: sum(RangeKind::Zero),
        target: to.target,
        base: base.target,
        target_id: to.id,
        base_id: base.id,
        size_bytes: to.size_bytes,
        base_size_bytes: base.size_bytes,
        ranges: (!totals).then_some(ranges),
    })
}

/// `target` as it exists now, with its snapshot id and size.
fn version(ds: &dyn Datastore, target: &str) -> Result<Version, Error> {
    match split_target(target) {
        (disk, None) => Ok(Version {
            target: disk.to_string(),
            id: None,
            size_bytes: ds.disk_info(disk)?.size_bytes,
        }),
        (disk, Some(snap)) => {
            let s = ds
                .snapshots(disk)?
                .into_iter()
                .find(|s| s.name == snap)
                .ok_or_else(|| {
                    Error::new(
                        ErrorKind::NotFound,
                        format!("disk '{disk}' has no snapshot '{snap}'"),
                    )
                })?;
            Ok(Version {
                target: target.to_string(),
                id: Some(s.id),
                size_bytes: s.size_bytes,
            })
        }
    }
}

/// BASE of a diff of `disk`: `id:N` or a snapshot name of `disk`, else
/// another version (`OTHER`, `OTHER@SNAP`).
fn base(ds: &dyn Datastore, disk: &str, from: &str) -> Result<Version, Error> {
    let missing = |what: String| Error::new(ErrorKind::NotFound, format!("{what}: {FULL}"));
    if let Some(n) = from.strip_prefix("id:") {
        let id: u64 = n.parse().map_err(|_| {
            Error::new(
                ErrorKind::InvalidArgument,
                format!("'{from}': a snapshot id is id:N with N a number"),
            )
        })?;
        let s = ds
            .snapshots(disk)?
            .into_iter()
            .find(|s| s.id == id)
            .ok_or_else(|| {
                missing(format!(
                    "disk '{disk}' has no snapshot with id {id} (deleted; a snapshot of the same \
                     name taken since has another id)"
                ))
            })?;
        return version(ds, &format!("{disk}@{}", s.name));
    }
    if !from.contains('@') {
        if ds.snapshots(disk)?.iter().any(|s| s.name == from) {
            return version(ds, &format!("{disk}@{from}"));
        }
        if from != disk && ds.exists(from) {
            return version(ds, from);
        }
        return Err(missing(format!(
            "disk '{disk}' has no snapshot '{from}' (and there is no disk of that name)"
        )));
    }
    version(ds, from).map_err(|e| match e.kind {
        ErrorKind::NotFound => missing(e.message),
        _ => e,
    })
}

/// The changed ranges as a diff reports them: below the base's size as
/// the maps say; from it to the target's size everything, `data` where the
/// target maps data and `zero` elsewhere. Merged, ascending.
fn past_base(changed: &[ChangedRange], base_size: u64, size: u64) -> Vec<DiffRange> {
    let kind = |mapped: bool| {
        if mapped {
            RangeKind::Data
        } else {
            RangeKind::Zero
        }
    };
    let mut out: Vec<DiffRange> = Vec::new();
    let mut push = |offset: u64, end: u64, kind: RangeKind| {
        if end <= offset {
            return;
        }
        match out.last_mut() {
            Some(r) if r.offset + r.length == offset && r.kind == kind => r.length = end - r.offset,
            _ => out.push(DiffRange {
                offset,
                length: end - offset,
                kind,
            }),
        }
    };
    // Where the base ends, what is not data reads as zeros the base never had.
    let mut at = base_size.min(size);
    for r in changed {
        let (start, end) = (r.offset, (r.offset + r.len).min(size));
        if end <= base_size {
            push(start, end, kind(r.mapped));
            continue;
        }
        if start < base_size {
            push(start, base_size, kind(r.mapped));
        }
        let start = start.max(base_size);
        push(at, start, RangeKind::Zero);
        push(start, end, kind(r.mapped));
        at = at.max(end);
    }
    push(at, size, RangeKind::Zero);
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn r(offset: u64, len: u64, mapped: bool) -> ChangedRange {
        ChangedRange {
            offset,
            len,
            mapped,
        }
    }

    fn d(offset: u64, length: u64, data: bool) -> DiffRange {
        DiffRange {
            offset,
            length,
            kind: if data {
                RangeKind::Data
            } else {
                RangeKind::Zero
            },
        }
    }

    #[test]
    fn everything_past_the_base_counts_and_ranges_merge() {
        // Same size: as the maps say.
        assert_eq!(
            past_base(&[r(0, 4096, true), r(8192, 4096, false)], 1 << 20, 1 << 20),
            [d(0, 4096, true), d(8192, 4096, false)]
        );
        // Extended from 1 MiB to 2 MiB, with data written at 1.5 MiB and a
        // range straddling the old end.
        let m = 1u64 << 20;
        assert_eq!(
            past_base(
                &[r(m - 4096, 8192, true), r(m + m / 2, 4096, true)],
                m,
                2 * m
            ),
            [
                d(m - 4096, 8192, true),
                d(m + 4096, m / 2 - 4096, false),
                d(m + m / 2, 4096, true),
                d(m + m / 2 + 4096, m / 2 - 4096, false)
            ]
        );
        // Nothing written past the old end: all of it zeros, merged with
        // a zero range before it.
        assert_eq!(
            past_base(&[r(m - 4096, 4096, false)], m, 2 * m),
            [d(m - 4096, m + 4096, false)]
        );
        // A base larger than the target (compared the other way): cut.
        assert_eq!(
            past_base(&[r(0, 4096, true), r(2 * m, 4096, true)], 4 * m, m),
            [d(0, 4096, true)]
        );
    }
}
