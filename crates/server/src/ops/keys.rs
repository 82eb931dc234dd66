//! The key requests of encrypted disks (docs/SECURITY.md, "Encryption at
//! rest"): `unlock`, `lock`, `key list|add|remove` and `rekey`. The secrets arrive
//! as bytes (the CLI read them) and are handed to the datastore; nothing
//! here prints or logs them (a `Secret` does not print).

use strata_api::{KeyRequest, Response, Secret};
use strata_engine::{Error, ErrorKind};

use super::Ctx;

/// Open the disk with `key` first when one is given: a command that
/// changes keyslots needs the disk's keys, which an offline command (or a
/// server that was not given them) does not hold yet.
fn open_with(ctx: &Ctx<'_>, name: &str, key: Option<&Secret>) -> Result<(), Error> {
    match key {
        Some(k) => ctx.ds.unlock(name, k.expose()).map(|_| ()),
        None => Ok(()),
    }
}

fn keys(ctx: &Ctx<'_>, name: &str, slot: Option<u32>) -> Result<Response, Error> {
    Ok(Response::Keys {
        name: name.to_string(),
        encryption: ctx.ds.keys(name)?,
        slot,
    })
}

/// Answer a key request.
pub(crate) fn request(ctx: &Ctx<'_>, req: &KeyRequest) -> Result<Response, Error> {
    match req {
        KeyRequest::Unlock { name, key } => {
            let slot = ctx.ds.unlock(name, key.expose())?;
            Ok(Response::Unlocked {
                name: name.clone(),
                slot,
                // Only a server keeps what it was given.
                kept: ctx.jobs.is_some(),
            })
        }
        KeyRequest::Lock { name, .. } => {
            let (disks, held) = ctx.ds.lock(name)?;
            Ok(Response::Locked {
                name: name.clone(),
                disks,
                held,
            })
        }
        KeyRequest::List { name } => keys(ctx, name, None),
        KeyRequest::Add { name, key, new } => {
            open_with(ctx, name, key.as_ref())?;
            let slot = ctx.ds.key_add(name, new)?;
            keys(ctx, name, Some(slot))
        }
        KeyRequest::Remove { name, slot, key } => {
            open_with(ctx, name, key.as_ref())?;
            ctx.ds.key_remove(name, *slot)?;
            keys(ctx, name, None)
        }
        KeyRequest::Rekey { deep: true, .. } => deep(ctx, req, &mut |_, _| {}),
        KeyRequest::Rekey { name, key, new, .. } => {
            let new = new.as_ref().ok_or_else(|| {
                Error::new(
                    ErrorKind::InvalidArgument,
                    format!("'{name}': rekey needs the new secret"),
                )
            })?;
            open_with(ctx, name, key.as_ref())?;
            ctx.ds.rekey(name, new)?;
            keys(ctx, name, None)
        }
    }
}

/// `rekey --deep`: a job with progress (FORMAT.md §16.4); with no new
/// secret it resumes the one under way.
pub(crate) fn deep(
    ctx: &Ctx<'_>,
    req: &KeyRequest,
    progress: &mut dyn FnMut(u64, u64),
) -> Result<Response, Error> {
    let KeyRequest::Rekey {
        name,
        key,
        new,
        rate_bytes_per_sec,
        ..
    } = req
    else {
        return Err(Error::new(ErrorKind::InvalidArgument, "not a rekey"));
    };
    open_with(ctx, name, key.as_ref())?;
    ctx.ds
        .rekey_deep(name, new.as_ref(), &ctx.work(*rate_bytes_per_sec), progress)?;
    keys(ctx, name, None)
}
