//! What only an object-store datastore answers (docs/MULTIHOST.md):
//! `claim`, `release`, `gc`, `compact` and its own `check`, through the process's
//! `ObjectStoreDatastore` (`ops::execute` comes here in the CLI or in a
//! server); and `init|attach --object-store`. Everything else both kinds
//! answer through the datastore trait in `ops`.

use strata_datastore::ObjectStoreDatastore;
use strata_engine::{Error, ErrorKind};
use strata_shared::SharedDatastore;

use crate::api::{Request, Response};

/// `init --object-store URL` (`attach`: `attach --object-store URL`): the
/// datastore's summary.
pub fn init_or_attach(dir: &std::path::Path, url: &str, attach: bool) -> Result<Response, Error> {
    let url = strata_objstore::StoreUrl::parse(url)?;
    let opts = strata_objstore::Options::default();
    let (_, summary) = if attach {
        SharedDatastore::attach(dir, &url, &opts)
    } else {
        SharedDatastore::init(dir, &url, &opts)
    }?;
    Ok(Response::Joined {
        attached: attach,
        summary,
    })
}

/// Run a request only an object store answers, through the process's
/// handles of its disks (`x`: in a server, the ones its clients use, so
/// that owner-only changes are made by the process that writes the disk).
pub fn execute(x: &ObjectStoreDatastore, request: &Request) -> Result<Response, Error> {
    let ds = x.shared();
    Ok(match request {
        Request::Claim {
            name,
            handover,
            wait_seconds,
        } => {
            let wait = std::time::Duration::from_secs(wait_seconds.unwrap_or(60));
            let m = x.claim(name, handover.then_some(wait))?;
            Response::Claimed(x.view(name, &m))
        }
        Request::Release { name } => {
            let m = x.release(name)?;
            Response::Released(x.view(name, &m))
        }
        Request::Check => Response::StoreCheck(ds.check()?),
        Request::Gc { dry_run } => Response::Gc(x.gc(*dry_run)?),
        Request::Compact {
            name,
            below_pct,
            dry_run,
        } => {
            let below = below_pct.unwrap_or(85);
            if below == 0 || below > 100 {
                return Err(Error::new(
                    ErrorKind::InvalidArgument,
                    format!("--below is a percentage from 1 to 100, not {below}"),
                ));
            }
            let opts = strata_shared::disk::CompactOptions {
                below: f64::from(below) / 100.0,
                dry_run: *dry_run,
                ..Default::default()
            };
            Response::Compact(x.disk(name)?.compact(opts)?)
        }
        other => {
            return Err(Error::new(
                ErrorKind::Refused,
                format!("an object-store datastore does not answer {other:?} here"),
            ))
        }
    })
}
