//! Commands on object-store datastores (docs/MULTIHOST.md): `init
//! --object-store`, `attach`, and `status` of a directory attached to one.
//! Serving and disk commands on them are not built yet; they refuse with a
//! message rather than touch a local datastore.

use std::path::Path;

use strata_engine::{Error, ErrorKind};
use strata_objstore::{Options, StoreUrl};
use strata_shared::{SharedDatastore, Summary};

use crate::api::Request;
use crate::args::Action;
use crate::output::Format;

fn engine_error(e: strata_shared::Error) -> Error {
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
pub fn run(dir: &Path, action: &Action) -> Result<(), Error> {
    match action {
        Action::Datastore {
            request: Request::Status,
            format,
            watch: false,
        } => status(dir, *format),
        Action::Init { .. } => Err(Error::new(
            ErrorKind::AlreadyExists,
            format!(
                "{} is the local directory of an object-store datastore: a local datastore needs \
                 a directory of its own (--datastore)",
                dir.display()
            ),
        )),
        Action::Serve(_) => Err(not_yet(dir, "serve")),
        Action::Datastore { request, .. } => Err(not_yet(dir, &request_name(request))),
        Action::Shared { .. } | Action::Vmdk { .. } => {
            unreachable!("init/attach --object-store and vmdk run on any directory")
        }
    }
}

/// `status` of a directory attached to an object-store datastore.
fn status(dir: &Path, format: Format) -> Result<(), Error> {
    let ds = SharedDatastore::open(dir, &Options::default()).map_err(engine_error)?;
    let summary = ds.summary().map_err(engine_error)?;
    match format {
        Format::Json => println!("{}", serde_json::to_string_pretty(&summary).expect("json")),
        Format::Human => print_summary(&summary),
    }
    Ok(())
}

/// What every other command says on an object-store datastore for now.
fn not_yet(dir: &Path, what: &str) -> Error {
    Error::new(
        ErrorKind::Refused,
        format!(
            "{} is the local directory of an object-store datastore; '{what}' does not work on \
             object-store datastores yet (they have init, attach and status so far: docs/MULTIHOST.md)",
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
