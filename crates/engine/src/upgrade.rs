//! Upgrading a format-version-1 datastore to version 2 on open
//! (docs/FORMAT.md §8, "Upgrading a version-1 datastore"). Everything that
//! knows the version-1 layout lives here; the rest of the engine reads and
//! writes version 2 only.

use std::collections::{HashMap, HashSet};
use std::sync::Arc;

use strata_format::{
    batch_span, catalog_file, decode_batch_header, decode_map_node_v1, encode_map_node,
    encode_ref_page, journal_file, Record, Superblock, VersionState, BATCH_HEADER_BYTES,
    FILE_JOURNAL_V1, FILE_POOL, FILE_REFCOUNT, FILE_REFCOUNT_UPGRADE, FILE_SUPER, GRAIN_BYTES,
    MAP_FANOUT, REFS_PER_PAGE, SUPER_SLOT_BYTES,
};
use strata_storage::{Backend, Storage};

use crate::catalog::{Catalog, VersionRec};
use crate::error::{Error, ErrorKind, Result};
use crate::journal::read_batch;
use crate::meta::pool_end_covering;

/// Count pages converted per write (1 MiB).
const PAGES_PER_WRITE: u64 = 256;

fn corrupt(msg: String) -> Error {
    Error::new(ErrorKind::Corrupt, msg)
}

/// Version-1 state after replaying its log, in memory.
struct V1 {
    pool: Arc<dyn Storage>,
    hwm: u64,
    catalog: Catalog,
    versions: HashMap<u64, VersionState>,
    nodes: HashMap<u64, Box<[u64; MAP_FANOUT]>>,
    counts: HashMap<u64, u32>,
}

impl V1 {
    fn bump(&mut self, g: u64) {
        self.hwm = self.hwm.max(pool_end_covering(g));
    }

    fn read_node(&self, g: u64) -> Result<Box<[u64; MAP_FANOUT]>> {
        if let Some(n) = self.nodes.get(&g) {
            return Ok(n.clone());
        }
        if g == 0 || g >= self.hwm {
            return Err(corrupt(format!(
                "version-1 map points at grain {g}, outside the pool (1..{})",
                self.hwm
            )));
        }
        let mut buf = vec![0u8; GRAIN_BYTES as usize];
        self.pool.read_at(&mut buf, g * GRAIN_BYTES)?;
        Ok(decode_map_node_v1(&buf)?)
    }

    fn apply(&mut self, rec: Record) -> Result<()> {
        match rec {
            Record::PageImage { grain, data } => {
                self.bump(grain);
                self.nodes.insert(grain, decode_map_node_v1(&data[..])?);
            }
            Record::PageZeroV1 { grain } => {
                self.bump(grain);
                self.nodes.insert(grain, Box::new([0; MAP_FANOUT]));
            }
            Record::MapSet {
                grain,
                index,
                value,
            } => {
                let mut n = self.read_node(grain)?;
                n[index as usize] = value;
                self.nodes.insert(grain, n);
            }
            Record::RefSet { grain, count } => {
                self.bump(grain);
                self.counts.insert(grain, count);
                if count == 0 {
                    self.nodes.remove(&grain);
                }
            }
            Record::Version(st) => {
                if self.versions.contains_key(&st.version) {
                    self.versions.insert(st.version, st);
                }
            }
            Record::Catalog(bytes) => {
                let mut c = Catalog::decode(&bytes)?;
                self.versions = c.take_versions();
                self.catalog = c;
            }
            other => {
                return Err(corrupt(format!(
                    "version-1 log holds a record version 1 does not have: {other:?}"
                )))
            }
        }
        Ok(())
    }
}

/// Replay generation `generation`'s batches of a version-1 log (stop at the
/// first invalid one, as version 1 did).
fn replay_v1_log(file: &dyn Storage, generation: u64, v1: &mut V1) -> Result<usize> {
    let mut offset = 0u64;
    let mut seq = 0u64;
    while let Some((gen, b)) = read_batch(file, offset)? {
        let h = decode_batch_header(&b).expect("read_batch checked the header");
        if gen != generation || h.sequence != seq {
            break;
        }
        for r in Record::decode_all_v1(&b[BATCH_HEADER_BYTES..])? {
            v1.apply(r)?;
        }
        seq += 1;
        offset += batch_span(h.payload_bytes);
    }
    Ok(seq as usize)
}

/// Upgrade the version-1 datastore in `backend`, whose current superblock
/// is `sb`, to version 2. Crash-safe at every step (see the module docs).
#[expect(clippy::too_many_lines)]
pub fn upgrade_v1(backend: &dyn Backend, sb: &Superblock, catalog: Catalog) -> Result<()> {
    tracing::info!(
        "upgrading {} from format version 1 to 2",
        backend.describe()
    );
    let pool = backend.open(FILE_POOL, false)?;
    let mut v1 = V1 {
        pool: pool.clone(),
        hwm: sb.pool_grains,
        versions: catalog
            .versions
            .iter()
            .map(|v| (v.id, VersionState::from(*v)))
            .collect(),
        catalog,
        nodes: HashMap::new(),
        counts: HashMap::new(),
    };
    // Step 1: the version-1 log, in memory.
    if backend.exists(FILE_JOURNAL_V1) {
        let log = backend.open(FILE_JOURNAL_V1, false)?;
        replay_v1_log(log.as_ref(), sb.generation, &mut v1)?;
    }
    // Step 2: every reachable node in the version-2 layout, in place.
    let mut ids: Vec<u64> = v1.versions.keys().copied().collect();
    ids.sort_unstable();
    let mut seen: HashSet<u64> = HashSet::new();
    let mut page = vec![0u8; GRAIN_BYTES as usize];
    for id in ids {
        let st = v1.versions[&id];
        if st.root == 0 {
            continue;
        }
        let mut stack = vec![(st.root, st.levels - 1)];
        while let Some((g, level)) = stack.pop() {
            if !seen.insert(g) {
                continue;
            }
            let entries = v1.read_node(g)?;
            for (i, &e) in entries.iter().enumerate() {
                if e != 0 && e >= v1.hwm {
                    return Err(corrupt(format!(
                        "version-1 map node at grain {g}: entry {i} points at grain {e}, \
                         outside the pool (1..{}); not upgrading a damaged datastore",
                        v1.hwm
                    )));
                }
                if level > 0 && e != 0 {
                    stack.push((e, level - 1));
                }
            }
            encode_map_node(&entries, g, level, &mut page);
            pool.write_at(&page, g * GRAIN_BYTES)?;
        }
    }
    pool.sync()?;
    // Step 3: count pages, version-2 layout, into a new file.
    let old_refs = backend.open(FILE_REFCOUNT, false)?;
    let new_refs = backend.open(FILE_REFCOUNT_UPGRADE, true)?;
    new_refs.set_len(0)?;
    let per = REFS_PER_PAGE as u64;
    let pages = v1.hwm.div_ceil(per);
    let mut p0 = 0;
    let mut raw = vec![0u8; (PAGES_PER_WRITE * per * 4) as usize];
    let mut out = vec![0u8; (PAGES_PER_WRITE * GRAIN_BYTES) as usize];
    while p0 < pages {
        let n = PAGES_PER_WRITE.min(pages - p0);
        let first = p0 * per;
        old_refs.read_at(&mut raw[..(n * per * 4) as usize], first * 4)?;
        for i in 0..n {
            let mut counts = Box::new([0u32; REFS_PER_PAGE]);
            for (k, c) in counts.iter_mut().enumerate() {
                let g = first + i * per + k as u64;
                let at = ((i * per + k as u64) * 4) as usize;
                *c = match v1.counts.get(&g) {
                    Some(&c) => c,
                    None => u32::from_le_bytes(raw[at..at + 4].try_into().expect("4")),
                };
                if g >= v1.hwm {
                    *c = 0;
                }
            }
            let at = (i * GRAIN_BYTES) as usize;
            encode_ref_page(p0 + i, &counts, &mut out[at..at + GRAIN_BYTES as usize]);
        }
        new_refs.write_at(&out[..(n * GRAIN_BYTES) as usize], p0 * GRAIN_BYTES)?;
        p0 += n;
    }
    new_refs.sync()?;
    // Step 4: the catalog of generation g+1 and an empty log for it.
    let next = sb.generation + 1;
    let mut c = v1.catalog.clone();
    let mut recs: Vec<VersionRec> = v1.versions.values().map(|s| VersionRec::from(*s)).collect();
    recs.sort_by_key(|r| r.id);
    c.versions = recs;
    let catalog = c.encode();
    let cat_file = backend.open(catalog_file(next), true)?;
    cat_file.set_len(0)?;
    cat_file.write_at(&catalog, 0)?;
    cat_file.sync()?;
    for g in [next, next + 1] {
        let j = backend.open(journal_file(g), true)?;
        j.set_len(0)?;
        j.sync()?;
    }
    // Step 5: the version-2 superblock.
    let mut sb2 = sb.clone();
    sb2.generation = next;
    sb2.pool_grains = v1.hwm;
    sb2.catalog_bytes = catalog.len() as u64;
    sb2.catalog_checksum = crc32c::crc32c(&catalog);
    let super_file = backend.open(FILE_SUPER, false)?;
    super_file.write_at(&sb2.encode(), (next % 2) * SUPER_SLOT_BYTES as u64)?;
    super_file.sync()?;
    // Step 6.
    finish(backend)?;
    tracing::info!(
        "upgraded to format version 2: {} map nodes, {} count pages",
        seen.len(),
        pages
    );
    Ok(())
}

/// Step 6 of the upgrade; also run by a version-2 open that finds
/// `refcount.v2` (a crash between steps 5 and 6).
pub fn finish(backend: &dyn Backend) -> Result<()> {
    if backend.exists(FILE_REFCOUNT_UPGRADE) {
        backend.rename(FILE_REFCOUNT_UPGRADE, FILE_REFCOUNT)?;
    }
    backend.remove(FILE_JOURNAL_V1)?;
    Ok(())
}
