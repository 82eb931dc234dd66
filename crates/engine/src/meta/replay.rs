//! Recovery: applying log records (docs/FORMAT.md §5, "Replay") and
//! rebuilding the free-space summary from the count pages.
//!
//! A page replay reads from disk is checked; one that fails is kept
//! *unverified* instead of failing at once, because a later record may
//! legitimately rewrite it whole (a checkpoint's page image after a torn
//! in-place write) or drop it (a node whose grain was freed and became
//! data). One still live and unverified when replay ends is an error. No
//! checksum is ever recomputed over bytes that failed one.

use std::collections::HashMap;

use strata_format::{
    decode_map_node, decode_map_node_v1, decode_ref_page, MapNode, Record, BLOCK_GRAINS,
    GRAIN_BYTES, MAP_FANOUT, REFS_PER_PAGE,
};

use super::pages::{check_entries, node_place, ref_page_place};
use super::{corrupt, Meta};
use crate::cache::{PageData, PageKey};
use crate::catalog::Catalog;
use crate::error::Result;

/// Count pages read per call while rebuilding free space (1 MiB).
const SCAN_PAGES: u64 = 256;

struct ReplayNode {
    level: Option<u8>,
    entries: Box<[u64; MAP_FANOUT]>,
    /// Why the on-disk page failed its check, until a record rewrites it.
    unverified: Option<String>,
}

struct ReplayRefPage {
    counts: Box<[u32; REFS_PER_PAGE]>,
    unverified: Option<String>,
}

/// Pages replay holds while it runs.
#[derive(Default)]
pub(super) struct ReplayState {
    nodes: HashMap<u64, ReplayNode>,
    ref_pages: HashMap<u64, ReplayRefPage>,
}

fn bump(hwm: &mut u64, g: u64) {
    *hwm = (*hwm).max(super::pool_end_covering(g));
}

impl Meta {
    fn replay_ref_page(&mut self, p: u64) -> Result<&mut ReplayRefPage> {
        if !self.replay.ref_pages.contains_key(&p) {
            let mut buf = vec![0u8; GRAIN_BYTES as usize];
            self.refs.read_at(&mut buf, p * GRAIN_BYTES)?;
            let page = match decode_ref_page(&buf, p, self.ref_page_may_be_blank(p)) {
                Ok(counts) => ReplayRefPage {
                    counts,
                    unverified: None,
                },
                Err(e) => {
                    let mut counts = Box::new([0u32; REFS_PER_PAGE]);
                    for (i, c) in counts.iter_mut().enumerate() {
                        *c = u32::from_le_bytes(buf[i * 4..i * 4 + 4].try_into().expect("4"));
                    }
                    ReplayRefPage {
                        counts,
                        unverified: Some(e.to_string()),
                    }
                }
            };
            self.replay.ref_pages.insert(p, page);
        }
        Ok(self.replay.ref_pages.get_mut(&p).expect("inserted"))
    }

    /// The map node `grain` as replay holds it, read from the pool (and
    /// checked) when replay does not hold it yet.
    fn replay_node(&mut self, grain: u64) -> Result<&mut ReplayNode> {
        if !self.replay.nodes.contains_key(&grain) {
            self.check_grain(grain, "a log record")?;
            let mut buf = vec![0u8; GRAIN_BYTES as usize];
            self.pool.read_at(&mut buf, grain * GRAIN_BYTES)?;
            let node = match decode_map_node(&buf, grain) {
                Ok(n) => ReplayNode {
                    level: Some(n.level),
                    entries: n.entries,
                    unverified: None,
                },
                Err(e) => ReplayNode {
                    level: None,
                    entries: decode_map_node_v1(&buf)?,
                    unverified: Some(e.to_string()),
                },
            };
            self.replay.nodes.insert(grain, node);
        }
        Ok(self.replay.nodes.get_mut(&grain).expect("inserted"))
    }

    /// Replay a count: `grain`'s := `count`; a node dropped to 0 is no
    /// longer a node (replay must never write over data).
    fn replay_count(&mut self, grain: u64, count: u32) -> Result<()> {
        bump(&mut self.alloc.hwm, grain);
        let p = grain / REFS_PER_PAGE as u64;
        self.replay_ref_page(p)?.counts[(grain % REFS_PER_PAGE as u64) as usize] = count;
        if count == 0 {
            self.replay.nodes.remove(&grain);
            self.cache.remove(PageKey::Map(grain));
        }
        Ok(())
    }

    /// A map node whose whole content a record gives (an image, or a new
    /// node of zeros).
    fn replay_whole_node(&mut self, grain: u64, level: u8, entries: Box<[u64; MAP_FANOUT]>) {
        bump(&mut self.alloc.hwm, grain);
        self.replay.nodes.insert(
            grain,
            ReplayNode {
                level: Some(level),
                entries,
                unverified: None,
            },
        );
    }

    /// Apply one replayed record (docs/FORMAT.md §5).
    pub fn replay(&mut self, rec: Record) -> Result<()> {
        match rec {
            Record::PageImage { grain, data } => {
                let n = decode_map_node(&data[..], grain).map_err(|e| {
                    corrupt(format!("log: the image of {}: {e}", node_place(grain)))
                })?;
                self.replay_whole_node(grain, n.level, n.entries);
            }
            Record::PageNew { grain, level } => {
                self.replay_whole_node(grain, level, Box::new([0; MAP_FANOUT]));
            }
            Record::PageZeroV1 { grain } => {
                return Err(corrupt(format!(
                    "log: a version-1 record (PAGE_ZERO of grain {grain}) in a version-2 log"
                )));
            }
            Record::MapSet {
                grain,
                index,
                value,
            } => {
                self.replay_node(grain)?.entries[index as usize] = value;
            }
            Record::MapRun {
                grain,
                index,
                n,
                value,
            } => {
                let node = self.replay_node(grain)?;
                let at = index as usize;
                for (i, e) in node.entries[at..at + n as usize].iter_mut().enumerate() {
                    *e = value + i as u64;
                }
            }
            Record::RefSet { grain, count } => self.replay_count(grain, count)?,
            Record::RefRun { grain, n, count } => {
                for g in grain..grain + n as u64 {
                    self.replay_count(g, count)?;
                }
            }
            Record::RefPageImage { page, data } => {
                let counts = decode_ref_page(&data[..], page, false).map_err(|e| {
                    corrupt(format!("log: the image of {}: {e}", ref_page_place(page)))
                })?;
                self.replay.ref_pages.insert(
                    page,
                    ReplayRefPage {
                        counts,
                        unverified: None,
                    },
                );
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
            Record::GenerationEnd { .. } => {}
        }
        Ok(())
    }

    /// After replay: cache the rebuilt pages (dirty), make sure every count
    /// page below the pool's end exists, and rebuild free space.
    pub fn finish_open(&mut self) -> Result<()> {
        let mut nodes: Vec<(u64, ReplayNode)> = self.replay.nodes.drain().collect();
        nodes.sort_by_key(|(g, _)| *g);
        for (g, n) in nodes {
            if let Some(why) = n.unverified {
                return Err(corrupt(format!(
                    "{}: {why}; the log changes it but never rewrites it whole",
                    node_place(g)
                )));
            }
            let level = n.level.expect("a verified node has a level");
            check_entries(g, &n.entries, self.alloc.hwm, level)?;
            self.cache.insert(
                PageKey::Map(g),
                PageData::map(MapNode {
                    level,
                    entries: n.entries,
                }),
                true,
            );
        }
        let mut pages: Vec<(u64, ReplayRefPage)> = self.replay.ref_pages.drain().collect();
        pages.sort_by_key(|(p, _)| *p);
        for (p, r) in pages {
            if let Some(why) = r.unverified {
                return Err(corrupt(format!(
                    "{}: {why}; the log changes it but never rewrites it whole",
                    ref_page_place(p)
                )));
            }
            self.cache
                .insert(PageKey::Ref(p), PageData::counts(r.counts), true);
        }
        // The pool grew since the last checkpoint: its new count pages
        // must be written by the checkpoint that follows recovery.
        let (from, to) = (self.durable_hwm, self.alloc.hwm);
        self.materialize_ref_pages(from, to)?;
        self.rebuild_free_space()
    }

    /// Read every count page below the pool's end (checking each) and
    /// rebuild the per-block free counts and `used_grains`.
    fn rebuild_free_space(&mut self) -> Result<()> {
        self.alloc.reset();
        self.used_grains = 0;
        let per = REFS_PER_PAGE as u64;
        let pages = self.alloc.hwm.div_ceil(per);
        let mut buf = vec![0u8; (SCAN_PAGES * GRAIN_BYTES) as usize];
        let mut block_free = 0u16;
        let mut damaged: Vec<String> = Vec::new();
        let mut p0 = 0;
        while p0 < pages {
            let n = SCAN_PAGES.min(pages - p0);
            self.refs
                .read_at(&mut buf[..(n * GRAIN_BYTES) as usize], p0 * GRAIN_BYTES)?;
            for i in 0..n {
                let p = p0 + i;
                let counts = match self.cache.peek(PageKey::Ref(p)) {
                    Some(PageData::Ref(c)) => Box::new(**c),
                    _ => {
                        let b = &buf[(i * GRAIN_BYTES) as usize..((i + 1) * GRAIN_BYTES) as usize];
                        match decode_ref_page(b, p, self.ref_page_may_be_blank(p)) {
                            Ok(c) => c,
                            Err(e) => {
                                // Name every damaged page, not only the first.
                                damaged.push(format!("{}: {e}", ref_page_place(p)));
                                Box::new([0; REFS_PER_PAGE])
                            }
                        }
                    }
                };
                for (k, &count) in counts.iter().enumerate() {
                    let g = p * per + k as u64;
                    if g >= self.alloc.hwm {
                        if count != 0 {
                            return Err(corrupt(format!(
                                "{}: grain {g} past the pool's end has count {count}",
                                ref_page_place(p)
                            )));
                        }
                        continue;
                    }
                    if g != 0 {
                        if count == 0 {
                            block_free += 1;
                        } else {
                            self.used_grains += 1;
                        }
                    }
                    if (g + 1).is_multiple_of(BLOCK_GRAINS) {
                        self.alloc.set_block_free(g / BLOCK_GRAINS, block_free);
                        block_free = 0;
                    }
                }
            }
            p0 += n;
        }
        if !damaged.is_empty() {
            const LISTED_MAX: usize = 16;
            let more = damaged.len().saturating_sub(LISTED_MAX);
            damaged.truncate(LISTED_MAX);
            if more > 0 {
                damaged.push(format!("and {more} more damaged count pages"));
            }
            return Err(corrupt(damaged.join("; ")));
        }
        Ok(())
    }
}
