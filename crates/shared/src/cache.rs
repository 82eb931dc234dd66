//! This host's cache of a shared datastore's objects (docs/FORMAT.md
//! §11.8): whole segments as files under `DIR/cache/`, verified end to end
//! before they are kept, and decoded map nodes in memory. A read that
//! misses is answered with a ranged GET of just the grain or node (a cold
//! cache does not make a guest wait for whole segments) while the whole
//! segment is fetched in the background, two at a time. Objects never change, so nothing here is ever invalidated;
//! every grain and node read is still checked against the CRC its map entry
//! carries, so a damaged cache file is an error naming it, never data.

use std::collections::{HashMap, HashSet};
use std::fs::File;
use std::io::Write;
use std::os::unix::fs::FileExt;
use std::path::PathBuf;
use std::sync::{Arc, Mutex, RwLock};

use strata_objstore::ObjectStore;

use crate::layout::{
    decode_segment_header, verify_segment, Entry, MapNode, SegId, SegmentInfo, GRAIN, NODE_BYTES,
    SEG_DATA_OFFSET, SEG_HEADER_BYTES,
};
use crate::{Error, ErrorKind, Result};

struct CachedSegment {
    file: File,
    info: SegmentInfo,
}

/// Segments and nodes this host has read or written.
pub struct SegmentCache {
    dir: PathBuf,
    segments: RwLock<HashMap<SegId, Arc<CachedSegment>>>,
    nodes: RwLock<HashMap<(SegId, u32), Arc<MapNode>>>,
    /// One fetch of a segment at a time per segment: a cold disk read by
    /// many threads fetches each segment once.
    fetching: Mutex<HashMap<SegId, Arc<Mutex<()>>>>,
    /// Headers of segments not (yet) cached, for ranged reads of nodes.
    headers: RwLock<HashMap<SegId, SegmentInfo>>,
    /// Segments being fetched in the background.
    prefetching: Mutex<HashSet<SegId>>,
}

/// Background fetches of whole segments at once.
const PREFETCH_MAX: usize = 2;

fn corrupt(msg: String) -> Error {
    Error::new(ErrorKind::Corrupt, msg)
}

impl SegmentCache {
    pub fn new(dir: PathBuf) -> Self {
        SegmentCache {
            dir,
            segments: RwLock::new(HashMap::new()),
            nodes: RwLock::new(HashMap::new()),
            fetching: Mutex::new(HashMap::new()),
            headers: RwLock::new(HashMap::new()),
            prefetching: Mutex::new(HashSet::new()),
        }
    }

    /// The segment if it is here (memory or the cache directory), without
    /// asking the store.
    fn local(&self, id: SegId) -> Option<Arc<CachedSegment>> {
        if let Some(s) = self.segments.read().unwrap().get(&id) {
            return Some(s.clone());
        }
        let file = File::open(self.path(id)).ok()?;
        let mut h = [0u8; SEG_HEADER_BYTES];
        file.read_exact_at(&mut h, 0).ok()?;
        let info = decode_segment_header(&id.key(), &h).ok()?;
        if file.metadata().ok()?.len() != info.len() {
            return None;
        }
        let s = Arc::new(CachedSegment { file, info });
        self.segments.write().unwrap().insert(id, s.clone());
        Some(s)
    }

    /// Fetch segment `id` whole in the background (at most
    /// [`PREFETCH_MAX`] at once; a later miss asks again).
    fn prefetch(self: &Arc<Self>, store: &Arc<ObjectStore>, id: SegId) {
        {
            let mut p = self.prefetching.lock().unwrap();
            if p.len() >= PREFETCH_MAX || !p.insert(id) {
                return;
            }
        }
        let (me, store) = (self.clone(), store.clone());
        let spawned = std::thread::Builder::new()
            .name("segment-fetch".into())
            .spawn(move || {
                if let Err(e) = me.segment(&store, id) {
                    eprintln!("strata: background fetch of {}: {e}", id.key());
                }
                me.prefetching.lock().unwrap().remove(&id);
            });
        if spawned.is_err() {
            self.prefetching.lock().unwrap().remove(&id);
        }
    }

    /// Have segment `id` here whole (verified), fetching it now if needed.
    pub fn fetch(&self, store: &ObjectStore, id: SegId) -> Result<()> {
        self.segment(store, id).map(|_| ())
    }

    /// A segment's header, for a ranged read of one of its nodes.
    fn header(&self, store: &ObjectStore, id: SegId) -> Result<SegmentInfo> {
        if let Some(i) = self.headers.read().unwrap().get(&id) {
            return Ok(*i);
        }
        let key = id.key();
        let h = store
            .get_range(&key, 0..SEG_HEADER_BYTES as u64)
            .map_err(Error::from)?;
        let info = decode_segment_header(&key, &h).map_err(corrupt)?;
        self.headers.write().unwrap().insert(id, info);
        Ok(info)
    }

    fn path(&self, id: SegId) -> PathBuf {
        self.dir.join(id.key())
    }

    /// Keep a segment this host has just uploaded (its bytes are in hand).
    pub fn insert(&self, id: SegId, bytes: &[u8]) -> Result<()> {
        let info = decode_segment_header(&id.key(), bytes).map_err(corrupt)?;
        let file = self.write_file(id, bytes)?;
        self.segments
            .write()
            .unwrap()
            .insert(id, Arc::new(CachedSegment { file, info }));
        Ok(())
    }

    fn write_file(&self, id: SegId, bytes: &[u8]) -> Result<File> {
        let path = self.path(id);
        let parent = path.parent().expect("segment keys have a directory");
        let io = |what: &str, e: std::io::Error| {
            Error::new(
                ErrorKind::Io,
                format!("cannot {what} cache file {}: {e}", path.display()),
            )
        };
        std::fs::create_dir_all(parent).map_err(|e| io("make the directory of", e))?;
        let tmp = path.with_extension(format!("tmp{}", std::process::id()));
        let mut f = File::create(&tmp).map_err(|e| io("create", e))?;
        f.write_all(bytes).map_err(|e| io("write", e))?;
        std::fs::rename(&tmp, &path).map_err(|e| io("rename", e))?;
        File::open(&path).map_err(|e| io("open", e))
    }

    /// The segment, from memory, the cache directory, or the store.
    fn segment(&self, store: &ObjectStore, id: SegId) -> Result<Arc<CachedSegment>> {
        if let Some(s) = self.segments.read().unwrap().get(&id) {
            return Ok(s.clone());
        }
        let gate = self.fetching.lock().unwrap().entry(id).or_default().clone();
        let _one = gate.lock().unwrap();
        // Fetched by another thread meanwhile, or cached by an earlier run.
        let seg = match self.local(id) {
            Some(s) => Ok(s),
            None => self.fetch_whole(store, id),
        };
        self.fetching.lock().unwrap().remove(&id);
        seg
    }

    /// GET segment `id`, verify it end to end, keep it as a file.
    fn fetch_whole(&self, store: &ObjectStore, id: SegId) -> Result<Arc<CachedSegment>> {
        let key = id.key();
        let mut bytes = store.get(&key).map_err(Error::from)?;
        if id.payload_of().is_some() {
            // A manifest's payload: the segment is its first part (§11.5).
            let info = decode_segment_header(&key, &bytes).map_err(corrupt)?;
            if info.len() <= bytes.len() as u64 {
                bytes.truncate(info.len() as usize);
            }
        }
        let info = verify_segment(&key, &bytes).map_err(corrupt)?;
        let s = Arc::new(CachedSegment {
            file: self.write_file(id, &bytes)?,
            info,
        });
        self.segments.write().unwrap().insert(id, s.clone());
        Ok(s)
    }

    /// Read the grain `e` points at into `out` (4096 bytes), checking its CRC.
    pub fn read_grain(
        self: &Arc<Self>,
        store: &Arc<ObjectStore>,
        e: &Entry,
        out: &mut [u8],
    ) -> Result<()> {
        let out = &mut out[..GRAIN];
        let place = match self.local(e.seg) {
            Some(seg) => {
                if e.slot >= seg.info.grains {
                    return Err(corrupt(format!(
                        "{}: a map entry names grain {} of a segment with {}",
                        e.seg.key(),
                        e.slot,
                        seg.info.grains
                    )));
                }
                seg.file
                    .read_exact_at(out, SegmentInfo::grain_offset(e.slot))
                    .map_err(|err| {
                        Error::new(
                            ErrorKind::Io,
                            format!("cannot read {}: {err}", self.path(e.seg).display()),
                        )
                    })?;
                format!("cached copy {}", self.path(e.seg).display())
            }
            None => {
                self.prefetch(store, e.seg);
                let at = SegmentInfo::grain_offset(e.slot);
                let b = store
                    .get_range(&e.seg.key(), at..at + GRAIN as u64)
                    .map_err(Error::from)?;
                out.copy_from_slice(&b);
                "read from the store".to_string()
            }
        };
        if crc32c::crc32c(out) != e.crc {
            return Err(corrupt(format!(
                "{}: grain {} does not match the checksum its map entry holds ({place})",
                e.seg.key(),
                e.slot,
            )));
        }
        Ok(())
    }

    /// The map node `e` points at, expected at `level` covering from `first`.
    pub fn node(
        self: &Arc<Self>,
        store: &Arc<ObjectStore>,
        e: &Entry,
        level: u8,
        first: u64,
    ) -> Result<Arc<MapNode>> {
        if let Some(n) = self.nodes.read().unwrap().get(&(e.seg, e.slot)) {
            return Ok(n.clone());
        }
        let mut b = vec![0u8; NODE_BYTES];
        match self.local(e.seg) {
            Some(seg) => {
                check_node_slot(e, &seg.info)?;
                seg.file
                    .read_exact_at(&mut b, seg.info.node_offset(e.slot))
                    .map_err(|err| {
                        Error::new(
                            ErrorKind::Io,
                            format!("cannot read {}: {err}", self.path(e.seg).display()),
                        )
                    })?;
            }
            None => {
                self.prefetch(store, e.seg);
                // Segments of map nodes hold no grains (commits and folds
                // write nodes apart, FORMAT.md §11.4a), so node `slot` is
                // at a known offset: one round trip instead of two. The
                // CRC its entry holds says whether the guess was right;
                // if not, the header says where it is.
                let guess = SEG_DATA_OFFSET as u64 + e.slot as u64 * NODE_BYTES as u64;
                let got = match self.headers.read().unwrap().get(&e.seg) {
                    Some(_) => None,
                    None => store
                        .get_range(&e.seg.key(), guess..guess + NODE_BYTES as u64)
                        .ok()
                        .filter(|g| crc32c::crc32c(g) == e.crc),
                };
                match got {
                    Some(g) => b.copy_from_slice(&g),
                    None => {
                        let info = self.header(store, e.seg)?;
                        check_node_slot(e, &info)?;
                        let at = info.node_offset(e.slot);
                        b.copy_from_slice(
                            &store
                                .get_range(&e.seg.key(), at..at + NODE_BYTES as u64)
                                .map_err(Error::from)?,
                        );
                    }
                }
            }
        }
        if crc32c::crc32c(&b) != e.crc {
            return Err(corrupt(format!(
                "{}: map node {} does not match the checksum its parent holds",
                e.seg.key(),
                e.slot
            )));
        }
        let place = format!("{} node {}", e.seg.key(), e.slot);
        let node = Arc::new(MapNode::decode(&place, &b, level, first).map_err(corrupt)?);
        self.nodes
            .write()
            .unwrap()
            .insert((e.seg, e.slot), node.clone());
        Ok(node)
    }

    /// Keep a node this host has just written (it is in a segment that was
    /// inserted).
    pub fn insert_node(&self, e: &Entry, node: MapNode) {
        self.nodes
            .write()
            .unwrap()
            .insert((e.seg, e.slot), Arc::new(node));
    }
}

fn check_node_slot(e: &Entry, info: &SegmentInfo) -> Result<()> {
    if e.slot >= info.nodes {
        return Err(corrupt(format!(
            "{}: a map entry names node {} of a segment with {}",
            e.seg.key(),
            e.slot,
            info.nodes
        )));
    }
    Ok(())
}
