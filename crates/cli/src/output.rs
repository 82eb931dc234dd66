//! Everything the CLI prints on stdout: a typed answer ([`Response`],
//! [`VmdkResponse`]) rendered for people or as `--json`, and the progress
//! bars on stderr.
//!
//! The `--json` shapes are the payloads of the answers (no enum tag), with
//! object keys in sorted order as they have always been printed; scripts
//! and tests parse them, so a field keeps its name.
//!
//! It knows the answers only as strata-api's types (and strata-stats'
//! renderers for a `stats` answer), never the datastore or the server.

use std::fmt::Write as _;
use std::io::IsTerminal;
use std::iter::successors;

use serde_json::Value;
use strata_api::store::{CheckReport as StoreCheckReport, CompactReport, GcReport, Summary};
use strata_api::units::{human, limits_text, utc};
use strata_api::{
    AlarmEntry, AlarmState, AlarmStatus, CheckReport, DatastoreInfo, DatastoreView, DefragReport,
    DiffReport, DiskView, Error, ErrorKind, ExportDiffReport, ExportReport, ExportStats,
    FreeSpaceReport, GroupInfo, GroupSnapshotInfo, GroupSnapshotReport, ImportDiffReport,
    ImportReport, JobInfo, MoveReport, PoolLayout, PunchZeroReport, RangeKind, Response,
    ShrinkResult, SnapshotInfo, StoreDisk, VmdkCheckReport, VmdkInfo, VmdkResponse,
    VmdkServerStatus, FREE_EXTENT_CLASSES,
};

/// How to print an answer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Format {
    /// Lines and tables for people.
    Human,
    /// The answer as pretty-printed JSON (`--json`).
    Json,
}

/// An answer the CLI can print.
pub trait Render {
    /// Append the lines for people to `out`.
    fn human(&self, out: &mut String);
    /// The `--json` document.
    fn json(&self) -> Value;
}

/// The answer as it is printed in `format`, ending in a newline.
pub fn render(r: &dyn Render, format: Format) -> String {
    match format {
        Format::Human => {
            let mut out = String::new();
            r.human(&mut out);
            out
        }
        // Through a `Value`, so keys come out sorted as they always have.
        Format::Json => serde_json::to_string_pretty(&r.json()).expect("json") + "\n",
    }
}

/// Print the answer on stdout.
pub fn print(r: &dyn Render, format: Format) {
    stdout(&render(r, format));
}

/// Write `text` on stdout. A reader that went away (`strata list | head
/// -1`) ends the command quietly and successfully, as SIGPIPE ends a
/// shell tool (Rust ignores the signal, so the write fails instead);
/// another failure is an I/O error (exit 12).
pub fn stdout(text: &str) {
    use std::io::Write as _;
    let mut out = std::io::stdout().lock();
    if let Err(e) = out.write_all(text.as_bytes()).and_then(|()| out.flush()) {
        let gone = e.kind() == std::io::ErrorKind::BrokenPipe;
        if !gone {
            eprintln!("strata: error: stdout: {e}");
        }
        std::process::exit(if gone { 0 } else { 12 });
    }
}

/// `writeln!` into a `String`, which cannot fail (with `std::fmt::Write`
/// in scope, as for `writeln!`).
macro_rules! outln {
    ($out:expr, $($arg:tt)*) => {{
        let _ = writeln!($out, $($arg)*);
    }};
}

mod jobs;
mod keys;
mod schedules;
mod space;

pub use jobs::OneJob;

/// A block of `key: value` lines whose values start in one column; a key
/// too long for it keeps one space (`current snapshot: `).
struct Fields<'a> {
    out: &'a mut String,
    column: usize,
}

impl<'a> Fields<'a> {
    /// `status`, `init`, `attach`: values from column 14 (`provisioned:  `).
    fn status(out: &'a mut String) -> Self {
        Fields { out, column: 14 }
    }

    /// `info`: values from column 17 (`snapshot space:  `).
    fn disk(out: &'a mut String) -> Self {
        Fields { out, column: 17 }
    }

    fn put(&mut self, key: &str, value: std::fmt::Arguments<'_>) {
        outln!(self.out, "{key:<w$} {value}", w = self.column - 1);
    }
}

/// One line of a [`Fields`] block: `field!(f, "used:", "{used}")`.
macro_rules! field {
    ($fields:expr, $key:expr, $($value:tt)+) => {
        $fields.put($key, format_args!($($value)+))
    };
}

/// An optional name, `-` when there is none.
fn or_dash(s: &Option<String>) -> &str {
    s.as_deref().unwrap_or("-")
}

/// An optional part of a line: `part(x)`, or nothing without an `x`.
fn opt<T>(x: Option<T>, part: impl FnOnce(T) -> String) -> String {
    x.map(part).unwrap_or_default()
}

/// `text` if `cond`, else nothing: an optional remark on a line.
fn when(cond: bool, text: &str) -> &str {
    if cond {
        text
    } else {
        ""
    }
}

/// `, TEXT` after a line's figures; nothing for an empty text.
fn comma(text: &str) -> String {
    opt((!text.is_empty()).then_some(text), |t| format!(", {t}"))
}

impl Render for Response {
    fn human(&self, out: &mut String) {
        match self {
            Response::Datastore(i) => datastore(out, i),
            Response::Disks(disks) => disk_table(out, disks),
            Response::Disk(d) => disk(out, d),
            Response::Removed { name } => outln!(out, "removed {name}"),
            Response::Joined { attached, summary } => joined(out, *attached, summary),
            Response::Claimed(d) => claim(out, d, true),
            Response::Released(d) => claim(out, d, false),
            Response::StoreCheck(r) => store_check(out, r),
            Response::Diff(r) => diff(out, r),
            Response::Gc(r) => gc(out, r),
            Response::Compact(r) => compact(out, r),
            Response::Jobs(jobs) => jobs::table(out, jobs),
            Response::JobStarted(JobInfo { id, what, .. }) => outln!(
                out,
                "job {id} started: {what} (follow it with 'strata jobs')"
            ),
            Response::PunchZero(r) => punch_zero(out, r),
            Response::Defrag(r) => defrag(out, r),
            Response::DedupEstimate(r) => space::dedup_estimate(out, r),
            Response::Dedup(r) => space::dedup(out, r),
            Response::Compress(r) => space::compress(out, r),
            Response::FreeSpace(r) => free_space(out, r),
            Response::SnapshotCreated { disk, snapshot } => {
                outln!(out, "created snapshot {disk}@{}", snapshot.name)
            }
            Response::Snapshots(snaps) => snapshot_tree(out, snaps),
            Response::SnapshotDeleted { disk, snapshot } => {
                outln!(out, "deleted snapshot {disk}@{snapshot}")
            }
            Response::Check(r) => check(out, r),
            Response::Stats(exports) => stats(out, exports),
            Response::Import(r) => import(out, r),
            Response::Export(r) => export(out, r),
            Response::VmdkServer(s) => vmdk_server(out, s),
            Response::VmdkShrink(rs) => vmdk_shrink(out, rs),
            Response::Capacity { info, changed } => capacity(out, info, *changed),
            Response::Alarms(a) => alarm_list(out, a),
            Response::Events(es) if es.is_empty() => outln!(out, "no events"),
            Response::Events(es) => es.iter().for_each(|e| outln!(out, "{}", e.line())),
            Response::Moved(r) => moved(out, r),
            Response::Renamed { from, to } => outln!(out, "renamed {from} to {to}"),
            Response::VhostExports(v) => vhost_exports(out, v),
            Response::VhostRemoved(v) => outln!(
                out,
                "removed vhost-user-blk socket {} (it served {})",
                v.socket.display(),
                v.export
            ),
            r @ (Response::Groups(_)
            | Response::Group(_)
            | Response::GroupDeleted { .. }
            | Response::GroupSnapshotCreated(_)
            | Response::GroupSnapshots(_)
            | Response::GroupSnapshotDeleted { .. }
            | Response::GroupReverted { .. }) => {
                group(out, r);
            }
            Response::ExportDiff(r) => export_diff(out, r),
            Response::ImportDiff(r) => import_diff(out, r),
            Response::Schedules { schedules, served } => schedules::list(out, schedules, *served),
            Response::ScheduleRemoved { name } => {
                outln!(out, "removed schedule {name} (its snapshots stay)")
            }
            r @ (Response::Unlocked { .. } | Response::Locked { .. } | Response::Keys { .. }) => {
                keys::answer(out, r);
            }
        }
    }

    fn json(&self) -> Value {
        self.to_json()
    }
}

impl Render for VmdkResponse {
    fn human(&self, out: &mut String) {
        match self {
            VmdkResponse::Info(i) => vmdk_info(out, i),
            VmdkResponse::Check(r) => vmdk_check(out, r),
            VmdkResponse::Shrink(rs) => vmdk_shrink(out, rs),
        }
    }

    fn json(&self) -> Value {
        self.to_json()
    }
}

/// `punchzero`: what was scanned and given back.
fn punch_zero(out: &mut String, r: &PunchZeroReport) {
    let [scanned, released] = [r.scanned_bytes, r.released_bytes].map(human);
    let (disk, allocated) = (&r.disk, human(r.allocated_bytes));
    outln!(
        out,
        "{disk}: scanned {scanned}, released {released} of zero blocks; \
         {allocated} allocated"
    );
}

/// `move`: where the disk went, what was copied and how long I/O waited.
fn moved(out: &mut String, r: &MoveReport) {
    let MoveReport { disk, seconds, .. } = r;
    let (from, to, how) = (r.from.display(), r.to.display(), r.provisioning.as_str());
    outln!(
        out,
        "moved {disk} from {from} to {to} ({how}) in {seconds:.1} s"
    );
    let (copied, passes, held) = (human(r.copied_bytes), r.passes, r.switch_ms);
    let mirrored = when(r.mirrored, " (the last with client writes mirrored)");
    outln!(
        out,
        "  copied {copied} in {passes} passes{mirrored}; client I/O held {held:.1} ms at the switch"
    );
    if !r.snapshots.is_empty() {
        outln!(out, "  snapshots: {}", r.snapshots.join(", "));
    }
    for n in &r.notes {
        outln!(out, "  note: {n}");
    }
}

/// `init|attach --object-store`.
fn joined(out: &mut String, attached: bool, s: &Summary) {
    if attached {
        outln!(out, "attached {} to {}", s.local_dir.display(), s.url);
    } else {
        outln!(out, "initialised object-store datastore {}", s.url);
    }
    store_summary(out, s);
}

/// `export-diff`.
fn export_diff(out: &mut String, r: &ExportDiffReport) {
    let ExportDiffReport { target, file, .. } = r;
    let since = opt(r.base.as_ref(), |b| format!(" since {b}"));
    let [data, zeros] = [r.data_bytes, r.zero_bytes].map(human);
    let stream = r.stream_bytes;
    outln!(
        out,
        "exported {target}{since} to {file}: {data} of data, {zeros} of zeros, {stream} bytes \
         of stream"
    );
}

/// `import-diff`.
fn import_diff(out: &mut String, r: &ImportDiffReport) {
    let disk = &r.disk;
    let [data, zeros] = [r.data_bytes, r.zero_bytes].map(human);
    let grown = format!("; grown to {}", human(r.size_bytes));
    let grown = when(r.extended, &grown);
    let taken = opt(r.snapshot.as_ref(), |t| {
        format!("; snapshot {disk}@{t} taken")
    });
    let same = format!(" ({} of it held already, left shared)", human(r.same_bytes));
    let same = when(r.same_bytes > 0, &same);
    outln!(
        out,
        "applied to {disk}: {data} of data{same}, {zeros} of zeros{grown}{taken}"
    );
}

/// `vhost ls`: a socket a line, with its frontend.
fn vhost_exports(out: &mut String, v: &[strata_api::VhostExport]) {
    if v.is_empty() {
        return outln!(
            out,
            "no vhost-user-blk sockets ('strata vhost add DISK SOCKET' adds one)"
        );
    }
    for x in v {
        let who = match &x.client {
            Some(c) => format!("connected: {}", strata_server::clients::describe(c)),
            None => "no frontend connected".into(),
        };
        outln!(out, "{}  {}  {who}", x.socket.display(), x.export);
    }
}

/// `status`: the datastore's figures, who has disks open, then what its
/// kind cannot do.
fn datastore(out: &mut String, v: &DatastoreView) {
    datastore_figures(out, v);
    if !v.clients.is_empty() {
        let mut disks: Vec<&str> = v
            .clients
            .iter()
            .map(|c| c.export.split('@').next().unwrap_or_default())
            .collect();
        disks.sort_unstable();
        disks.dedup();
        let (n, d) = (v.clients.len(), disks.len());
        let s = |n: usize| if n == 1 { "" } else { "s" };
        outln!(out, "clients: {n} session{} on {d} disk{}", s(n), s(d));
        for c in &v.clients {
            outln!(out, "  {}", strata_server::clients::describe(c));
        }
    }
    // Last: what the kind never does is not news.
    if !v.cannot.is_empty() {
        let what: Vec<&str> = v.cannot.iter().map(|r| r.command.as_str()).collect();
        let what = what.join(", ");
        outln!(
            out,
            "not on this kind: {what} ('strata status --json' says why)"
        );
    }
}

/// An object store's summary and space, or a local datastore's space,
/// pool, alarms and state.
fn datastore_figures(out: &mut String, v: &DatastoreView) {
    let i = &v.info;
    if let Some(s) = &v.object_store {
        store_summary(out, s);
        store_space(out, i);
        return;
    }
    let f = &mut Fields::status(out);
    field!(f, "datastore:", "{}", i.location);
    local_space(f, i);
    field!(f, "disks:", "{} ({} snapshots)", i.disks, i.snapshots);
    if i.cache_mode == "none" {
        let how = "the pool is read and written with O_DIRECT";
        field!(f, "cache:", "none ({how})");
    }
    if let Some(l) = &i.layout {
        pool_layout(f, l);
    }
    for a in &i.alarms {
        alarm_line(f.out, a);
    }
    if i.reclaiming > 0 {
        let n = i.reclaiming;
        field!(f, "reclaiming:", "space of {n} deleted snapshots or disks");
    }
    if let Some(stop) = &i.fail_stop {
        let then = "writes are refused; restart the server to recover from the log";
        field!(f, "FAIL-STOPPED:", "{} ({then})", stop.cause);
    }
}

/// A local datastore's space: capacity, used, reserved (and held on the
/// host), readied ahead of first writes, free, provisioned.
fn local_space(f: &mut Fields, i: &DatastoreInfo) {
    let [capacity, used, free] = [i.capacity_bytes, i.used_bytes, i.free_bytes].map(human);
    let [reserved, held] = [i.reserved_bytes, i.reserved_held_bytes].map(human);
    let follows = when(i.capacity_follows_fs, " (capacity follows the file system)");
    field!(f, "capacity:", "{capacity}{follows}");
    match i.logical_bytes {
        Some(l) if l > i.used_bytes && i.used_bytes > 0 => {
            let x = l as f64 / i.used_bytes as f64;
            let shared = "snapshots, clones and dedup share the rest";
            field!(
                f,
                "used:",
                "{used} for {} of disks and snapshots ({x:.1}x: {shared})",
                human(l)
            );
        }
        _ => field!(f, "used:", "{used}"),
    }
    let how = format!("thick disks, not yet written; {held} held on the host");
    field!(f, "reserved:", "{reserved} ({how})");
    if i.readied_bytes > 0 {
        let how = "held on the host ahead of first writes";
        field!(f, "readied:", "{} ({how})", human(i.readied_bytes));
    }
    field!(f, "free:", "{free}");
    let (provisioned, pct) = (human(i.provisioned_bytes), i.overcommit_percent);
    field!(f, "provisioned:", "{provisioned} ({pct}% of capacity)");
}

/// The pool's layout, when the answer carries it: its size, free extents and what
/// the host holds.
fn pool_layout(f: &mut Fields, l: &PoolLayout) {
    let [pool, free, file] = [l.pool_bytes, l.free_in_pool_bytes, l.pool_file_bytes].map(human);
    let free = format!("{free} free in {} extents", l.free_extents);
    field!(f, "pool:", "{pool} ({free}), {file} on the host");
    let classes: Vec<String> = FREE_EXTENT_CLASSES
        .iter()
        .filter_map(|(c, _)| l.free_extent_histogram.get(*c).map(|n| format!("{c} {n}")))
        .collect();
    field!(f, "free extents:", "{}", classes.join(", "));
}

/// `ok`, or the state in capitals so it stands out.
fn alarm_state(s: AlarmState) -> String {
    match s {
        AlarmState::Ok => "ok".into(),
        other => other.as_str().to_ascii_uppercase(),
    }
}

/// One alarm at a glance: `usage alarm:  WARNING 78% (warning 75%, alarm 85%)`.
fn alarm_line(out: &mut String, a: &AlarmStatus) {
    let label = format!("{} alarm:", a.kind.as_str());
    let (state, percent) = (alarm_state(a.state), a.percent);
    let (warning, alarm) = (a.warning_percent, a.alarm_percent);
    outln!(
        out,
        "{label:<18}{state:<8}{percent}% (warning at {warning}%, alarm at {alarm}%)"
    );
}

/// `alarm list`: every alarm with its state, thresholds and command.
fn alarm_list(out: &mut String, alarms: &[AlarmEntry]) {
    outln!(out, "ALARM       STATE     PERCENT  WARNING  ALARM  EXEC");
    for AlarmEntry { status: s, exec } in alarms {
        let (kind, state, exec) = (s.kind.as_str(), alarm_state(s.state), or_dash(exec));
        let (percent, warning, alarm) = (s.percent, s.warning_percent, s.alarm_percent);
        outln!(
            out,
            "{kind:<12}{state:<9}{percent:>7}%{warning:>8}%{alarm:>6}%  {exec}"
        );
    }
}

/// `grow`: the capacity as set, or as it is and how to change it.
fn capacity(out: &mut String, i: &DatastoreInfo, changed: bool) {
    let [cap, used] = [i.capacity_bytes, i.used_bytes + i.reserved_bytes].map(human);
    let pct = i.used_percent;
    match (changed, i.capacity_follows_fs) {
        (true, true) => outln!(
            out,
            "capacity follows the file system again: {cap} now ({pct}% used)"
        ),
        (true, false) => outln!(
            out,
            "capacity set to {cap} ({used} used or reserved, {pct}%)"
        ),
        (false, true) => outln!(
            out,
            "capacity follows the file system: {cap} now (what the datastore holds plus the \
             file system's free space); growing the file system grows it, or set an \
             explicit capacity with 'strata grow --capacity SIZE'"
        ),
        (false, false) => outln!(
            out,
            "capacity is {cap} (explicit; {used} used or reserved, {pct}%): change it with \
             'strata grow --capacity SIZE', or follow the file system with \
             'strata grow --capacity fs'"
        ),
    }
}

/// `list`: a disk a line; an object store's disks with their writer.
fn disk_table(out: &mut String, disks: &[DiskView]) {
    // An object store's disks have a writer, and their allocation is
    // known to a GC mark ('strata gc --dry-run'), not to a listing.
    let store = disks.iter().any(|d| d.object_store.is_some());
    let mut row = |cells: [&str; 6], extra: &str| {
        let [name, size, kind, allocated, snaps, parent] = cells;
        let r = format!(
            "{name:<24} {size:>10} {kind:<17} {allocated:>10} {snaps:>5}  {parent:<16}{extra}"
        );
        outln!(out, "{}", r.trim_end());
    };
    let head = ["NAME", "SIZE", "TYPE", "ALLOCATED", "SNAPS", "PARENT"];
    row(head, when(store, "  GEN  WRITER"));
    for v in disks {
        let d = &v.info;
        let (size, snaps) = (human(d.size_bytes), d.snapshots.to_string());
        let (kind, parent) = (d.provisioning.as_str(), &parent_text(d));
        let allocated = d.allocated_bytes.map_or_else(|| "-".into(), human);
        let extra = opt(v.object_store.as_ref(), |w| {
            format!("  {:>3}  {}", w.generation, writer(w))
        });
        row([&d.name, &size, kind, &allocated, &snaps, parent], &extra);
    }
}

/// A linked clone's parent, `vm@base (deleted)` once it went; `-` for none.
fn parent_text(d: &strata_api::DiskInfo) -> String {
    match &d.parent {
        Some(p) if d.parent_deleted => format!("{p} (deleted)"),
        Some(p) => p.clone(),
        None => "-".into(),
    }
}

/// Who writes an object-store disk, in a few words.
fn writer(w: &StoreDisk) -> String {
    let who = match &w.owner {
        Some(o) if o.is_host() => format!(
            "{} (host {}, no process: claimed with no server running; its next server writes it)",
            o.name, o.host
        ),
        Some(o) => format!("{} (host {}, pid {})", o.name, o.host, o.pid),
        None => "none yet (the first host to write claims it)".into(),
    };
    match &w.fenced {
        Some(why) => format!("{who}; fenced here: {why}"),
        None => who,
    }
}

/// `info`: a disk's figures, and an object-store disk's writer record.
fn disk(out: &mut String, v: &DiskView) {
    let d = &v.info;
    // A size for people, then exact.
    let bytes = |b: u64, what: &str| format!("{} ({b} bytes{what})", human(b));
    let f = &mut Fields::disk(out);
    field!(f, "name:", "{}", d.name);
    field!(f, "size:", "{}", bytes(d.size_bytes, ""));
    field!(f, "provisioning:", "{}", d.provisioning.as_str());
    if let Some(e) = &d.encryption {
        field!(f, "encrypted:", "{}", keys::summary(e));
    }
    if let Some(a) = d.allocated_bytes {
        field!(f, "allocated:", "{}", bytes(a, ""));
    }
    if let (Some(nb), Some(tbz)) = (d.nb, d.tbz) {
        field!(f, "nb / tbz:", "{nb} / {tbz} (1 MiB blocks)");
    }
    if let Some(n) = d.fragments {
        let how = "1 = laid out in one run; 'strata defrag' lays it out";
        field!(f, "fragments:", "{n} ({how})");
    }
    if let Some(p) = d.packed_bytes.filter(|&p| p > 0) {
        field!(
            f,
            "packed:",
            "{}",
            bytes(p, " of the head's data, compressed")
        );
    }
    if let Some(x) = d.exclusive_bytes {
        field!(f, "exclusive:", "{}", bytes(x, ", freed by rm"));
    }
    field!(f, "snapshots:", "{}", d.snapshots);
    if let Some(x) = d.snapshot_space_bytes {
        let x = bytes(x, ", freed by deleting every snapshot");
        field!(f, "snapshot space:", "{x}");
    }
    field!(f, "current snapshot:", "{}", or_dash(&d.current_snapshot));
    field!(f, "parent:", "{}", parent_text(d));
    if !d.limits.is_none() {
        field!(f, "limits:", "{}", limits_text(&d.limits));
    }
    if let Some(w) = &v.object_store {
        field!(f, "object store:", "disk id {}", w.id);
        field!(f, "writer:", "{}", writer(w));
        field!(f, "generation:", "{}", w.generation);
        let (manifest, written) = (&w.manifest, utc(w.written_ms));
        field!(f, "manifest:", "{manifest} (written {written})");
        let how = "'strata gc --dry-run' shows each disk's bytes";
        field!(f, "allocated:", "known to a GC mark: {how}");
    }
    for c in &v.clients {
        field!(f, "open by:", "{}", strata_server::clients::describe(c));
    }
}

/// `info DISK@SNAP`: one snapshot of its disk's `snapshot list`, for
/// people as `info` shows a disk, as JSON as that list's entry.
pub struct OneSnapshot(String, SnapshotInfo);

impl OneSnapshot {
    /// Snapshot `target` (`DISK@SNAP`) in `list`, the answer of `snapshot list DISK`.
    pub fn of(list: Response, target: &str) -> Result<OneSnapshot, Error> {
        let (disk, name) = target.split_once('@').unwrap_or((target, ""));
        let found = match list {
            Response::Snapshots(all) => all.into_iter().find(|s| s.name == name),
            _ => None,
        };
        let missing = format!("disk '{disk}' has no snapshot named '{name}'");
        let info = found.ok_or_else(|| Error::new(ErrorKind::NotFound, missing))?;
        Ok(OneSnapshot(disk.into(), info))
    }
}

impl Render for OneSnapshot {
    fn human(&self, out: &mut String) {
        let (disk, s, f) = (&self.0, &self.1, &mut Fields::disk(out));
        let bytes = |b: u64| format!("{} ({b} bytes)", human(b));
        field!(f, "name:", "{disk}@{} (id {})", s.name, s.id);
        field!(f, "size:", "{}", bytes(s.size_bytes));
        if let (Some(m), Some(x)) = (s.mapped_bytes, s.exclusive_bytes) {
            field!(f, "mapped:", "{}", bytes(m));
            field!(f, "exclusive:", "{}, freed by deleting it", bytes(x));
        }
        field!(f, "taken:", "{}", utc(s.created_unix * 1000));
        field!(f, "parent:", "{}", or_dash(&s.parent));
        if !s.description.is_empty() {
            field!(f, "description:", "{}", s.description);
        }
        if let Some(g) = &s.group {
            field!(f, "group:", "{g} (its group snapshot deletes it)");
        }
        if s.current {
            field!(
                f,
                "current:",
                "yes (the disk's live state descends from it)"
            );
        }
    }

    fn json(&self) -> Value {
        serde_json::to_value(&self.1).expect("json")
    }
}

/// `claim` (`claimed`) and `release`: the disk's writer record now.
fn claim(out: &mut String, v: &DiskView, claimed: bool) {
    let name = &v.info.name;
    let (generation, owner, manifest) = match &v.object_store {
        Some(w) => (w.generation, w.owner.as_ref(), w.manifest.as_str()),
        None => (0, None, ""),
    };
    if !claimed {
        return outln!(
            out,
            "released disk {name} at generation {generation} (manifest {manifest}): this host \
             writes it no more; another takes it with 'strata claim {name} --handover'"
        );
    }
    let who = owner.map_or("", |o| o.name.as_str());
    let no_server = when(
        owner.is_some_and(|o| o.is_host()),
        " (no server runs here: the claim is the host's, and its next server writes the disk)",
    );
    outln!(
        out,
        "claimed disk {name}: this host ({who}) is its writer, generation {generation}{no_server}"
    );
}

/// The object store as this host sees it (`status`, `init`, `attach`).
fn store_summary(out: &mut String, s: &Summary) {
    let f = &mut Fields::status(out);
    field!(f, "datastore:", "{} (id {})", s.url, s.root.uuid);
    field!(f, "endpoint:", "{}", s.endpoint);
    let (by, at) = (&s.root.created_by, utc(s.root.created_ms));
    field!(f, "created by:", "{} (host {}) at {at}", by.name, by.host);
    let (me, host, dir) = (&s.me.name, &s.me.host, s.local_dir.display());
    field!(f, "this host:", "{me} (host {host}), local directory {dir}");
    if let Some(p) = &s.probe {
        let (accepted, racers, secs) = (p.accepted, p.racers, p.ms / 1000.0);
        field!(
            f,
            "conditional writes:",
            "honoured ({accepted} of {racers} concurrent creates of one key accepted; the race \
             took {secs:.1} s)"
        );
    }
    match s.disks.len() {
        0 => field!(f, "disks:", "none"),
        n => field!(f, "disks:", "{n} ({})", s.disks.join(", ")),
    }
    let (bytes, objects) = (human(s.disk_bytes), s.disk_objects);
    field!(f, "stored:", "{bytes} in {objects} objects");
    if let Some(c) = &s.cache {
        let [bytes, bound] = [c.bytes, c.bound_bytes].map(human);
        let (segments, hits, reads) = (c.segments, c.hits, c.hits + c.misses);
        let rate = format!(" ({:.1} %)", hits as f64 * 100.0 / reads as f64);
        let rate = when(reads > 0, &rate);
        let (evictions, damaged) = (c.evictions, c.damaged);
        field!(
            f,
            "cache:",
            "{bytes} of {bound} in {segments} segments; {hits} of {reads} reads hit{rate}; \
             {evictions} evicted, {damaged} damaged"
        );
    }
}

/// An object store's capacity (the user's figure), provisioned space and
/// alarms.
fn store_space(out: &mut String, i: &DatastoreInfo) {
    let f = &mut Fields::status(out);
    let (cap, pct) = (human(i.capacity_bytes), i.used_percent);
    if i.capacity_bytes == 0 {
        let how = "the usage alarm measures against one: 'strata grow --capacity SIZE'";
        field!(f, "capacity:", "none set ({how})");
    } else {
        field!(f, "capacity:", "{cap} (set by 'strata grow'; {pct}% used)");
    }
    let share = format!(", {}% of capacity", i.overcommit_percent);
    let share = when(i.capacity_bytes > 0, &share);
    let disks = format!("{} disks ({} snapshots)", i.disks, i.snapshots);
    let provisioned = human(i.provisioned_bytes);
    field!(f, "provisioned:", "{provisioned} in {disks}{share}");
    for a in &i.alarms {
        alarm_line(f.out, a);
    }
}

/// `diff`: a summary line, then one range per line (exact byte figures:
/// what a backup script would read).
fn diff(out: &mut String, r: &DiffReport) {
    let (target, base) = (&r.target, &r.base);
    let id = |i: Option<u64>| opt(i, |i| format!(" (id {i})"));
    let (target_id, base_id) = (id(r.target_id), id(r.base_id));
    let [data, zeros] = [r.data_bytes, r.zero_bytes].map(human);
    let [from, to] = [r.base_size_bytes, r.size_bytes].map(human);
    let extended = format!(" (extended from {from} to {to}: all of it counts)");
    let extended = when(r.base_size_bytes < r.size_bytes, &extended);
    outln!(
        out,
        "{target}{target_id} against {base}{base_id}: {data} of data, {zeros} of zeros{extended}"
    );
    let Some(ranges) = &r.ranges else { return };
    if ranges.is_empty() {
        return outln!(out, "no changes");
    }
    outln!(out, "          OFFSET         LENGTH  TYPE");
    for x in ranges {
        let kind = match x.kind {
            RangeKind::Data => "data",
            RangeKind::Zero => "zero",
        };
        outln!(out, "{:>16} {:>14}  {kind}", x.offset, x.length);
    }
}

/// `check` of an object store: what was read, and every error.
fn store_check(out: &mut String, r: &StoreCheckReport) {
    let (disks, snapshots, holds) = (r.disks, r.snapshots, r.holds);
    let (nodes, grains) = (r.nodes, r.grains);
    outln!(
        out,
        "checked {disks} disks, {snapshots} snapshots, {holds} holds: {nodes} map nodes and \
         {grains} grains read against their checksums"
    );
    for err in &r.errors {
        outln!(out, "error: {err}");
    }
    if r.errors.is_empty() {
        outln!(out, "no problems found");
    }
}

/// `compact DISK`: the disk's objects, and what was (or would be) rewritten.
fn compact(out: &mut String, r: &CompactReport) {
    let (disk, objects, candidates, pct) = (&r.disk, r.objects, r.candidates, r.below_pct);
    let [stored, live, candidate] = [r.stored_bytes, r.live_bytes, r.candidate_bytes].map(human);
    let [rewritten, emptied] = [r.rewritten_bytes, r.emptied_bytes].map(human);
    let (grains, segments, ms) = (r.rewritten_grains, r.segments, r.ms);
    let (moved, dropped) = (r.relocated_grains, r.dropped_grains);
    outln!(
        out,
        "{disk}: {objects} objects hold {stored} of which {live} live; {candidates} under {pct} % \
         live ({candidate})"
    );
    if r.dry_run {
        outln!(
            out,
            "would rewrite {rewritten} in {grains} grains, emptying {emptied} for gc to free"
        );
    } else if grains == 0 {
        outln!(out, "nothing to rewrite");
    } else {
        outln!(
            out,
            "rewrote {rewritten} ({grains} grains) into {segments} segments in {ms} ms: {moved} \
             moved, {dropped} written again meanwhile (kept where the newer write put them); \
             'strata gc' frees what they emptied"
        );
    }
}

/// `gc [--dry-run]`: the store's garbage, what was deleted, each disk's space.
fn gc(out: &mut String, r: &GcReport) {
    let [stored, live, garbage] = [r.stored_bytes, r.live_bytes, r.garbage_bytes].map(human);
    let (segments, garbage_segments, in_flight) =
        (r.segments, r.garbage_segments, r.in_flight_segments);
    let kept = format!(" ({in_flight} more may be uploads in flight: kept)");
    let kept = when(in_flight > 0, &kept);
    // Compress-at-seal's saving (FORMAT.md §18.6), where there is one.
    let packed = format!(
        " ({} uncompressed, {:.2}x)",
        human(r.live_plain_bytes),
        r.live_plain_bytes as f64 / r.live_bytes.max(1) as f64
    );
    let packed = when(r.live_plain_bytes > r.live_bytes, &packed);
    outln!(
        out,
        "stored {stored} in {segments} segments; live {live}{packed}; garbage {garbage} in \
         {garbage_segments} segments{kept}"
    );
    if r.sparse_objects > 0 {
        let (sparse, dead) = (r.sparse_objects, human(r.sparse_dead_bytes));
        outln!(
            out,
            "partly live: {sparse} objects under half live hold {dead} nothing reaches \
             (compaction would give it back)"
        );
    }
    let shares: Vec<String> = (r.live_share.iter().enumerate())
        .filter(|(_, n)| **n > 0)
        .map(|(i, n)| format!("{}-{}%: {n}", i * 10, i * 10 + 10))
        .collect();
    if !shares.is_empty() {
        outln!(out, "objects by live share: {}", shares.join(", "));
    }
    if r.dry_run {
        outln!(out, "dry run: nothing deleted");
    } else {
        let (segs, manifests) = (r.deleted_segments, r.deleted_manifests);
        outln!(out, "deleted {segs} segments and {manifests} old manifests");
    }
    for d in &r.disks {
        let [exclusive, referenced] = [d.exclusive_bytes, d.referenced_bytes].map(human);
        let name = &d.name;
        outln!(
            out,
            "  {name:<24} exclusive {exclusive:>10}  referenced {referenced:>10}"
        );
    }
}

/// `defrag [--dry-run]`: fragments before and after, what moved or stayed.
fn defrag(out: &mut String, r: &DefragReport) {
    let (disk, before, after) = (&r.disk, r.fragments_before, r.fragments_after);
    let (moved, regions) = (human(r.moved_bytes), r.regions_moved);
    if r.dry_run {
        return outln!(
            out,
            "{disk}: {before} fragments; defrag would move {moved} in {regions} regions of 1 MiB"
        );
    }
    outln!(
        out,
        "{disk}: {before} -> {after} fragments; moved {moved} in {regions} regions of 1 MiB"
    );
    if r.regions_skipped > 0 {
        let n = r.regions_skipped;
        outln!(
            out,
            "{n} regions left as they were: free space lies in short runs"
        );
    }
    if r.grains_kept > 0 {
        let n = r.grains_kept;
        outln!(
            out,
            "{n} grains left in place: a reference to them could not be accounted for (run \
             'strata check')"
        );
    }
}

/// `defrag --free-space`: the pool and its file before and after.
fn free_space(out: &mut String, r: &FreeSpaceReport) {
    let [pool, pool_after] = [r.pool_bytes_before, r.pool_bytes_after].map(human);
    let [file, file_after] = [r.pool_file_bytes_before, r.pool_file_bytes_after].map(human);
    let [used, moved, punched] = [r.used_bytes, r.moved_bytes, r.punched_bytes].map(human);
    outln!(
        out,
        "pool {pool} -> {pool_after}; on the host {file} -> {file_after} (used {used}); moved \
         {moved}, punched {punched}"
    );
    if r.repacked_bytes > 0 {
        let repacked = human(r.repacked_bytes);
        outln!(
            out,
            "{repacked} of compressed fragments moved down by repacking their streams"
        );
    }
    if r.short_runs_bytes > 0 {
        let short = human(r.short_runs_bytes);
        outln!(
            out,
            "{short} of free space lies in runs under 64 KiB, left alone while clients were \
             writing (some of it may be holes already); run it again when they are quieter"
        );
    }
    if let Some(n) = &r.note {
        outln!(out, "note: {n}");
    }
}

/// Snapshots as an indented tree; a mark says where the live state is.
fn snapshot_tree(out: &mut String, snaps: &[SnapshotInfo]) {
    if snaps.is_empty() {
        return outln!(out, "no snapshots");
    }
    // Parents above the snapshot; bounded in case the list has a loop.
    let parent = |name: &str| snaps.iter().find(|s| s.name == name)?.parent.as_deref();
    let parents = |name| successors(parent(name), |p| parent(p)).take(snaps.len() + 1);
    for sn in snaps {
        let (indent, name) = ("  ".repeat(parents(&sn.name).count()), &sn.name);
        let held = match (sn.mapped_bytes, sn.exclusive_bytes) {
            (Some(m), Some(x)) => format!("{}, {} exclusive", human(m), human(x)),
            // An object store's snapshot: what it holds is known to a
            // GC mark.
            _ => {
                let taken = utc(sn.created_unix * 1000);
                format!("{}, taken {taken}", human(sn.size_bytes))
            }
        };
        let description = comma(&sn.description);
        let here = when(sn.current, "  <- you are here");
        outln!(out, "{indent}{name}  ({held}{description}){here}");
    }
}

/// `check`: what was recounted, and the problems found.
fn check(out: &mut String, r: &CheckReport) {
    let (versions, nodes, grains) = (r.versions, r.map_nodes, r.data_grains);
    let used = human(r.used_bytes);
    outln!(
        out,
        "checked {versions} versions, {nodes} map nodes, {grains} data grains; {used} used"
    );
    if r.is_clean() {
        let why = "no leaked or doubly owned grain, accounting exact";
        return outln!(out, "clean: {why}");
    }
    let (n, leaked, low) = (r.errors.len(), r.leaked_grains, r.overshared_grains);
    outln!(
        out,
        "{n} problems ({leaked} leaked grains, {low} counted too low):"
    );
    for e in &r.errors {
        outln!(out, "  {e}");
    }
}

/// `stats`: each export's statistics under its name.
fn stats(out: &mut String, exports: &[ExportStats]) {
    if exports.is_empty() {
        let why = "no client has used a disk since the server started";
        outln!(out, "no statistics yet: {why}");
    }
    for e in exports {
        outln!(out, "=== {}", e.export);
        out.push_str(&strata_stats::render_text(&e.stats));
    }
}

/// `import`: the new disk, and the snapshots a VMDK chain's links became.
fn import(out: &mut String, r: &ImportReport) {
    disk(out, &r.disk);
    if let Some(b) = &r.base {
        outln!(
            out,
            "from base '{}': {} equal and shared, {} written, {} unmapped",
            b.base,
            human(b.same_bytes),
            human(b.written_bytes),
            human(b.unmapped_bytes)
        );
    }
    if !r.snapshots.is_empty() {
        let (links, snaps) = (r.snapshots.len() + 1, r.snapshots.join(", "));
        outln!(
            out,
            "imported {links} links; snapshots (base first): {snaps}"
        );
    }
}

/// `export`: the files written, and the one to open.
fn export(out: &mut String, r: &ExportReport) {
    for l in &r.links {
        outln!(out, "wrote {} ({}) from {}", l.file, l.subformat, l.version);
    }
    outln!(out, "open {}", r.open);
}

/// `status` of a VMDK-only server: who it is and what it serves.
fn vmdk_server(out: &mut String, s: &VmdkServerStatus) {
    let f = &mut Fields::status(out);
    field!(f, "server:", "{} (pid {})", s.server, s.pid);
    let ro = when(s.read_only, ", read-only");
    field!(f, "export:", "{} ({}{ro})", s.export, s.file);
}

/// `vmdk info`: the chain, each parent indented below its child, with
/// their extents.
fn vmdk_info(out: &mut String, i: &VmdkInfo) {
    outln!(out, "size: {} ({} links)", human(i.size_bytes), i.depth);
    for (depth, l) in i.links.iter().enumerate() {
        let (indent, file, kind) = ("  ".repeat(depth), &l.file, &l.create_type);
        let (cid, parent) = (l.cid, l.parent_cid);
        outln!(
            out,
            "{indent}{file}  {kind}  CID {cid:08x} parentCID {parent:08x}"
        );
        for e in &l.extents {
            let (kind, sectors, format, file) = (&e.line_type, e.sectors, &e.format, &e.file);
            outln!(
                out,
                "{indent}  extent {kind} {sectors} sectors: {format} {file}"
            );
        }
    }
}

/// `vmdk check [--repair]`: each file's grains and messages.
fn vmdk_check(out: &mut String, r: &VmdkCheckReport) {
    for f in &r.files {
        let (file, c) = (&f.file, &f.check);
        let (allocated, zero, unmapped) = (c.allocated_grains, c.zero_grains, c.unmapped_grains);
        outln!(
            out,
            "{file}: {allocated} allocated, {zero} zero, {unmapped} unmapped grains"
        );
        for (label, messages) in [
            ("error", &c.errors),
            ("warning", &c.warnings),
            ("repaired", &c.repaired),
        ] {
            for m in messages {
                outln!(out, "  {label}: {m}");
            }
        }
    }
    match r.remaining_errors {
        0 => outln!(out, "no errors remain"),
        n => outln!(out, "{n} errors remain"),
    }
}

/// `vmdk shrink`: an SEsparse extent a line.
fn vmdk_shrink(out: &mut String, rs: &[ShrinkResult]) {
    for r in rs {
        let [before, after] = [r.bytes_before, r.bytes_after].map(human);
        let (moved, zeros) = (r.moved, r.zero_grains_found);
        outln!(
            out,
            "shrunk from {before} to {after} ({moved} grains moved, {zeros} all-zero grains \
             turned into zero entries)"
        );
    }
}

/// A progress bar on stderr when `show` and stderr is a terminal.
pub fn progress_bar(show: bool, template: &str) -> Option<indicatif::ProgressBar> {
    if !show || !std::io::stderr().is_terminal() {
        return None;
    }
    let b = indicatif::ProgressBar::new(0);
    b.set_style(
        indicatif::ProgressStyle::with_template(template)
            .expect("template")
            .progress_chars("=> "),
    );
    Some(b)
}

/// A consistency group answer for people; None for any other answer.
fn group(out: &mut String, r: &Response) -> Option<()> {
    match r {
        Response::Groups(gs) if gs.is_empty() => outln!(out, "no groups"),
        Response::Groups(gs) => {
            for g in gs {
                let (name, n, disks) = (&g.name, g.disks.len(), g.disks.join(", "));
                let (snaps, hook) = (g.snapshots, opt(hook(g), |h| format!("  hook: {h}")));
                outln!(
                    out,
                    "{name}  {n} disk(s): {disks}  {snaps} snapshot(s){hook}"
                );
            }
        }
        Response::Group(g) => {
            outln!(out, "group {}", g.name);
            outln!(out, "  disks: {}", g.disks.join(", "));
            outln!(out, "  snapshots: {}", g.snapshots);
            if let Some(h) = hook(g) {
                outln!(out, "  quiesce hook: {h}");
            }
        }
        Response::GroupDeleted { name } => outln!(out, "removed group {name}"),
        Response::GroupSnapshotCreated(r) => created(out, r),
        Response::GroupSnapshots(ss) if ss.is_empty() => outln!(out, "no group snapshots"),
        Response::GroupSnapshots(ss) => ss.iter().for_each(|s| snapshot(out, s)),
        Response::GroupSnapshotDeleted { group, snapshot } => outln!(
            out,
            "deleted group snapshot {group}@{snapshot} (every member's)"
        ),
        Response::GroupReverted {
            group,
            snapshot,
            disks,
        } => {
            let names: Vec<&str> = disks.iter().map(|d| d.info.name.as_str()).collect();
            let (n, names) = (names.len(), names.join(", "));
            outln!(
                out,
                "reverted {n} disk(s) of group {group} to {snapshot}: {names}"
            )
        }
        _ => return None,
    }
    Some(())
}

/// A pause for people: µs below a millisecond.
fn held(us: u64) -> String {
    if us < 1000 {
        format!("{us} µs")
    } else {
        format!("{:.1} ms", us as f64 / 1000.0)
    }
}

/// The group's quiesce hook and its timeout, if it has one.
fn hook(g: &GroupInfo) -> Option<String> {
    let timeout = opt(g.quiesce_timeout_s, |t| format!(" (timeout {t} s)"));
    g.quiesce_hook.as_ref().map(|h| format!("{h}{timeout}"))
}

/// `group snapshot`: the cut, and what the hook reported.
fn created(out: &mut String, r: &GroupSnapshotReport) {
    let s = &r.snapshot;
    let (group, name, n) = (&s.group, &s.name, s.members.len());
    let (consistency, held) = (s.consistency.as_str(), held(s.pause_us));
    outln!(
        out,
        "created group snapshot {group}@{name} on {n} disk(s): {consistency} consistent, I/O held \
         {held}"
    );
    if let Some(e) = s.quiesce.as_ref().and_then(|q| q.error.as_ref()) {
        outln!(out, "  quiesce hook: {e}");
    }
    if let Some(e) = r.unquiesce.as_ref().and_then(|u| u.error.as_ref()) {
        outln!(out, "  warning: unquiesce: {e}");
    }
}

/// `group snapshot list`: a group snapshot, then each member's snapshot.
fn snapshot(out: &mut String, s: &GroupSnapshotInfo) {
    let (group, name, id) = (&s.group, &s.name, s.id);
    let (consistency, taken) = (s.consistency.as_str(), utc(s.created_unix * 1000));
    let held = held(s.pause_us);
    let frees = opt(s.exclusive_bytes, |x| {
        format!(", deleting it frees {}", human(x))
    });
    let description = comma(&s.description);
    outln!(
        out,
        "{group}@{name} (id {id})  {consistency} consistent, taken {taken}, I/O held \
         {held}{frees}{description}"
    );
    for m in &s.members {
        let (disk, snapshot, id) = (&m.disk, &m.snapshot, m.id);
        let exclusive = opt(m.exclusive_bytes, |x| format!(", {} exclusive", human(x)));
        outln!(out, "  {disk}@{snapshot} (id {id}){exclusive}");
    }
}
