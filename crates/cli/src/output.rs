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

use serde_json::Value;
use strata_api::store::{CheckReport as StoreCheckReport, CompactReport, GcReport, Summary};
use strata_api::units::{human, limits_text, utc};
use strata_api::{
    AlarmEntry, AlarmState, AlarmStatus, CheckReport, DatastoreInfo, DatastoreView, DefragReport,
    DiffReport, DiskView, ExportDiffReport, ExportReport, ExportStats, FreeSpaceReport,
    ImportDiffReport, ImportReport, JobInfo, MoveReport, PoolLayout, RangeKind, Response,
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
    print!("{}", render(r, format));
}

fn job_table(out: &mut String, jobs: &[JobInfo]) {
    if jobs.is_empty() {
        line(out, format_args!("no jobs"));
        return;
    }
    line(
        out,
        format_args!(
            "{:>4}  {:<10} {:>5}  {:>21}  WHAT",
            "ID", "STATE", "DONE", "PROGRESS"
        ),
    );
    for j in jobs {
        let state = format!("{:?}", j.state).to_lowercase();
        line(
            out,
            format_args!(
                "{:>4}  {:<10} {:>4}%  {:>21}  {}{}",
                j.id,
                state,
                j.percent,
                format!("{}/{}", human(j.done), human(j.total)),
                j.what,
                j.error
                    .as_ref()
                    .map(|e| format!(" ({e})"))
                    .unwrap_or_default()
            ),
        );
    }
}

/// `move`: where the disk went, what was copied and how long I/O waited.
fn moved(out: &mut String, r: &MoveReport) {
    line(
        out,
        format_args!(
            "moved {} from {} to {} ({}) in {:.1} s",
            r.disk,
            r.from.display(),
            r.to.display(),
            r.provisioning.as_str(),
            r.seconds
        ),
    );
    line(
        out,
        format_args!(
            "  copied {} in {} passes{}; client I/O held {:.1} ms at the switch",
            human(r.copied_bytes),
            r.passes,
            if r.mirrored {
                " (the last with client writes mirrored)"
            } else {
                ""
            },
            r.switch_ms
        ),
    );
    if !r.snapshots.is_empty() {
        line(out, format_args!("  snapshots: {}", r.snapshots.join(", ")));
    }
    for n in &r.notes {
        line(out, format_args!("  note: {n}"));
    }
}

/// `init|attach --object-store`.
fn joined(out: &mut String, attached: bool, summary: &Summary) {
    if attached {
        line(
            out,
            format_args!(
                "attached {} to {}",
                summary.local_dir.display(),
                summary.url
            ),
        );
    } else {
        line(
            out,
            format_args!("initialised object-store datastore {}", summary.url),
        );
    }
    store_summary(out, summary);
}

/// `export-diff`.
fn export_diff(out: &mut String, r: &ExportDiffReport) {
    line(
        out,
        format_args!(
            "exported {}{} to {}: {} of data, {} of zeros, {} bytes of stream",
            r.target,
            r.base
                .as_ref()
                .map(|b| format!(" since {b}"))
                .unwrap_or_default(),
            r.file,
            human(r.data_bytes),
            human(r.zero_bytes),
            r.stream_bytes
        ),
    )
}

/// `import-diff`.
fn import_diff(out: &mut String, r: &ImportDiffReport) {
    line(
        out,
        format_args!(
            "applied to {}: {} of data, {} of zeros{}{}",
            r.disk,
            human(r.data_bytes),
            human(r.zero_bytes),
            if r.extended {
                format!("; grown to {}", human(r.size_bytes))
            } else {
                String::new()
            },
            r.snapshot
                .as_ref()
                .map(|t| format!("; snapshot {}@{t} taken", r.disk))
                .unwrap_or_default()
        ),
    )
}

/// An optional name, `-` when there is none.
fn or_dash(s: &Option<String>) -> &str {
    s.as_deref().unwrap_or("-")
}

impl Render for Response {
    fn human(&self, out: &mut String) {
        match self {
            Response::Datastore(i) => datastore(out, i),
            Response::Disks(disks) => disk_table(out, disks),
            Response::Disk(d) => disk(out, d),
            Response::Removed { name } => line(out, format_args!("removed {name}")),
            Response::Joined { attached, summary } => joined(out, *attached, summary),
            Response::Claimed(d) => claim(out, d, true),
            Response::Released(d) => claim(out, d, false),
            Response::StoreCheck(r) => store_check(out, r),
            Response::Diff(r) => diff(out, r),
            Response::Gc(r) => gc(out, r),
            Response::Compact(r) => compact(out, r),
            Response::Jobs(jobs) => job_table(out, jobs),
            Response::JobStarted(j) => line(
                out,
                format_args!(
                    "job {} started: {} (follow it with 'strata jobs')",
                    j.id, j.what
                ),
            ),
            Response::PunchZero(r) => line(
                out,
                format_args!(
                    "{}: scanned {}, released {} of zero blocks; {} allocated",
                    r.disk,
                    human(r.scanned_bytes),
                    human(r.released_bytes),
                    human(r.allocated_bytes)
                ),
            ),
            Response::Defrag(r) => defrag(out, r),
            Response::FreeSpace(r) => free_space(out, r),
            Response::SnapshotCreated { disk, snapshot } => line(
                out,
                format_args!("created snapshot {disk}@{}", snapshot.name),
            ),
            Response::Snapshots(snaps) => snapshot_tree(out, snaps),
            Response::SnapshotDeleted { disk, snapshot } => {
                line(out, format_args!("deleted snapshot {disk}@{snapshot}"))
            }
            Response::Check(r) => check(out, r),
            Response::Stats(exports) => stats(out, exports),
            Response::Import(r) => import(out, r),
            Response::Export(r) => export(out, r),
            Response::VmdkServer(s) => vmdk_server(out, s),
            Response::VmdkShrink(rs) => vmdk_shrink(out, rs),
            Response::Capacity { info, changed } => capacity(out, info, *changed),
            Response::Alarms(a) => alarm_list(out, a),
            Response::Moved(r) => moved(out, r),
            r @ (Response::Groups(_)
            | Response::Group(_)
            | Response::GroupDeleted { .. }
            | Response::GroupSnapshotCreated(_)
            | Response::GroupSnapshots(_)
            | Response::GroupSnapshotDeleted { .. }
            | Response::GroupReverted { .. }) => {
                crate::group::render(out, r);
            }
            Response::ExportDiff(r) => export_diff(out, r),
            Response::ImportDiff(r) => import_diff(out, r),
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

fn line(out: &mut String, args: std::fmt::Arguments<'_>) {
    let _ = writeln!(out, "{args}");
}

fn datastore(out: &mut String, v: &DatastoreView) {
    datastore_figures(out, v);
    // Last: what the kind never does is not news.
    if !v.cannot.is_empty() {
        let what: Vec<&str> = v.cannot.iter().map(|r| r.command.as_str()).collect();
        let _ = writeln!(
            out,
            "not on this kind: {} ('strata status --json' says why)",
            what.join(", ")
        );
    }
}

fn datastore_figures(out: &mut String, v: &DatastoreView) {
    let i = &v.info;
    if let Some(s) = &v.object_store {
        store_summary(out, s);
        store_space(out, i);
        return;
    }
    let _ = writeln!(out, "datastore:    {}", i.location);
    local_space(out, i);
    let _ = writeln!(out, "disks:        {} ({} snapshots)", i.disks, i.snapshots);
    if i.cache_mode == "none" {
        let _ = writeln!(
            out,
            "cache:        none (the pool is read and written with O_DIRECT)"
        );
    }
    if let Some(l) = &i.layout {
        pool_layout(out, l);
    }
    for a in &i.alarms {
        alarm_line(out, a);
    }
    if i.reclaiming > 0 {
        let _ = writeln!(
            out,
            "reclaiming:   space of {} deleted snapshots or disks",
            i.reclaiming
        );
    }
    if let Some(f) = &i.fail_stop {
        let _ = writeln!(
            out,
            "FAIL-STOPPED: {} (writes are refused; restart the server to recover \
             from the log)",
            f.cause
        );
    }
}

/// A local datastore's space: capacity, used, reserved (and held on the
/// host), readied ahead of first writes, free, provisioned.
fn local_space(out: &mut String, i: &DatastoreInfo) {
    if i.capacity_follows_fs {
        let _ = writeln!(
            out,
            "capacity:     {} (capacity follows the file system)",
            human(i.capacity_bytes)
        );
    } else {
        let _ = writeln!(out, "capacity:     {}", human(i.capacity_bytes));
    }
    let _ = writeln!(out, "used:         {}", human(i.used_bytes));
    let _ = writeln!(
        out,
        "reserved:     {} (thick disks, not yet written; {} held on the host)",
        human(i.reserved_bytes),
        human(i.reserved_held_bytes)
    );
    if i.readied_bytes > 0 {
        let _ = writeln!(
            out,
            "readied:      {} (held on the host ahead of first writes)",
            human(i.readied_bytes)
        );
    }
    let _ = writeln!(out, "free:         {}", human(i.free_bytes));
    let _ = writeln!(
        out,
        "provisioned:  {} ({}% of capacity)",
        human(i.provisioned_bytes),
        i.overcommit_percent
    );
}

/// The pool's layout, when the answer carries it: its size, free extents and what
/// the host holds.
fn pool_layout(out: &mut String, l: &PoolLayout) {
    let _ = writeln!(
        out,
        "pool:         {} ({} free in {} extents), {} on the host",
        human(l.pool_bytes),
        human(l.free_in_pool_bytes),
        l.free_extents,
        human(l.pool_file_bytes)
    );
    let classes: Vec<String> = FREE_EXTENT_CLASSES
        .iter()
        .filter_map(|(c, _)| l.free_extent_histogram.get(*c).map(|n| format!("{c} {n}")))
        .collect();
    let _ = writeln!(out, "free extents: {}", classes.join(", "));
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
    let _ = writeln!(
        out,
        "{label:<18}{:<8}{}% (warning at {}%, alarm at {}%)",
        alarm_state(a.state),
        a.percent,
        a.warning_percent,
        a.alarm_percent
    );
}

fn alarm_list(out: &mut String, alarms: &[AlarmEntry]) {
    let _ = writeln!(
        out,
        "{:<12}{:<9}{:>8}{:>9}{:>7}  EXEC",
        "ALARM", "STATE", "PERCENT", "WARNING", "ALARM"
    );
    for a in alarms {
        let s = &a.status;
        let _ = writeln!(
            out,
            "{:<12}{:<9}{:>7}%{:>8}%{:>6}%  {}",
            s.kind.as_str(),
            alarm_state(s.state),
            s.percent,
            s.warning_percent,
            s.alarm_percent,
            a.exec.as_deref().unwrap_or("-")
        );
    }
}

fn capacity(out: &mut String, i: &DatastoreInfo, changed: bool) {
    let used = i.used_bytes + i.reserved_bytes;
    match (changed, i.capacity_follows_fs) {
        (true, true) => line(
            out,
            format_args!(
                "capacity follows the file system again: {} now ({}% used)",
                human(i.capacity_bytes),
                i.used_percent
            ),
        ),
        (true, false) => line(
            out,
            format_args!(
                "capacity set to {} ({} used or reserved, {}%)",
                human(i.capacity_bytes),
                human(used),
                i.used_percent
            ),
        ),
        (false, true) => line(
            out,
            format_args!(
                "capacity follows the file system: {} now (what the datastore holds plus the \
                 file system's free space); growing the file system grows it, or set an \
                 explicit capacity with 'strata grow --capacity SIZE'",
                human(i.capacity_bytes)
            ),
        ),
        (false, false) => line(
            out,
            format_args!(
                "capacity is {} (explicit; {} used or reserved, {}%): change it with \
                 'strata grow --capacity SIZE', or follow the file system with \
                 'strata grow --capacity fs'",
                human(i.capacity_bytes),
                human(used),
                i.used_percent
            ),
        ),
    }
}

fn disk_table(out: &mut String, disks: &[DiskView]) {
    // An object store's disks have a writer, and their allocation is
    // known to a GC mark ('strata gc --dry-run'), not to a listing.
    let store = disks.iter().any(|d| d.object_store.is_some());
    let mut row = |cells: [&str; 6], extra: String| {
        let r = format!(
            "{:<24} {:>10} {:<17} {:>10} {:>5}  {:<16}{extra}",
            cells[0], cells[1], cells[2], cells[3], cells[4], cells[5]
        );
        let _ = writeln!(out, "{}", r.trim_end());
    };
    let head = if store { "  GEN  WRITER" } else { "" };
    row(
        ["NAME", "SIZE", "TYPE", "ALLOCATED", "SNAPS", "PARENT"],
        head.into(),
    );
    for v in disks {
        let d = &v.info;
        let extra = match &v.object_store {
            Some(w) => format!("  {:>3}  {}", w.generation, writer(w)),
            None => String::new(),
        };
        row(
            [
                &d.name,
                &human(d.size_bytes),
                d.provisioning.as_str(),
                &d.allocated_bytes.map(human).unwrap_or_else(|| "-".into()),
                &d.snapshots.to_string(),
                or_dash(&d.parent),
            ],
            extra,
        );
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

fn disk(out: &mut String, v: &DiskView) {
    let d = &v.info;
    let _ = writeln!(out, "name:            {}", d.name);
    let _ = writeln!(
        out,
        "size:            {} ({} bytes)",
        human(d.size_bytes),
        d.size_bytes
    );
    let _ = writeln!(out, "provisioning:    {}", d.provisioning.as_str());
    if let Some(a) = d.allocated_bytes {
        let _ = writeln!(out, "allocated:       {} ({a} bytes)", human(a));
    }
    if let (Some(nb), Some(tbz)) = (d.nb, d.tbz) {
        let _ = writeln!(out, "nb / tbz:        {nb} / {tbz} (1 MiB blocks)");
    }
    if let Some(f) = d.fragments {
        let _ = writeln!(
            out,
            "fragments:       {f} (1 = laid out in one run; 'strata defrag' lays it out)"
        );
    }
    if let Some(x) = d.exclusive_bytes {
        let _ = writeln!(
            out,
            "exclusive:       {} ({x} bytes, freed by rm)",
            human(x)
        );
    }
    let _ = writeln!(out, "snapshots:       {}", d.snapshots);
    if let Some(x) = d.snapshot_space_bytes {
        let _ = writeln!(
            out,
            "snapshot space:  {} ({x} bytes, freed by deleting every snapshot)",
            human(x)
        );
    }
    let _ = writeln!(out, "current snapshot: {}", or_dash(&d.current_snapshot));
    let _ = writeln!(out, "parent:          {}", or_dash(&d.parent));
    if !d.limits.is_none() {
        let _ = writeln!(out, "limits:          {}", limits_text(&d.limits));
    }
    if let Some(w) = &v.object_store {
        let _ = writeln!(out, "object store:    disk id {}", w.id);
        let _ = writeln!(out, "writer:          {}", writer(w));
        let _ = writeln!(out, "generation:      {}", w.generation);
        let _ = writeln!(
            out,
            "manifest:        {} (written {})",
            w.manifest,
            utc(w.written_ms)
        );
        let _ = writeln!(
            out,
            "allocated:       known to a GC mark: 'strata gc --dry-run' shows each disk's bytes"
        );
    }
}

/// `claim` (`claimed`) and `release`: the disk's writer record now.
fn claim(out: &mut String, v: &DiskView, claimed: bool) {
    let name = &v.info.name;
    let w = v.object_store.clone().unwrap_or_else(|| StoreDisk {
        id: String::new(),
        generation: 0,
        owner: None,
        manifest: String::new(),
        written_ms: 0,
        fenced: None,
    });
    let _ = if claimed {
        let host = w.owner.as_ref().is_some_and(|o| o.is_host());
        let who = w.owner.map(|o| o.name).unwrap_or_default();
        writeln!(
            out,
            "claimed disk {name}: this host ({who}) is its writer, generation {}{}",
            w.generation,
            if host {
                " (no server runs here: the claim is the host's, and its next server writes the disk)"
            } else {
                ""
            }
        )
    } else {
        writeln!(
            out,
            "released disk {name} at generation {} (manifest {}): this host writes it no more; \
             another takes it with 'strata claim {name} --handover'",
            w.generation, w.manifest
        )
    };
}

/// The object store as this host sees it (`status`, `init`, `attach`).
fn store_summary(out: &mut String, s: &Summary) {
    let _ = writeln!(out, "datastore:    {} (id {})", s.url, s.root.uuid);
    let _ = writeln!(out, "endpoint:     {}", s.endpoint);
    let _ = writeln!(
        out,
        "created by:   {} (host {}) at {}",
        s.root.created_by.name,
        s.root.created_by.host,
        utc(s.root.created_ms)
    );
    let _ = writeln!(
        out,
        "this host:    {} (host {}), local directory {}",
        s.me.name,
        s.me.host,
        s.local_dir.display()
    );
    if let Some(p) = &s.probe {
        let _ = writeln!(
            out,
            "conditional writes: honoured ({} of {} concurrent creates of one key accepted; the race took {:.1} s)",
            p.accepted,
            p.racers,
            p.ms / 1000.0
        );
    }
    if s.disks.is_empty() {
        let _ = writeln!(out, "disks:        none");
    } else {
        let _ = writeln!(
            out,
            "disks:        {} ({})",
            s.disks.len(),
            s.disks.join(", ")
        );
    }
    let _ = writeln!(
        out,
        "stored:       {} in {} objects",
        human(s.disk_bytes),
        s.disk_objects
    );
    if let Some(c) = &s.cache {
        let reads = c.hits + c.misses;
        let _ = writeln!(
            out,
            "cache:        {} of {} in {} segments; {} of {} reads hit{}; {} evicted, {} damaged",
            human(c.bytes),
            human(c.bound_bytes),
            c.segments,
            c.hits,
            reads,
            if reads > 0 {
                format!(" ({:.1} %)", c.hits as f64 * 100.0 / reads as f64)
            } else {
                String::new()
            },
            c.evictions,
            c.damaged
        );
    }
}

/// An object store's capacity (the user's figure), provisioned space and
/// alarms.
fn store_space(out: &mut String, i: &DatastoreInfo) {
    if i.capacity_bytes == 0 {
        let _ = writeln!(
            out,
            "capacity:     none set (the usage alarm measures against one: \
             'strata grow --capacity SIZE')"
        );
    } else {
        let _ = writeln!(
            out,
            "capacity:     {} (set by 'strata grow'; {}% used)",
            human(i.capacity_bytes),
            i.used_percent
        );
    }
    let _ = writeln!(
        out,
        "provisioned:  {} in {} disks ({} snapshots){}",
        human(i.provisioned_bytes),
        i.disks,
        i.snapshots,
        if i.capacity_bytes > 0 {
            format!(", {}% of capacity", i.overcommit_percent)
        } else {
            String::new()
        }
    );
    for a in &i.alarms {
        alarm_line(out, a);
    }
}

/// `diff`: a summary line, then one range per line (exact byte figures:
/// what a backup script would read).
fn diff(out: &mut String, r: &DiffReport) {
    let id = |i: Option<u64>| i.map(|i| format!(" (id {i})")).unwrap_or_default();
    let _ = writeln!(
        out,
        "{}{} against {}{}: {} of data, {} of zeros{}",
        r.target,
        id(r.target_id),
        r.base,
        id(r.base_id),
        human(r.data_bytes),
        human(r.zero_bytes),
        if r.base_size_bytes < r.size_bytes {
            format!(
                " (extended from {} to {}: all of it counts)",
                human(r.base_size_bytes),
                human(r.size_bytes)
            )
        } else {
            String::new()
        }
    );
    let Some(ranges) = &r.ranges else { return };
    if ranges.is_empty() {
        let _ = writeln!(out, "no changes");
        return;
    }
    let _ = writeln!(out, "{:>16} {:>14}  TYPE", "OFFSET", "LENGTH");
    for x in ranges {
        let kind = match x.kind {
            RangeKind::Data => "data",
            RangeKind::Zero => "zero",
        };
        let _ = writeln!(out, "{:>16} {:>14}  {kind}", x.offset, x.length);
    }
}

fn store_check(out: &mut String, r: &StoreCheckReport) {
    let _ = writeln!(
        out,
        "checked {} disks, {} snapshots, {} holds: {} map nodes and {} grains read against \
         their checksums",
        r.disks, r.snapshots, r.holds, r.nodes, r.grains
    );
    for err in &r.errors {
        let _ = writeln!(out, "error: {err}");
    }
    if r.errors.is_empty() {
        out.push_str("no problems found\n");
    }
}

fn compact(out: &mut String, r: &CompactReport) {
    let _ = writeln!(
        out,
        "{}: {} objects hold {} of which {} live; {} under {} % live ({})",
        r.disk,
        r.objects,
        human(r.stored_bytes),
        human(r.live_bytes),
        r.candidates,
        r.below_pct,
        human(r.candidate_bytes)
    );
    if r.dry_run {
        let _ = writeln!(
            out,
            "would rewrite {} in {} grains, emptying {} for gc to free",
            human(r.rewritten_bytes),
            r.rewritten_grains,
            human(r.emptied_bytes)
        );
    } else if r.rewritten_grains == 0 {
        out.push_str("nothing to rewrite\n");
    } else {
        let _ = writeln!(
            out,
            "rewrote {} ({} grains) into {} segments in {} ms: {} moved, {} written again meanwhile \
             (kept where the newer write put them); 'strata gc' frees what they emptied",
            human(r.rewritten_bytes),
            r.rewritten_grains,
            r.segments,
            r.ms,
            r.relocated_grains,
            r.dropped_grains
        );
    }
}

fn gc(out: &mut String, r: &GcReport) {
    let _ = writeln!(
        out,
        "stored {} in {} segments; live {}; garbage {} in {} segments{}",
        human(r.stored_bytes),
        r.segments,
        human(r.live_bytes),
        human(r.garbage_bytes),
        r.garbage_segments,
        if r.in_flight_segments > 0 {
            format!(
                " ({} more may be uploads in flight: kept)",
                r.in_flight_segments
            )
        } else {
            String::new()
        }
    );
    if r.sparse_objects > 0 {
        let _ = writeln!(
            out,
            "partly live: {} objects under half live hold {} nothing reaches (compaction would give it back)",
            r.sparse_objects,
            human(r.sparse_dead_bytes)
        );
    }
    if r.live_share.iter().any(|n| *n > 0) {
        let shares: Vec<String> = r
            .live_share
            .iter()
            .enumerate()
            .filter(|(_, n)| **n > 0)
            .map(|(i, n)| format!("{}-{}%: {n}", i * 10, i * 10 + 10))
            .collect();
        let _ = writeln!(out, "objects by live share: {}", shares.join(", "));
    }
    if r.dry_run {
        out.push_str("dry run: nothing deleted\n");
    } else {
        let _ = writeln!(
            out,
            "deleted {} segments and {} old manifests",
            r.deleted_segments, r.deleted_manifests
        );
    }
    for d in &r.disks {
        let _ = writeln!(
            out,
            "  {:<24} exclusive {:>10}  referenced {:>10}",
            d.name,
            human(d.exclusive_bytes),
            human(d.referenced_bytes)
        );
    }
}

fn defrag(out: &mut String, r: &DefragReport) {
    if r.dry_run {
        let _ = writeln!(
            out,
            "{}: {} fragments; defrag would move {} in {} regions of 1 MiB",
            r.disk,
            r.fragments_before,
            human(r.moved_bytes),
            r.regions_moved
        );
        return;
    }
    let _ = writeln!(
        out,
        "{}: {} -> {} fragments; moved {} in {} regions of 1 MiB",
        r.disk,
        r.fragments_before,
        r.fragments_after,
        human(r.moved_bytes),
        r.regions_moved
    );
    if r.regions_skipped > 0 {
        let _ = writeln!(
            out,
            "{} regions left as they were: free space lies in short runs",
            r.regions_skipped
        );
    }
    if r.grains_kept > 0 {
        let _ = writeln!(
            out,
            "{} grains left in place: a reference to them could not be accounted for (run 'strata check')",
            r.grains_kept
        );
    }
}

fn free_space(out: &mut String, r: &FreeSpaceReport) {
    let _ = writeln!(
        out,
        "pool {} -> {}; on the host {} -> {} (used {}); moved {}, punched {}",
        human(r.pool_bytes_before),
        human(r.pool_bytes_after),
        human(r.pool_file_bytes_before),
        human(r.pool_file_bytes_after),
        human(r.used_bytes),
        human(r.moved_bytes),
        human(r.punched_bytes)
    );
    if r.short_runs_bytes > 0 {
        let _ = writeln!(
            out,
            "{} of free space lies in runs under 64 KiB, left alone while clients were writing \
             (some of it may be holes already); run it again when they are quieter",
            human(r.short_runs_bytes)
        );
    }
    if let Some(n) = &r.note {
        let _ = writeln!(out, "note: {n}");
    }
}

/// Snapshots as an indented tree; a mark says where the live state is.
fn snapshot_tree(out: &mut String, snaps: &[SnapshotInfo]) {
    if snaps.is_empty() {
        let _ = writeln!(out, "no snapshots");
        return;
    }
    // Parents above the snapshot; bounded in case the list has a loop.
    let depth = |name: &str| {
        let mut d = 0;
        let mut cur = name;
        while let Some(parent) = snaps.iter().find(|s| s.name == cur).map(|s| &s.parent) {
            let Some(p) = parent else { break };
            if d > snaps.len() {
                break;
            }
            d += 1;
            cur = p;
        }
        d
    };
    for sn in snaps {
        let _ = writeln!(
            out,
            "{}{}  ({}{}){}",
            "  ".repeat(depth(&sn.name)),
            sn.name,
            match (sn.mapped_bytes, sn.exclusive_bytes) {
                (Some(m), Some(x)) => format!("{}, {} exclusive", human(m), human(x)),
                // An object store's snapshot: what it holds is known to a
                // GC mark.
                _ => format!(
                    "{}, taken {}",
                    human(sn.size_bytes),
                    utc(sn.created_unix * 1000)
                ),
            },
            if sn.description.is_empty() {
                String::new()
            } else {
                format!(", {}", sn.description)
            },
            if sn.current { "  <- you are here" } else { "" }
        );
    }
}

fn check(out: &mut String, r: &CheckReport) {
    let _ = writeln!(
        out,
        "checked {} versions, {} map nodes, {} data grains; {} used",
        r.versions,
        r.map_nodes,
        r.data_grains,
        human(r.used_bytes)
    );
    if r.is_clean() {
        let _ = writeln!(
            out,
            "clean: no leaked or doubly owned grain, accounting exact"
        );
        return;
    }
    let _ = writeln!(
        out,
        "{} problems ({} leaked grains, {} counted too low):",
        r.errors.len(),
        r.leaked_grains,
        r.overshared_grains
    );
    for e in &r.errors {
        let _ = writeln!(out, "  {e}");
    }
}

fn stats(out: &mut String, exports: &[ExportStats]) {
    if exports.is_empty() {
        let _ = writeln!(
            out,
            "no statistics yet: no client has used a disk since the server started"
        );
    }
    for e in exports {
        let _ = writeln!(out, "=== {}", e.export);
        out.push_str(&strata_stats::render_text(&e.stats));
    }
}

fn import(out: &mut String, r: &ImportReport) {
    disk(out, &r.disk);
    if !r.snapshots.is_empty() {
        let _ = writeln!(
            out,
            "imported {} links; snapshots (base first): {}",
            r.snapshots.len() + 1,
            r.snapshots.join(", ")
        );
    }
}

fn export(out: &mut String, r: &ExportReport) {
    for l in &r.links {
        let _ = writeln!(out, "wrote {} ({}) from {}", l.file, l.subformat, l.version);
    }
    let _ = writeln!(out, "open {}", r.open);
}

fn vmdk_server(out: &mut String, s: &VmdkServerStatus) {
    let _ = writeln!(out, "server:       {} (pid {})", s.server, s.pid);
    let _ = writeln!(
        out,
        "export:       {} ({}{})",
        s.export,
        s.file,
        if s.read_only { ", read-only" } else { "" }
    );
}

fn vmdk_info(out: &mut String, i: &VmdkInfo) {
    let _ = writeln!(out, "size: {} ({} links)", human(i.size_bytes), i.depth);
    for (depth, l) in i.links.iter().enumerate() {
        let indent = "  ".repeat(depth);
        let _ = writeln!(
            out,
            "{indent}{}  {}  CID {:08x} parentCID {:08x}",
            l.file, l.create_type, l.cid, l.parent_cid
        );
        for e in &l.extents {
            let _ = writeln!(
                out,
                "{indent}  extent {} {} sectors: {} {}",
                e.line_type, e.sectors, e.format, e.file
            );
        }
    }
}

fn vmdk_check(out: &mut String, r: &VmdkCheckReport) {
    for f in &r.files {
        let _ = writeln!(
            out,
            "{}: {} allocated, {} zero, {} unmapped grains",
            f.file, f.check.allocated_grains, f.check.zero_grains, f.check.unmapped_grains
        );
        for (label, messages) in [
            ("error", &f.check.errors),
            ("warning", &f.check.warnings),
            ("repaired", &f.check.repaired),
        ] {
            for m in messages {
                let _ = writeln!(out, "  {label}: {m}");
            }
        }
    }
    if r.remaining_errors == 0 {
        let _ = writeln!(out, "no errors remain");
    } else {
        let _ = writeln!(out, "{} errors remain", r.remaining_errors);
    }
}

fn vmdk_shrink(out: &mut String, rs: &[ShrinkResult]) {
    for r in rs {
        let _ = writeln!(
            out,
            "shrunk from {} to {} ({} grains moved, {} all-zero grains turned into zero entries)",
            human(r.bytes_before),
            human(r.bytes_after),
            r.moved,
            r.zero_grains_found
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
