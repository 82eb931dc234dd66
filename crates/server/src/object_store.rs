//! `init|attach --object-store` (docs/MULTIHOST.md): a directory joined
//! to an object store. Everything else, `claim`, `release`, `gc` and
//! `compact` included, goes through the datastore trait in `ops`.

use strata_api::Response;
use strata_engine::Error;
use strata_objstore::ObjectStoreDatastore;

/// `init --object-store URL` (`attach`: `attach --object-store URL`): the
/// datastore's summary.
pub fn init_or_attach(dir: &std::path::Path, url: &str, attach: bool) -> Result<Response, Error> {
    let url = strata_s3::StoreUrl::parse(url)?;
    let opts = strata_s3::Options::default();
    let (_, summary) = if attach {
        ObjectStoreDatastore::attach(dir, &url, &opts)
    } else {
        ObjectStoreDatastore::init(dir, &url, &opts)
    }?;
    Ok(Response::Joined {
        attached: attach,
        summary,
    })
}
