//! Requests on an object-store datastore (docs/MULTIHOST.md) that are not
//! yet answered through the datastore trait (`ops::execute` comes here
//! with the process's `ObjectStoreDatastore`, in the CLI or in a server),
//! and `init|attach --object-store`.

use std::fmt::Write as _;

use serde::Serialize;
use strata_datastore::ObjectStoreDatastore;
use strata_engine::{Error, ErrorKind};
use strata_shared::layout::Manifest;
use strata_shared::{SharedDatastore, Summary};

use crate::api::{Request, Response};

pub(crate) use strata_datastore::from_shared as engine_error;

pub(crate) fn answer(human: String, json: serde_json::Value) -> Response {
    Response::Shared {
        human,
        json,
        problems: false,
    }
}

fn value<T: Serialize>(v: &T) -> serde_json::Value {
    serde_json::to_value(v).expect("json")
}

/// `init --object-store URL` (`attach`: `attach --object-store URL`): the
/// datastore's summary.
pub fn init_or_attach(dir: &std::path::Path, url: &str, attach: bool) -> Result<Response, Error> {
    let url = strata_objstore::StoreUrl::parse(url).map_err(|e| engine_error(e.into()))?;
    let opts = strata_objstore::Options::default();
    let (_, summary) = if attach {
        SharedDatastore::attach(dir, &url, &opts)
    } else {
        SharedDatastore::init(dir, &url, &opts)
    }
    .map_err(engine_error)?;
    let head = if attach {
        format!("attached {} to {}\n", dir.display(), summary.url)
    } else {
        format!("initialised object-store datastore {}\n", summary.url)
    };
    Ok(answer(head + &summary_text(&summary), value(&summary)))
}

/// Run `request` on an object-store datastore through the process's
/// handles of its disks (`x`: in a server, the ones its clients use, so
/// that owner-only changes are made by the process that writes the disk).
pub fn execute(x: &ObjectStoreDatastore, request: &Request) -> Result<Response, Error> {
    let e = engine_error;
    let ds = x.shared();
    let disk = |name: &str| x.disk(name);
    Ok(match request {
        Request::Status => {
            let summary = ds.summary().map_err(e)?;
            answer(summary_text(&summary), value(&summary))
        }
        // Thick provisioning was refused by ops (the capability table).
        Request::Create {
            name, size_bytes, ..
        } => {
            let m = ds.create_disk(name, *size_bytes).map_err(e)?;
            answer(
                format!(
                    "created disk {name}: {}, thin, in {} (id {:08x})\n",
                    crate::units::human(m.size_bytes),
                    ds.config().url,
                    m.disk
                ),
                value(&DiskView::new(name, &m)),
            )
        }
        Request::List => {
            let disks = ds.disks().map_err(e)?;
            let views: Vec<DiskView> = disks.iter().map(|(n, m)| DiskView::new(n, m)).collect();
            let mut t = format!(
                "{:<24} {:>10} {:>6} {:>9}  WRITER\n",
                "NAME", "SIZE", "GEN", "SNAPSHOTS"
            );
            for v in &views {
                let _ = writeln!(
                    t,
                    "{:<24} {:>10} {:>6} {:>9}  {}",
                    v.name,
                    crate::units::human(v.size_bytes),
                    v.generation,
                    v.snapshots.len(),
                    v.owner_text()
                );
            }
            answer(t, value(&views))
        }
        Request::Info { name } => {
            let id = ds.disk_id(name).map_err(e)?;
            let m = ds.newest_manifest(id).map_err(e)?;
            let v = DiskView::new(name, &m);
            let mut t = String::new();
            let _ = writeln!(t, "disk:        {name} (id {:08x})", m.disk);
            let _ = writeln!(t, "size:        {}", crate::units::human(m.size_bytes));
            let _ = writeln!(t, "type:        thin (object store)");
            let _ = writeln!(t, "writer:      {}", v.owner_text());
            let _ = writeln!(
                t,
                "manifest:    {} (written {})",
                m.key(),
                strata_shared::utc(m.written_ms)
            );
            if let Some(p) = &m.parent {
                let _ = writeln!(t, "clone of:    {}", p.name);
            }
            if !m.limits.is_none() {
                let _ = writeln!(t, "limits:      {}", crate::units::limits_text(&m.limits));
            }
            for s in &m.snapshots {
                let _ = writeln!(
                    t,
                    "snapshot:    {name}@{} (taken {})",
                    s.name,
                    strata_shared::utc(s.created_ms)
                );
            }
            answer(t, value(&v))
        }
        Request::Claim {
            name,
            handover,
            wait_seconds,
        } => {
            let wait = std::time::Duration::from_secs(wait_seconds.unwrap_or(60));
            let mut d = disk(name)?;
            if d.ownership().1.is_some() {
                // Fenced here before: taking it back starts afresh.
                d = x.reopen(name)?;
            }
            if *handover {
                d.claim_handover(wait).map_err(e)?;
            } else {
                d.claim().map_err(e)?;
            }
            let m = (*d.manifest()).clone();
            answer(
                format!(
                    "claimed disk {name}: this host ({}) is its writer, generation {}\n",
                    ds.config().me.name,
                    m.generation
                ),
                value(&DiskView::new(name, &m)),
            )
        }
        Request::Release { name } => {
            let m = disk(name)?.release().map_err(e)?;
            answer(
                format!(
                    "released disk {name} at generation {} (manifest {}): this host writes it no \
                     more; another takes it with 'strata claim {name} --handover'\n",
                    m.generation, m.seq
                ),
                value(&DiskView::new(name, &m)),
            )
        }
        Request::Remove { name } => {
            x.forget(name);
            ds.remove_disk(name).map_err(e)?;
            answer(
                format!("removed {name}\n"),
                serde_json::json!({ "name": name }),
            )
        }
        Request::SnapshotCreate {
            disk: name,
            snapshot,
            description,
        } => {
            let s = disk(name)?
                .snapshot_create(snapshot, description)
                .map_err(e)?;
            answer(
                format!("created snapshot {name}@{}\n", s.name),
                serde_json::json!({ "disk": name, "snapshot": s }),
            )
        }
        Request::SnapshotList { disk: name } => {
            let id = ds.disk_id(name).map_err(e)?;
            let m = ds.newest_manifest(id).map_err(e)?;
            let mut t = String::new();
            if m.snapshots.is_empty() {
                let _ = writeln!(t, "{name} has no snapshots");
            }
            for s in &m.snapshots {
                let _ = writeln!(
                    t,
                    "{name}@{}  {}  {}{}",
                    s.name,
                    crate::units::human(s.size_bytes),
                    strata_shared::utc(s.created_ms),
                    if s.description.is_empty() {
                        String::new()
                    } else {
                        format!("  {}", s.description)
                    }
                );
            }
            answer(t, value(&m.snapshots))
        }
        Request::SnapshotDelete {
            disk: name,
            snapshot,
        } => {
            disk(name)?.snapshot_delete(snapshot).map_err(e)?;
            answer(
                format!("deleted snapshot {name}@{snapshot}\n"),
                serde_json::json!({ "disk": name, "snapshot": snapshot }),
            )
        }
        Request::SnapshotRevert {
            disk: name,
            snapshot,
        } => {
            let d = disk(name)?;
            d.snapshot_revert(snapshot).map_err(e)?;
            answer(
                format!("reverted {name} to {name}@{snapshot}\n"),
                value(&DiskView::new(name, &d.manifest())),
            )
        }
        Request::CloneLinked { source, name } => {
            let (src, snap) = strata_datastore::clone_source(source)?;
            let m = ds.clone_linked(src, snap, name).map_err(e)?;
            answer(
                format!("created linked clone {name} of {source}\n"),
                value(&DiskView::new(name, &m)),
            )
        }
        Request::Check => {
            let r = ds.check().map_err(e)?;
            let mut t = format!(
                "checked {} disks, {} snapshots, {} holds: {} map nodes and {} grains read against their checksums\n",
                r.disks, r.snapshots, r.holds, r.nodes, r.grains
            );
            for err in &r.errors {
                let _ = writeln!(t, "error: {err}");
            }
            if r.errors.is_empty() {
                t.push_str("no problems found\n");
            }
            Response::Shared {
                human: t,
                problems: !r.errors.is_empty(),
                json: value(&r),
            }
        }
        Request::Gc { dry_run } => {
            let r = x.gc(*dry_run)?;
            let h = crate::units::human;
            let mut t = String::new();
            let _ = writeln!(
                t,
                "stored {} in {} segments; live {}; garbage {} in {} segments{}",
                h(r.stored_bytes),
                r.segments,
                h(r.live_bytes),
                h(r.garbage_bytes),
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
            if *dry_run {
                t.push_str("dry run: nothing deleted\n");
            } else {
                let _ = writeln!(
                    t,
                    "deleted {} segments and {} old manifests",
                    r.deleted_segments, r.deleted_manifests
                );
            }
            for d in &r.disks {
                let _ = writeln!(
                    t,
                    "  {:<24} exclusive {:>10}  referenced {:>10}",
                    d.name,
                    h(d.exclusive_bytes),
                    h(d.referenced_bytes)
                );
            }
            answer(t, value(&r))
        }
        // A server answers these before it gets here (ops::execute).
        Request::Move { .. } => {
            return Err(Error::new(
                ErrorKind::Refused,
                "a move runs in the server that serves the disk: start 'strata serve' for this \
                 directory (the disk may be idle; clients connect as usual)",
            ))
        }
        Request::Stats { .. } => {
            return Err(Error::new(
                ErrorKind::Refused,
                "I/O statistics are kept by a running server: start 'strata serve' for this \
                 datastore",
            ))
        }
        Request::Jobs | Request::JobControl { .. } => {
            return Err(Error::new(
                ErrorKind::Refused,
                "jobs run in a server: no 'strata serve' holds this datastore",
            ))
        }
        other => return Err(not_yet_request(&request_name(other))),
    })
}

pub fn not_yet_request(what: &str) -> Error {
    Error::new(
        ErrorKind::Refused,
        format!(
            "'{what}' does not work on object-store datastores yet (docs/MULTIHOST.md lists what \
             does: among others create, extend, limit, snapshots, clones, import, export, move, \
             claim, gc and serve)"
        ),
    )
}

/// A request's command name, for messages (its wire tag, `op`).
pub fn request_name(req: &Request) -> String {
    serde_json::to_value(req)
        .ok()
        .and_then(|v| {
            v.get("op")
                .and_then(|o| o.as_str())
                .map(|s| s.replace('_', " "))
        })
        .unwrap_or_else(|| "this command".into())
}

/// A disk as `list`, `info`, `create` and `claim` show it.
#[derive(Serialize)]
struct DiskView {
    name: String,
    id: String,
    size_bytes: u64,
    generation: u32,
    owner: Option<strata_shared::layout::Owner>,
    manifest: String,
    written_ms: u64,
    snapshots: Vec<String>,
    /// The snapshot the live state descends from (as `current_snapshot`
    /// of a local disk's info).
    current_snapshot: Option<String>,
    parent: Option<String>,
    /// I/O limits (`strata limit`), absent when there are none.
    #[serde(skip_serializing_if = "strata_engine::IoLimits::is_none")]
    limits: strata_engine::IoLimits,
}

impl DiskView {
    fn new(name: &str, m: &Manifest) -> Self {
        DiskView {
            name: name.to_string(),
            id: format!("{:08x}", m.disk),
            size_bytes: m.size_bytes,
            generation: m.generation,
            owner: m.owner.clone(),
            manifest: m.key(),
            written_ms: m.written_ms,
            snapshots: m.snapshots.iter().map(|s| s.name.clone()).collect(),
            current_snapshot: m
                .current
                .and_then(|c| m.snapshots.iter().find(|s| s.id == c))
                .map(|s| s.name.clone()),
            parent: m.parent.as_ref().map(|p| p.name.clone()),
            limits: m.limits,
        }
    }

    fn owner_text(&self) -> String {
        match &self.owner {
            Some(o) => format!(
                "{} (host {}, pid {}), generation {}",
                o.name, o.host, o.pid, self.generation
            ),
            None => "none yet (the first host to write claims it)".into(),
        }
    }
}

pub fn summary_text(s: &Summary) -> String {
    let mut t = String::new();
    let _ = writeln!(t, "datastore:    {} (id {})", s.url, s.root.uuid);
    let _ = writeln!(t, "endpoint:     {}", s.endpoint);
    let _ = writeln!(
        t,
        "created by:   {} (host {}) at {}",
        s.root.created_by.name,
        s.root.created_by.host,
        strata_shared::utc(s.root.created_ms)
    );
    let _ = writeln!(
        t,
        "this host:    {} (host {}), local directory {}",
        s.me.name,
        s.me.host,
        s.local_dir.display()
    );
    if let Some(p) = &s.probe {
        let _ = writeln!(
            t,
            "conditional writes: honoured ({} of {} concurrent creates of one key accepted; the race took {:.1} s)",
            p.accepted, p.racers, p.ms / 1000.0
        );
    }
    if s.disks.is_empty() {
        let _ = writeln!(t, "disks:        none");
    } else {
        let _ = writeln!(
            t,
            "disks:        {} ({})",
            s.disks.len(),
            s.disks.join(", ")
        );
    }
    let _ = writeln!(
        t,
        "stored:       {} in {} objects",
        crate::units::human(s.disk_bytes),
        s.disk_objects
    );
    t
}
