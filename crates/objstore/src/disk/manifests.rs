//! Reading and landing manifests: the newest valid one of a disk, claim
//! markers, and the create-only PUT that commits the next one (§11.4).

use super::*;

pub(super) fn newest_manifest(store: &ObjectStore, id: u32) -> Result<Manifest> {
    let dir = manifests_dir(id);
    let mut tries = 0;
    loop {
        let mut listed = store.list(&dir, None)?;
        listed.sort_by(|a, b| a.key.cmp(&b.key));
        if listed.is_empty() {
            return Err(Error::new(
                ErrorKind::NotFound,
                format!("disk {id:08x} has no manifest under {dir}"),
            ));
        }
        match newest_valid(store, &listed) {
            // Rule 5: collected between the list and the read (a newer
            // one exists): list again.
            Err(e) if e.kind == ErrorKind::NotFound && tries < 8 => tries += 1,
            r => return r,
        }
    }
}

/// [`newest_manifest`] listing only the keys from `seq` on (a claim that
/// lost its race knows the key it lost); all of them if none is there.
pub(super) fn newest_manifest_from(store: &ObjectStore, id: u32, seq: u64) -> Result<Manifest> {
    if seq > 0 {
        let after = manifest_key(id, seq - 1);
        let listed = store.list(&manifests_dir(id), Some(&after))?;
        if !listed.is_empty() {
            if let Ok(m) = newest_valid(store, &listed) {
                return Ok(m);
            }
        }
    }
    newest_manifest(store, id)
}

/// The newest valid manifest among `listed` (ascending keys): a
/// pipelined one only if its predecessor is there with its nonce
/// (§11.4b rule 4); at most a few keys are passed over.
pub(super) fn newest_valid(store: &ObjectStore, listed: &[Listed]) -> Result<Manifest> {
    let mut passed = Vec::new();
    for l in listed.iter().rev().take(8) {
        let m = read_manifest(store, &l.key, l.size)?;
        let Some(p) = m.pipelined_on() else {
            return Ok(m);
        };
        let before = manifest_key(m.disk, p.seq);
        let valid = match listed.binary_search_by(|x| x.key.as_str().cmp(&before)) {
            Ok(i) => read_manifest(store, &before, listed[i].size)?.nonce == p.nonce,
            Err(_) => false,
        };
        if valid {
            return Ok(m);
        }
        passed.push(l.key.clone());
    }
    Err(corrupt(format!(
        "no valid manifest among the newest of the disk (passed over {}): each is pipelined on a \
         predecessor that is missing or another (FORMAT.md §11.4b)",
        passed.join(", ")
    )))
}

/// Whether `m` is an orphan (§11.4b rule 5): pipelined on a predecessor
/// whose key holds another manifest.
pub(crate) fn is_orphan(store: &ObjectStore, m: &Manifest) -> Result<bool> {
    let Some(p) = m.pipelined_on() else {
        return Ok(false);
    };
    Ok(read_manifest_at(store, &manifest_key(m.disk, p.seq))?.is_some_and(|b| b.nonce != p.nonce))
}

/// The manifest under `key` (one `HEAD` for its size, then
/// [`read_manifest`]), or None if there is none.
pub(super) fn read_manifest_at(store: &ObjectStore, key: &str) -> Result<Option<Manifest>> {
    match store.size_of(key)? {
        Some(size) => read_manifest(store, key, size).map(Some),
        None => Ok(None),
    }
}

/// Manifest `key` (`size` bytes): its tail and body, read from its end
/// without its payload (§11.5).
pub(crate) fn read_manifest(store: &ObjectStore, key: &str, size: u64) -> Result<Manifest> {
    // Read whole, a manifest is checked as one read from its end is: a
    // footer that does not account for every byte (its payload's length)
    // makes it torn, whatever its size.
    let whole = || {
        let obj = store.get(key)?;
        Manifest::needs(key, obj.len() as u64, &obj)?;
        Manifest::decode(key, &obj)
    };
    let start = size.saturating_sub(MANIFEST_READ);
    if start == 0 {
        return whole();
    }
    let end = store.get_range(key, start..size)?;
    match Manifest::needs(key, size, &end)? {
        // Format 1, longer than the first read: read it whole.
        None => whole(),
        Some(n) if n <= end.len() as u64 => Manifest::decode(key, &end[end.len() - n as usize..]),
        Some(n) => {
            let mut all = store.get_range(key, size - n..start)?.to_vec();
            all.extend_from_slice(&end);
            Manifest::decode(key, &all)
        }
    }
}

/// `disks/ID8/c/SEQ16`: manifest `seq` opens a generation (§11.5).
pub fn claim_marker_key(disk: u32, seq: u64) -> String {
    format!("disks/{disk:08x}/c/{seq:016x}")
}

/// The manifest seq a claim marker's key names (None: not a marker key).
pub(crate) fn claim_marker_of_key(key: &str) -> Option<u64> {
    key.rsplit_once("/c/")
        .and_then(|(_, s)| u64::from_str_radix(s, 16).ok())
}

pub(super) fn describe_owner(m: &Manifest) -> String {
    match &m.owner {
        Some(o) if o.is_host() => format!(
            "host {} ({}; claimed with no server running there), generation {} since {}",
            o.host,
            o.name,
            m.generation,
            utc(m.written_ms)
        ),
        Some(o) => format!(
            "{} (host {}, pid {}), generation {} since {}",
            o.name,
            o.host,
            o.pid,
            m.generation,
            utc(m.written_ms)
        ),
        None => format!("nobody (generation {})", m.generation),
    }
}

/// How a create-only `PUT` of a manifest ended.
#[derive(Debug, PartialEq, Eq)]
pub(super) enum Landed {
    Created,
    /// Another host's manifest holds the key.
    Taken,
    /// An orphan (§11.4b) holds the key: the manifest goes one key higher.
    Orphan,
}

/// Write `next` on top of `prev` (with `payload`) create-only (§11.5): one
/// `PUT`, after the claim marker if `next` opens a generation. Sets
/// `next.prev`. On `412` it reads what holds the key: an orphan
/// (§11.4b) is not another host's commit.
pub(super) fn put_manifest(
    store: &ObjectStore,
    prev: &Manifest,
    next: &mut Manifest,
    payload: &[u8],
    pipelined: bool,
) -> Result<Landed> {
    debug_assert!(next.seq > prev.seq);
    next.prev = Some(PrevRef::of(prev));
    next.pipelined = pipelined;
    if next.generation > prev.generation {
        store.put(&claim_marker_key(next.disk, next.seq), Bytes::new())?;
    }
    let key = next.key();
    if store.put_create(&key, Bytes::from(next.encode(payload)))? == Put::Created {
        return Ok(Landed::Created);
    }
    // Deleted since: GC collects only orphans above the newest.
    let Some(there) = read_manifest_at(store, &key)? else {
        return Ok(Landed::Orphan);
    };
    if is_orphan(store, &there)? {
        tracing::warn!(
            "disk {:08x}: {key} is an orphan of a fenced pipeline (FORMAT.md §11.4b): \
             manifest {} goes one key higher",
            next.disk,
            next.seq
        );
        return Ok(Landed::Orphan);
    }
    Ok(Landed::Taken)
}

/// [`put_manifest`] of a manifest without a payload, one key higher past
/// each orphan (§11.4b). `Ok(false)`: another host's manifest is there.
pub(super) fn commit_manifest(
    store: &ObjectStore,
    prev: &Manifest,
    next: &mut Manifest,
) -> Result<bool> {
    for _ in 0..8 {
        match put_manifest(store, prev, next, &[], false)? {
            Landed::Created => return Ok(true),
            Landed::Taken => return Ok(false),
            Landed::Orphan => {
                next.seq += 1;
                next.nonce = rand::random();
            }
        }
    }
    Err(Error::new(
        ErrorKind::Unavailable,
        format!(
            "disk {:08x}: eight orphans in a row above manifest {}: refusing to go on",
            next.disk, prev.seq
        ),
    ))
}
