//! This host's cache of a shared datastore's objects (docs/FORMAT.md
//! §11.8): whole segments as files under `DIR/cache/`, fetched on first
//! use and verified end to end before they are kept, and decoded map nodes
//! in memory. Objects never change, so nothing here is ever invalidated;
//! every grain and node read is still checked against the CRC its map entry
//! carries, so a damaged cache file is an error naming it, never data.

use std::collections::HashMap;
use std::fs::File;
use std::io::Write;
use std::os::unix::fs::FileExt;
use std::path::PathBuf;
use std::sync::{Arc, Mutex, RwLock};

use strata_objstore::ObjectStore;

use crate::layout::{
    decode_segment_header, verify_segment, Entry, MapNode, SegId, SegmentInfo, GRAIN, NODE_BYTES,
    SEG_HEADER_BYTES,
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
}

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
        }
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
        if let Some(s) = self.segments.read().unwrap().get(&id) {
            return Ok(s.clone());
        }
        let key = id.key();
        let path = self.path(id);
        let from_disk = File::open(&path).ok().and_then(|file| {
            let mut h = [0u8; SEG_HEADER_BYTES];
            file.read_exact_at(&mut h, 0).ok()?;
            let info = decode_segment_header(&key, &h).ok()?;
            let len = file.metadata().ok()?.len();
            (len == info.len()).then_some(CachedSegment { file, info })
        });
        let seg = match from_disk {
            Some(s) => Ok(s),
            None => store.get(&key).map_err(Error::from).and_then(|bytes| {
                let info = verify_segment(&key, &bytes).map_err(corrupt)?;
                Ok(CachedSegment {
                    file: self.write_file(id, &bytes)?,
                    info,
                })
            }),
        };
        let seg = seg.map(Arc::new);
        if let Ok(s) = &seg {
            self.segments.write().unwrap().insert(id, s.clone());
        }
        self.fetching.lock().unwrap().remove(&id);
        seg
    }

    /// Read the grain `e` points at into `out` (4096 bytes), checking its CRC.
    pub fn read_grain(&self, store: &ObjectStore, e: &Entry, out: &mut [u8]) -> Result<()> {
        let seg = self.segment(store, e.seg)?;
        if e.slot >= seg.info.grains {
            return Err(corrupt(format!(
                "{}: a map entry names grain {} of a segment with {}",
                e.seg.key(),
                e.slot,
                seg.info.grains
            )));
        }
        let out = &mut out[..GRAIN];
        seg.file
            .read_exact_at(out, SegmentInfo::grain_offset(e.slot))
            .map_err(|err| {
                Error::new(
                    ErrorKind::Io,
                    format!("cannot read {}: {err}", self.path(e.seg).display()),
                )
            })?;
        if crc32c::crc32c(out) != e.crc {
            return Err(corrupt(format!(
                "{}: grain {} does not match the checksum its map entry holds (cached copy {})",
                e.seg.key(),
                e.slot,
                self.path(e.seg).display()
            )));
        }
        Ok(())
    }

    /// The map node `e` points at, expected at `level` covering from `first`.
    pub fn node(
        &self,
        store: &ObjectStore,
        e: &Entry,
        level: u8,
        first: u64,
    ) -> Result<Arc<MapNode>> {
        if let Some(n) = self.nodes.read().unwrap().get(&(e.seg, e.slot)) {
            return Ok(n.clone());
        }
        let seg = self.segment(store, e.seg)?;
        if e.slot >= seg.info.nodes {
            return Err(corrupt(format!(
                "{}: a map entry names node {} of a segment with {}",
                e.seg.key(),
                e.slot,
                seg.info.nodes
            )));
        }
        let mut b = vec![0u8; NODE_BYTES];
        seg.file
            .read_exact_at(&mut b, seg.info.node_offset(e.slot))
            .map_err(|err| {
                Error::new(
                    ErrorKind::Io,
                    format!("cannot read {}: {err}", self.path(e.seg).display()),
                )
            })?;
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
