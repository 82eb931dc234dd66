//! Commands on object-store datastores (docs/MULTIHOST.md): `init
//! --object-store`, `attach`, and `status` of a directory attached to one.
//! `create`, `list`, `info`, `claim` and `serve` (shared_serve.rs) work on
//! them; other commands refuse with a message rather than touch a local
//! datastore.

use std::path::Path;
use std::process::ExitCode;

use serde::Serialize;
use strata_engine::Provisioning;
use strata_shared::layout::Manifest;

use strata_engine::{Error, ErrorKind};
use strata_objstore::{Options, StoreUrl};
use strata_shared::{SharedDatastore, Summary};

use crate::api::Request;
use crate::args::Action;
use crate::output::Format;

pub(crate) fn engine_error(e: strata_shared::Error) -> Error {
    use strata_shared::ErrorKind as K;
    let kind = match e.kind {
        K::NotFound => ErrorKind::NotFound,
        K::AlreadyExists => ErrorKind::AlreadyExists,
        K::InvalidArgument => ErrorKind::InvalidArgument,
        K::Corrupt => ErrorKind::Corrupt,
        K::Unsupported | K::Fenced => ErrorKind::Refused,
        K::Unavailable | K::Io => ErrorKind::Io,
    };
    Error::new(kind, e.message)
}

/// `init --object-store URL` (`attach`: `attach --object-store URL`).
pub fn init_or_attach(dir: &Path, url: &str, attach: bool, format: Format) -> Result<(), Error> {
    let url = StoreUrl::parse(url).map_err(|e| engine_error(e.into()))?;
    let opts = Options::default();
    let (_, summary) = if attach {
        SharedDatastore::attach(dir, &url, &opts)
    } else {
        SharedDatastore::init(dir, &url, &opts)
    }
    .map_err(engine_error)?;
    match format {
        Format::Json => println!("{}", serde_json::to_string_pretty(&summary).expect("json")),
        Format::Human => {
            if attach {
                println!("attached {} to {}", dir.display(), summary.url);
            } else {
                println!("initialised object-store datastore {}", summary.url);
            }
            print_summary(&summary);
        }
    }
    Ok(())
}

/// A command on a directory attached to an object-store datastore:
/// `status` works, a local `init` is refused (the directory is taken), and
/// everything else is not built yet.
pub fn run(dir: &Path, action: &Action) -> Result<ExitCode, Error> {
    let done = |r: Result<(), Error>| r.map(|()| ExitCode::SUCCESS);
    match action {
        Action::Serve(args) => crate::shared_serve::run(dir, args),
        Action::Claim { name, format } => done(claim(dir, name, *format)),
        Action::Datastore {
            request,
            format,
            watch: false,
        } if matches!(
            request,
            Request::Status | Request::List | Request::Create { .. } | Request::Info { .. }
        ) =>
        {
            done(disk_request(dir, request, *format))
        }
        Action::Init { .. } => done(Err(Error::new(
            ErrorKind::AlreadyExists,
            format!(
                "{} is the local directory of an object-store datastore: a local datastore needs \
                 a directory of its own (--datastore)",
                dir.display()
            ),
        ))),
        Action::Datastore { request, .. } => Err(not_yet(dir, &request_name(request))),
        Action::Shared { .. } | Action::Vmdk { .. } => {
            unreachable!("init/attach --object-store and vmdk run on any directory")
        }
    }
}

fn open(dir: &Path) -> Result<SharedDatastore, Error> {
    SharedDatastore::open(dir, &Options::default()).map_err(engine_error)
}

/// `status`, `list`, `create` and `info` of an object-store datastore.
fn disk_request(dir: &Path, request: &Request, format: Format) -> Result<(), Error> {
    let ds = open(dir)?;
    let json = |v: &dyn erased::Json| println!("{}", v.pretty());
    match request {
        Request::Status => {
            let summary = ds.summary().map_err(engine_error)?;
            match format {
                Format::Json => json(&summary),
                Format::Human => print_summary(&summary),
            }
        }
        Request::Create {
            name,
            size_bytes,
            provisioning,
        } => {
            if *provisioning != Provisioning::Thin {
                return Err(Error::new(
                    ErrorKind::Refused,
                    format!(
                        "object-store datastores hold thin disks only ({} was asked): an object \
                         store has no space to reserve in advance",
                        provisioning.as_str()
                    ),
                ));
            }
            let m = ds.create_disk(name, *size_bytes).map_err(engine_error)?;
            match format {
                Format::Json => json(&DiskView::new(name, &m)),
                Format::Human => println!(
                    "created disk {name}: {}, thin, in {} (id {:08x})",
                    crate::units::human(m.size_bytes),
                    ds.config().url,
                    m.disk
                ),
            }
        }
        Request::List => {
            let disks = ds.disks().map_err(engine_error)?;
            let views: Vec<DiskView> = disks.iter().map(|(n, m)| DiskView::new(n, m)).collect();
            match format {
                Format::Json => json(&views),
                Format::Human => {
                    println!(
                        "{:<24} {:>10} {:>6} {:>9}  OWNER",
                        "NAME", "SIZE", "GEN", "SNAPSHOTS"
                    );
                    for v in &views {
                        println!(
                            "{:<24} {:>10} {:>6} {:>9}  {}",
                            v.name,
                            crate::units::human(v.size_bytes),
                            v.generation,
                            v.snapshots.len(),
                            v.owner_text()
                        );
                    }
                }
            }
        }
        Request::Info { name } => {
            let id = ds.disk_id(name).map_err(engine_error)?;
            let m = ds.newest_manifest(id).map_err(engine_error)?;
            let v = DiskView::new(name, &m);
            match format {
                Format::Json => json(&v),
                Format::Human => {
                    println!("disk:        {name} (id {:08x})", m.disk);
                    println!("size:        {}", crate::units::human(m.size_bytes));
                    println!("type:        thin (object store)");
                    println!("writer:      {}", v.owner_text());
                    println!(
                        "manifest:    {} (written {})",
                        m.key(),
                        strata_shared::utc(m.written_ms)
                    );
                    if let Some(p) = &m.parent {
                        println!("clone of:    {}", p.name);
                    }
                    for s in &m.snapshots {
                        println!(
                            "snapshot:    {name}@{} (taken {})",
                            s.name,
                            strata_shared::utc(s.created_ms)
                        );
                    }
                }
            }
        }
        _ => unreachable!("routed by run"),
    }
    Ok(())
}

/// `claim DISK`.
fn claim(dir: &Path, name: &str, format: Format) -> Result<(), Error> {
    let ds = open(dir)?;
    let m = ds.claim(name).map_err(engine_error)?;
    match format {
        Format::Json => println!("{}", DiskView::new(name, &m).pretty()),
        Format::Human => println!(
            "claimed disk {name}: this host ({}) is its writer, generation {}",
            ds.config().me.name,
            m.generation
        ),
    }
    Ok(())
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
    parent: Option<String>,
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
            parent: m.parent.as_ref().map(|p| p.name.clone()),
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

mod erased {
    /// Anything printed as pretty JSON.
    pub trait Json {
        fn pretty(&self) -> String;
    }
    impl<T: serde::Serialize> Json for T {
        fn pretty(&self) -> String {
            serde_json::to_string_pretty(self).expect("json")
        }
    }
}
use erased::Json as _;

/// What every other command says on an object-store datastore for now.
fn not_yet(dir: &Path, what: &str) -> Error {
    Error::new(
        ErrorKind::Refused,
        format!(
            "{} is the local directory of an object-store datastore; '{what}' does not work on \
             object-store datastores yet (they have init, attach, status, create, list, info, claim \
             and serve so far: docs/MULTIHOST.md)",
            dir.display()
        ),
    )
}

/// A request's command name, for messages (its wire tag, `op`).
fn request_name(req: &Request) -> String {
    serde_json::to_value(req)
        .ok()
        .and_then(|v| {
            v.get("op")
                .and_then(|o| o.as_str())
                .map(|s| s.replace('_', " "))
        })
        .unwrap_or_else(|| "this command".into())
}

fn print_summary(s: &Summary) {
    println!("datastore:    {} (id {})", s.url, s.root.uuid);
    println!("endpoint:     {}", s.endpoint);
    println!(
        "created by:   {} (host {}) at {}",
        s.root.created_by.name,
        s.root.created_by.host,
        strata_shared::utc(s.root.created_ms)
    );
    println!(
        "this host:    {} (host {}), local directory {}",
        s.me.name,
        s.me.host,
        s.local_dir.display()
    );
    if let Some(p) = &s.probe {
        println!(
            "conditional writes: honoured ({} of {} concurrent creates of one key accepted; the race took {:.1} s)",
            p.accepted, p.racers, p.ms / 1000.0
        );
    }
    if s.disks.is_empty() {
        println!("disks:        none");
    } else {
        println!("disks:        {} ({})", s.disks.len(), s.disks.join(", "));
    }
    println!(
        "stored:       {} in {} objects",
        crate::units::human(s.disk_bytes),
        s.disk_objects
    );
}
