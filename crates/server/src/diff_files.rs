//! `export-diff` and `import-diff` (docs/BACKUP.md): a version's changes
//! as a Ceph `rbd diff v1` stream, and such a stream applied to a disk.
//! Both stream (a file, or a pipe the CLI connects to its stdin or
//! stdout), both run as jobs with progress.

use std::fs::File;
use std::io::{BufReader, BufWriter};
use std::path::Path;

use strata_api::{ExportDiffReport, ImportDiffReport, RangeKind};
use strata_block::{BlockDevice, ZeroOptions};
use strata_datastore::Datastore;
use strata_engine::{Error, ErrorKind};
use strata_format::split_target;

use crate::copier::Work;
use crate::rbd_diff::{Reader, Record, Writer, WRITE_MAX};

fn io_err(what: &str, e: impl std::fmt::Display) -> Error {
    Error::new(ErrorKind::Io, format!("{what}: {e}"))
}

/// The stream's destination, and whether this export made it: a new
/// file (an existing one is refused, as `rbd export-diff` refuses it: an
/// export never replaces what an earlier one wrote), or an existing pipe
/// or device opened for writing (the CLI's pipe for `-`, `/dev/null`).
fn open_out(out: &Path) -> Result<(File, bool), Error> {
    let name = || out.display().to_string();
    match File::options().write(true).create_new(true).open(out) {
        Ok(f) => Ok((f, true)),
        Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {
            let t = std::fs::metadata(out)
                .map_err(|e| io_err(&name(), e))?
                .file_type();
            if t.is_file() || t.is_dir() {
                return Err(Error::new(
                    ErrorKind::AlreadyExists,
                    format!("{} already exists; export-diff does not overwrite it (remove it, or write to a new name)", name()),
                ));
            }
            let f = File::options()
                .write(true)
                .open(out)
                .map_err(|e| io_err(&name(), e))?;
            Ok((f, false))
        }
        Err(e) => Err(io_err(&name(), e)),
    }
}

/// Write `target`'s changes since `from` (None: everything it maps) to
/// `out` as an rbd diff v1 stream.
pub fn export(
    ds: &dyn Datastore,
    target: &str,
    from: Option<&str>,
    out: &Path,
    work: &mut Work<'_>,
) -> Result<ExportDiffReport, Error> {
    let (disk, snap) = split_target(target);
    let dev = ds.open(target)?;
    // (offset, length, data?) ascending.
    let (ranges, base, size): (Vec<(u64, u64, bool)>, Option<String>, u64) = match from {
        Some(f) => {
            let d = crate::changes::diff(ds, target, f, false)?;
            let ranges = d
                .ranges
                .unwrap_or_default()
                .iter()
                .map(|r| (r.offset, r.length, r.kind == RangeKind::Data))
                .collect();
            (ranges, Some(d.base), d.size_bytes)
        }
        None => {
            let ranges = ds
                .changed_ranges(None, target)?
                .into_iter()
                .filter(|r| r.mapped)
                .map(|r| (r.offset, r.len, true))
                .collect();
            (ranges, None, dev.size_bytes())
        }
    };
    // `f` names a snapshot of the same disk by its name, as rbd does;
    // another version by its full name.
    let f = base.as_deref().map(|b| match split_target(b) {
        (d, Some(s)) if d == disk => s,
        _ => b,
    });
    let (file, created) = open_out(out)?;
    let w = Writer::new(BufWriter::with_capacity(1 << 20, file), f, snap, size)
        .map_err(|e| io_err("write the diff", e));
    let wrote = w.and_then(|w| write_diff(w, &*dev, target, &ranges, work));
    // A failed or stopped export leaves no partial stream behind (in a
    // file it made; a pipe or device is not its own).
    let (data, zero, stream_bytes) = wrote.map_err(|e| {
        if !created {
            return work.stopped_leaving(e, "export it again");
        }
        let _ = std::fs::remove_file(out);
        work.stopped_leaving(e, "the partial diff was removed; export it again")
    })?;
    Ok(ExportDiffReport {
        target: target.to_string(),
        base,
        file: out.display().to_string(),
        size_bytes: size,
        data_bytes: data,
        zero_bytes: zero,
        stream_bytes,
    })
}

/// Write `ranges` of `dev` (`target`) into the stream `w` and end it:
/// (data bytes, zeroed bytes, stream bytes).
fn write_diff(
    mut w: Writer<BufWriter<File>>,
    dev: &dyn BlockDevice,
    target: &str,
    ranges: &[(u64, u64, bool)],
    work: &mut Work<'_>,
) -> Result<(u64, u64, u64), Error> {
    let total: u64 = ranges.iter().filter(|r| r.2).map(|r| r.1).sum();
    let (mut data, mut zero) = (0u64, 0u64);
    let mut buf = vec![0u8; WRITE_MAX];
    for &(offset, len, is_data) in ranges {
        work.checkpoint()?;
        if !is_data {
            w.zero(offset, len)
                .map_err(|e| io_err("write the diff", e))?;
            zero += len;
            continue;
        }
        let mut at = offset;
        while at < offset + len {
            let n = (offset + len - at).min(WRITE_MAX as u64) as usize;
            dev.read_at(&mut buf[..n], at)
                .map_err(|e| io_err(&format!("read {target} at {at}"), e))?;
            w.data(at, &buf[..n])
                .map_err(|e| io_err("write the diff", e))?;
            at += n as u64;
            data += n as u64;
            (work.progress)(data, total);
            work.checkpoint()?;
        }
    }
    let stream_bytes = w.written + 1;
    w.end().map_err(|e| io_err("write the diff", e))?;
    Ok((data, zero, stream_bytes))
}

/// Whether the stream whose header is `h` applies to `disk` (now
/// `disk_bytes` long): its `t` snapshot new, its `f` one the disk has and
/// does not differ from (unless `force`), its image no smaller. Returns
/// the size the disk will have.
fn check_applies(
    ds: &dyn Datastore,
    disk: &str,
    h: &crate::rbd_diff::Header,
    disk_bytes: u64,
    force: bool,
) -> Result<u64, Error> {
    let snaps = ds.snapshots(disk)?;
    if let Some(t) = &h.to {
        if snaps.iter().any(|s| &s.name == t) {
            return Err(Error::new(
                ErrorKind::AlreadyExists,
                format!("disk '{disk}' already has snapshot '{t}', which the diff would create (applied before?)"),
            ));
        }
    }
    if let Some(f) = &h.from {
        // A bare name is a snapshot of `disk` (`export-diff` writes
        // another version's as DISK@SNAP).
        let (base_disk, snap) = match split_target(f) {
            (d, Some(s)) => (d, s),
            (s, None) => (disk, s),
        };
        let base = format!("{base_disk}@{snap}");
        if base_disk == disk && !snaps.iter().any(|s| s.name == snap) {
            return Err(Error::new(
                ErrorKind::NotFound,
                format!(
                    "the diff starts from snapshot '{snap}', which disk '{disk}' does not have: \
                     apply the diffs before it first"
                ),
            ));
        }
        if !force {
            if let Some(c) = ds.changed_ranges(Some(&base), disk)?.first() {
                return Err(Error::new(
                    ErrorKind::Refused,
                    format!(
                        "disk '{disk}' differs from {base} (first at offset {}), where the diff \
                         starts: applied, it would not give its snapshot '{}'; --force applies it \
                         anyway",
                        c.offset,
                        h.to.as_deref().unwrap_or("-")
                    ),
                ));
            }
        }
    }
    let size = h.size.unwrap_or(disk_bytes);
    if size < disk_bytes {
        return Err(Error::new(
            ErrorKind::InvalidArgument,
            format!(
                "the diff's image is {}, smaller than disk '{disk}' ({}): strata disks do not \
                 shrink",
                strata_api::units::human_exact(size),
                strata_api::units::human_exact(disk_bytes)
            ),
        ));
    }
    Ok(size)
}

/// Apply the rbd diff stream at `path` to `disk`, then take its `t`
/// snapshot. Refused before anything changes: a bad header, a `t` the
/// disk has, an `f` it lacks, a disk that differs from `f` (unless
/// `force`), a size smaller than the disk's. A stream found bad later
/// leaves the disk as it was (it is reverted to a snapshot taken first).
pub fn import(
    ds: &dyn Datastore,
    path: &Path,
    disk: &str,
    force: bool,
    work: &mut Work<'_>,
) -> Result<ImportDiffReport, Error> {
    let name = path.display().to_string();
    let file = File::open(path).map_err(|e| io_err(&name, e))?;
    // A regular file's length gives the progress bar its end.
    let total = file
        .metadata()
        .ok()
        .filter(|m| m.is_file())
        .map(|m| m.len())
        .unwrap_or(0);
    let (mut r, h) = Reader::open(BufReader::with_capacity(1 << 20, file), &name)?;
    let info = ds.disk_info(disk)?;
    let size = check_applies(ds, disk, &h, info.size_bytes, force)?;
    // What the disk is now, to go back to if the stream turns out bad.
    let undo = format!("import-diff-undo-{:08x}", rand::random::<u32>());
    ds.snapshot_create(disk, &undo, "taken by import-diff; removed when it ends")?;
    let grown = match size > info.size_bytes {
        true => ds.extend(disk, size).map(drop),
        false => Ok(()),
    };
    let applied = grown.and_then(|()| apply(ds, disk, &mut r, total, work));
    let result = applied.and_then(|Applied { data, zero, same }| {
        ds.snapshot_delete(disk, &undo)?;
        if let Some(t) = &h.to {
            ds.snapshot_create(disk, t, "imported with strata import-diff")?;
        }
        Ok(ImportDiffReport {
            disk: disk.to_string(),
            from: h.from.clone(),
            snapshot: h.to.clone(),
            size_bytes: size,
            extended: size > info.size_bytes,
            data_bytes: data,
            zero_bytes: zero,
            same_bytes: same,
        })
    });
    let Err(e) = result else { return result };
    // Put the disk back; if that fails too, say so beside the first error.
    let undone = ds.snapshots(disk).and_then(|snaps| {
        if snaps.iter().any(|s| s.name == undo) {
            ds.snapshot_revert(disk, &undo)?;
            ds.snapshot_delete(disk, &undo)?;
        }
        Ok(())
    });
    Err(match undone {
        Ok(()) => e,
        Err(u) => Error::new(
            e.kind,
            format!(
                "{}; putting disk '{disk}' back to its snapshot {undo} failed too: {}",
                e.message, u.message
            ),
        ),
    })
}

/// Write the stream's records into `disk` (grown to the stream's size
/// already); `total`: the stream's length, for progress (0: unknown).
/// Returns the bytes applied (see [`Applied`]).
fn apply<R: std::io::Read>(
    ds: &dyn Datastore,
    disk: &str,
    r: &mut Reader<R>,
    total: u64,
    work: &mut Work<'_>,
) -> Result<Applied, Error> {
    let dev = ds.open(disk)?;
    let dev_err = |what: &str, at: u64, e: strata_block::BlockError| {
        io_err(&format!("{what} {disk} at {at}"), e)
    };
    let (mut data, mut zero, mut same) = (0u64, 0u64, 0u64);
    let mut buf = vec![0u8; WRITE_MAX];
    let mut cur = vec![0u8; WRITE_MAX];
    loop {
        work.checkpoint()?;
        match r.record()? {
            Record::Data { offset, len } => {
                let mut at = offset;
                while at < offset + len {
                    let n = (offset + len - at).min(WRITE_MAX as u64) as usize;
                    r.read_data(&mut buf[..n])?;
                    dev.read_at(&mut cur[..n], at)
                        .map_err(|e| dev_err("read", at, e))?;
                    same += write_differing(&*dev, &buf[..n], &cur[..n], at)
                        .map_err(|e| dev_err("write", at, e))?;
                    at += n as u64;
                }
                data += len;
            }
            Record::Zero { offset, len } => {
                let opts = ZeroOptions {
                    may_unmap: true,
                    fast_only: false,
                    fua: false,
                };
                dev.write_zeroes(offset, len, opts)
                    .map_err(|e| dev_err("zero", offset, e))?;
                zero += len;
            }
            Record::End => break,
        }
        (work.progress)(r.position(), total.max(r.position()));
    }
    dev.flush().map_err(|e| dev_err("flush", 0, e))?;
    // The end record is read too: all of the stream.
    (work.progress)(r.position(), total.max(r.position()));
    Ok(Applied { data, zero, same })
}

/// What `apply` wrote: bytes of data records, of zero records, and of the
/// data that equalled the disk's bytes already (not written).
struct Applied {
    data: u64,
    zero: u64,
    same: u64,
}

/// Write `new` at `at` where it differs from `now` (the disk's bytes
/// there), a grain-aligned piece at a time: a piece equal to what the disk
/// holds is not written, so it stays shared with the snapshots that hold
/// it (FORMAT.md §17.2a). Returns the bytes left unwritten.
fn write_differing(
    dev: &dyn BlockDevice,
    new: &[u8],
    now: &[u8],
    at: u64,
) -> Result<u64, strata_block::BlockError> {
    const GRAIN: u64 = 4096;
    let mut same = 0;
    let mut p = 0usize;
    while p < new.len() {
        let pos = at + p as u64;
        let end = (((pos / GRAIN) + 1) * GRAIN - at).min(new.len() as u64) as usize;
        if new[p..end] == now[p..end] {
            same += (end - p) as u64;
        } else {
            dev.write_at(&new[p..end], pos, false)?;
        }
        p = end;
    }
    Ok(same)
}
