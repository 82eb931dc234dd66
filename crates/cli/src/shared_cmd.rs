//! Commands on object-store datastores (docs/MULTIHOST.md): `init
//! --object-store`, `attach`, and the requests that work on a directory
//! attached to one (status, list, info, create, rm, claim, snapshots,
//! linked clones, check, gc; `serve` is serve.rs, as for any datastore). When this host
//! serves the datastore, requests go to its server's control socket, so
//! that a snapshot is taken by the process that writes the disk; other
//! commands refuse with a message rather than touch a local datastore.

use std::path::Path;
use std::process::ExitCode;
use std::sync::Arc;

use strata_engine::{Error, ErrorKind};
use strata_objstore::{Options, StoreUrl};
use strata_shared::SharedDatastore;

use crate::args::Action;
use crate::output::Format;
use strata_datastore::from_shared as engine_error;
use strata_server::shared_ops::{execute, not_yet_request, request_name, summary_text};

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
            print!("{}", summary_text(&summary));
        }
    }
    Ok(())
}

/// A command on a directory attached to an object-store datastore.
pub fn run(dir: &Path, action: &Action) -> Result<ExitCode, Error> {
    match action {
        Action::Serve(_) => unreachable!("main routes serve to serve::run"),
        Action::Init { .. } => Err(Error::new(
            ErrorKind::AlreadyExists,
            format!(
                "{} is the local directory of an object-store datastore: a local datastore needs \
                 a directory of its own (--datastore)",
                dir.display()
            ),
        )),
        Action::Datastore {
            request,
            format,
            watch: false,
        } => {
            let sock = dir.join(strata_format::FILE_CONTROL);
            let response = if std::os::unix::net::UnixStream::connect(&sock).is_ok() {
                crate::wire::request(&sock, request, false, &mut |_, _| {})?
            } else {
                let ds = SharedDatastore::open(dir, &Options::default()).map_err(engine_error)?;
                execute(&Arc::new(ds), None, request)?
            };
            crate::output::print(&response, *format);
            Ok(if response.found_problems() {
                ExitCode::from(1)
            } else {
                ExitCode::SUCCESS
            })
        }
        Action::Datastore { request, .. } => Err(not_yet(dir, &request_name(request))),
        Action::Shared { .. } | Action::Vmdk { .. } => {
            unreachable!("init/attach --object-store and vmdk run on any directory")
        }
    }
}

/// What every other command says on an object-store datastore for now.
fn not_yet(dir: &Path, what: &str) -> Error {
    Error::new(
        ErrorKind::Refused,
        format!(
            "{} is the local directory of an object-store datastore; {}",
            dir.display(),
            not_yet_request(what).message
        ),
    )
}
