//! Metadata pages: map nodes in `pool.data`, count pages in `refcount.data`
//! (docs/FORMAT.md §3–4). A page read from disk is checked (checksum,
//! magic, the place it names, level, entries within the pool) before it is
//! cached; a page about to be written is asserted to satisfy the same
//! conditions. A failed check is an error naming the page and its byte
//! offset, never a guess.

use strata_format::{
    decode_map_node, decode_ref_page, encode_map_node, encode_ref_page, leaf_grain, MapNode,
    Record, BATCH_HEADER_BYTES, GRAIN_BYTES, MAP_FANOUT, REFS_PER_PAGE,
};

use std::sync::Arc;

use strata_storage::Storage;

use super::{corrupt, grain_runs, Meta};
use crate::cache::{PageData, PageKey, PageMut};
use crate::error::Result;

/// Largest run of adjacent pages written with one call at a checkpoint.
const RUN_PAGES_MAX: usize = 256;
/// Largest payload of one page-image batch (bounds the checkpoint's memory).
const IMAGE_BATCH_BYTES_MAX: usize = 8 << 20;

/// Dirty pages copied at a checkpoint's cut, with the pool's end then.
pub struct DirtyPages {
    pages: Vec<(PageKey, PageData)>,
    hwm: u64,
}

/// A dirty page encoded for a checkpoint.
pub struct EncodedPage {
    pub key: PageKey,
    pub bytes: Box<[u8; GRAIN_BYTES as usize]>,
}

/// Where a map node lives, for messages.
pub(crate) fn node_place(g: u64) -> String {
    format!("map node at grain {g} (pool.data byte {})", g * GRAIN_BYTES)
}

/// Where a count page lives, for messages.
pub(crate) fn ref_page_place(p: u64) -> String {
    format!("count page {p} (refcount.data byte {})", p * GRAIN_BYTES)
}

/// Check a node's entries against the pool (after a read, before a write).
/// A leaf entry's key index (bits 44–47, FORMAT.md §16.4) is not part of
/// its grain number; whether the disk has that key is for its reader.
pub(super) fn check_entries(
    g: u64,
    entries: &[u64; MAP_FANOUT],
    hwm: u64,
    level: u8,
) -> Result<()> {
    let grain = |e: u64| if level == 0 { leaf_grain(e) } else { e };
    if let Some((i, e)) = entries
        .iter()
        .enumerate()
        .find(|(_, &e)| e != 0 && (grain(e) >= hwm || grain(e) == 0))
    {
        return Err(corrupt(format!(
            "{}: entry {i} points at grain {}, outside the pool (1..{hwm})",
            node_place(g),
            grain(*e)
        )));
    }
    Ok(())
}

impl Meta {
    pub(super) fn check_grain(&self, g: u64, what: &str) -> Result<()> {
        if g == 0 || g >= self.alloc.hwm {
            return Err(corrupt(format!(
                "{what} points at grain {g}, outside the pool (1..{})",
                self.alloc.hwm
            )));
        }
        Ok(())
    }

    /// Read and check map node `g`, expected at `level`, from the pool.
    pub(super) fn read_node(&self, g: u64, level: u8) -> Result<MapNode> {
        self.check_grain(g, "a map entry")?;
        let mut buf = vec![0u8; GRAIN_BYTES as usize];
        self.pool.read_at(&mut buf, g * GRAIN_BYTES)?;
        let n = decode_map_node(&buf, g).map_err(|e| corrupt(format!("{}: {e}", node_place(g))))?;
        if n.level != level {
            return Err(corrupt(format!(
                "{}: level {} where level {level} is expected",
                node_place(g),
                n.level
            )));
        }
        check_entries(g, &n.entries, self.alloc.hwm, level)?;
        Ok(n)
    }

    fn load_node(&mut self, g: u64, level: u8) -> Result<()> {
        if let Some(PageData::Map(n)) = self.cache.peek(PageKey::Map(g)) {
            if n.level != level {
                return Err(corrupt(format!(
                    "{}: level {} where level {level} is expected",
                    node_place(g),
                    n.level
                )));
            }
            return Ok(());
        }
        let n = self.read_node(g, level)?;
        self.cache.insert(PageKey::Map(g), PageData::map(n), false);
        Ok(())
    }

    /// The entries of map node `g`, which the walk expects at `level`.
    pub fn node(&mut self, g: u64, level: u8) -> Result<&[u64; MAP_FANOUT]> {
        self.load_node(g, level)?;
        match self.cache.get(PageKey::Map(g)) {
            Some(PageData::Map(n)) => Ok(&n.entries),
            _ => unreachable!("map page just loaded"),
        }
    }

    /// Set entry `index` of node `g` (at `level`); returns the old entry.
    pub(super) fn node_set(&mut self, g: u64, level: u8, index: usize, value: u64) -> Result<u64> {
        assert!(index < MAP_FANOUT, "node {g}: index {index}");
        let grain = if level == 0 { leaf_grain(value) } else { value };
        assert!(
            value == 0 || (grain != 0 && grain < self.alloc.hwm),
            "node {g} entry {index}: grain {grain} outside the pool ({})",
            self.alloc.hwm
        );
        self.load_node(g, level)?;
        let old = match self.cache.get_dirty(PageKey::Map(g)) {
            Some(PageMut::Map(n)) => std::mem::replace(&mut n.entries[index], value),
            _ => unreachable!("map page just loaded"),
        };
        self.log_record(&Record::MapSet {
            grain: g,
            index: index as u16,
            value,
        });
        Ok(old)
    }

    /// Set entries `at ..` of leaf `g` to `values` (data grains, none 0),
    /// logged as MAP_RUN records of consecutive grains (docs/FORMAT.md
    /// §5); the old entries are appended to `old`.
    pub(super) fn leaf_set_run(
        &mut self,
        g: u64,
        at: usize,
        values: &[u64],
        old: &mut Vec<u64>,
    ) -> Result<()> {
        assert!(at + values.len() <= MAP_FANOUT, "leaf {g}: run at {at}");
        let hwm = self.alloc.hwm;
        assert!(
            values
                .iter()
                .all(|&v| leaf_grain(v) != 0 && leaf_grain(v) < hwm),
            "leaf {g}: a run points outside the pool ({hwm})"
        );
        self.load_node(g, 0)?;
        match self.cache.get_dirty(PageKey::Map(g)) {
            Some(PageMut::Map(n)) => {
                for (e, &v) in n.entries[at..at + values.len()].iter_mut().zip(values) {
                    old.push(std::mem::replace(e, v));
                }
            }
            _ => unreachable!("map page just loaded"),
        }
        for (a, b, _) in grain_runs(values) {
            let rec = if b - a == 1 {
                Record::MapSet {
                    grain: g,
                    index: (at + a) as u16,
                    value: values[a],
                }
            } else {
                Record::MapRun {
                    grain: g,
                    index: (at + a) as u16,
                    n: (b - a) as u16,
                    value: values[a],
                }
            };
            self.log_record(&rec);
        }
        Ok(())
    }

    /// Log counts of 1 for freshly allocated grains (their counts are
    /// already 1 in memory): REF_RUN records of consecutive grains.
    pub(super) fn log_new_counts(&mut self, grains: &[u64]) {
        for (a, b, _) in grain_runs(grains) {
            let rec = if b - a == 1 {
                Record::RefSet {
                    grain: grains[a],
                    count: 1,
                }
            } else {
                Record::RefRun {
                    grain: grains[a],
                    n: (b - a) as u32,
                    count: 1,
                }
            };
            self.log_record(&rec);
        }
    }

    /// Cache a node created in memory (dirty) and log its creation.
    pub(super) fn create_node(&mut self, g: u64, level: u8, entries: &[u64; MAP_FANOUT]) {
        if entries.iter().all(|&e| e == 0) {
            self.log_record(&Record::PageNew { grain: g, level });
        } else {
            let mut data = Box::new([0u8; GRAIN_BYTES as usize]);
            encode_map_node(entries, g, level, &mut data[..]);
            self.log_record(&Record::PageImage { grain: g, data });
        }
        self.cache.insert(
            PageKey::Map(g),
            PageData::map(MapNode {
                level,
                entries: Box::new(*entries),
            }),
            true,
        );
    }

    // ------------------------------------------------------------ counts

    /// Whether count page `p` may read as zeros (wholly past the durable pool).
    pub(super) fn ref_page_may_be_blank(&self, p: u64) -> bool {
        p * REFS_PER_PAGE as u64 >= self.durable_hwm
    }

    /// Read and check count page `p`.
    pub(super) fn read_ref_page(&self, p: u64) -> Result<Box<[u32; REFS_PER_PAGE]>> {
        let mut buf = vec![0u8; GRAIN_BYTES as usize];
        self.refs.read_at(&mut buf, p * GRAIN_BYTES)?;
        decode_ref_page(&buf, p, self.ref_page_may_be_blank(p))
            .map_err(|e| corrupt(format!("{}: {e}", ref_page_place(p))))
    }

    pub(super) fn load_ref_page(&mut self, p: u64) -> Result<()> {
        if self.cache.contains(PageKey::Ref(p)) {
            return Ok(());
        }
        let counts = self.read_ref_page(p)?;
        self.cache
            .insert(PageKey::Ref(p), PageData::counts(counts), false);
        Ok(())
    }

    /// `g`'s count. One page-cache lookup when its count page is cached
    /// (every allocation and release asks).
    pub fn ref_get(&mut self, g: u64) -> Result<u32> {
        let g = leaf_grain(g);
        let (page, i) = (
            g / REFS_PER_PAGE as u64,
            (g % REFS_PER_PAGE as u64) as usize,
        );
        if let Some(PageData::Ref(c)) = self.cache.get(PageKey::Ref(page)) {
            return Ok(c[i]);
        }
        self.load_ref_page(page)?;
        match self.cache.get(PageKey::Ref(page)) {
            Some(PageData::Ref(c)) => Ok(c[i]),
            _ => unreachable!("ref page just loaded"),
        }
    }

    /// The counts of `page`, loaded if need be, for modification (marked
    /// dirty).
    pub(super) fn ref_page_mut(&mut self, page: u64) -> Result<&mut [u32; REFS_PER_PAGE]> {
        self.load_ref_page(page)?;
        match self.cache.get_dirty(PageKey::Ref(page)) {
            Some(PageMut::Ref(c)) => Ok(c),
            _ => unreachable!("ref page just loaded"),
        }
    }

    /// Set a count in memory only (allocation before install).
    pub(super) fn ref_put(&mut self, g: u64, count: u32) -> Result<()> {
        let page = g / REFS_PER_PAGE as u64;
        self.ref_page_mut(page)?[(g % REFS_PER_PAGE as u64) as usize] = count;
        Ok(())
    }

    pub(super) fn ref_set(&mut self, g: u64, count: u32) -> Result<()> {
        self.ref_put(g, count)?;
        self.log_record(&Record::RefSet { grain: g, count });
        Ok(())
    }

    /// Make the count pages covering grains `[from, to)` dirty, so the next
    /// checkpoint writes them even if none of their counts changes.
    pub(super) fn materialize_ref_pages(&mut self, from: u64, to: u64) -> Result<()> {
        if from >= to {
            return Ok(());
        }
        let per = REFS_PER_PAGE as u64;
        for p in from / per..to.div_ceil(per) {
            self.ref_page_mut(p)?;
        }
        Ok(())
    }

    // ------------------------------------------------------------ checkpoint

    /// Every dirty page, sorted by file and place, for a checkpoint's cut:
    /// under the locks only a shared reference to each (a page changed
    /// after the cut is copied then, see [`PageData`]); encoding
    /// (checksums) happens after they are released ([`Meta::encode_pages`]).
    pub fn copy_dirty_pages(&self) -> DirtyPages {
        let mut pages: Vec<(PageKey, PageData)> =
            self.cache.dirty().map(|(k, d)| (k, d.clone())).collect();
        pages.sort_by_key(|(k, _)| k.place());
        DirtyPages {
            pages,
            hwm: self.alloc.hwm,
        }
    }

    /// Encode the pages a cut copied (checkpoint steps 2–3). Each node is
    /// asserted against the pool before it is encoded.
    pub fn encode_pages(dirty: DirtyPages) -> Vec<EncodedPage> {
        dirty
            .pages
            .into_iter()
            .map(|(key, data)| {
                let mut bytes = Box::new([0u8; GRAIN_BYTES as usize]);
                match (key, &data) {
                    (PageKey::Map(g), PageData::Map(n)) => {
                        if let Err(e) = check_entries(g, &n.entries, dirty.hwm, n.level) {
                            panic!("refusing to write a bad map node: {e}");
                        }
                        encode_map_node(&n.entries, g, n.level, &mut bytes[..]);
                    }
                    (PageKey::Ref(p), PageData::Ref(c)) => {
                        encode_ref_page(p, c, &mut bytes[..]);
                    }
                    _ => unreachable!("a page key and its data are of one kind"),
                }
                EncodedPage { key, bytes }
            })
            .collect()
    }

    /// Pages per page-image batch (checkpoint step 2).
    pub const IMAGES_PER_BATCH: usize = IMAGE_BATCH_BYTES_MAX / (GRAIN_BYTES as usize + 16);

    /// One page-image batch (checkpoint step 2) for `pages`, at most
    /// [`Meta::IMAGES_PER_BATCH`] of them, built in `out` (cleared first,
    /// its capacity reused): room for the batch header, then the records;
    /// `end` adds GENERATION_END(next). `LogWriter::append_sealed` seals it.
    pub fn image_batch_into(pages: &[EncodedPage], end: Option<u64>, out: &mut Vec<u8>) {
        assert!(
            pages.len() <= Self::IMAGES_PER_BATCH,
            "too many images for one batch"
        );
        out.clear();
        out.reserve(BATCH_HEADER_BYTES + pages.len() * (GRAIN_BYTES as usize + 9) + 9);
        out.resize(BATCH_HEADER_BYTES, 0);
        for p in pages {
            let (tag, place) = match p.key {
                PageKey::Map(g) => (strata_format::tag::PAGE_IMAGE, g),
                PageKey::Ref(q) => (strata_format::tag::REF_PAGE_IMAGE, q),
            };
            // The records' encoding, written without copying each page
            // into a record first.
            out.push(tag);
            out.extend_from_slice(&place.to_le_bytes());
            out.extend_from_slice(&p.bytes[..]);
        }
        if let Some(next) = end {
            Record::GenerationEnd { next }.encode_into(out);
        }
    }

    /// Write encoded pages in place (checkpoint step 3); adjacent pages go
    /// out as one write of at most 1 MiB.
    pub fn write_pages_to(
        pool: &Arc<dyn Storage>,
        refs: &Arc<dyn Storage>,
        pages: &[EncodedPage],
    ) -> Result<()> {
        let mut run: Vec<u8> = Vec::with_capacity(RUN_PAGES_MAX * GRAIN_BYTES as usize);
        let mut i = 0;
        while i < pages.len() {
            let (kind, first) = pages[i].key.place();
            let mut j = i + 1;
            while j < pages.len()
                && j - i < RUN_PAGES_MAX
                && pages[j].key.place() == (kind, first + (j - i) as u64)
            {
                j += 1;
            }
            run.clear();
            for p in &pages[i..j] {
                run.extend_from_slice(&p.bytes[..]);
            }
            let target = if kind == 0 { pool } else { refs };
            target.write_at(&run, first * GRAIN_BYTES)?;
            i = j;
        }
        Ok(())
    }

    /// Where a checkpoint cuts: (page-change sequence, pool end). The pages
    /// dirty at the cut are what `encode_dirty_pages` returns now.
    pub fn cut(&self) -> (u64, u64) {
        (self.cache.cut(), self.alloc.hwm)
    }

    /// The checkpoint that cut at `cut` is durable: the pages it wrote are
    /// clean, and count pages below the cut's pool end exist on disk.
    pub fn checkpointed(&mut self, cut: (u64, u64)) {
        self.cache.mark_clean_upto(cut.0);
        self.durable_hwm = cut.1;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn image_payloads_decode_as_the_records_they_stand_for() {
        let node = EncodedPage {
            key: PageKey::Map(9),
            bytes: Box::new([3u8; GRAIN_BYTES as usize]),
        };
        let count = EncodedPage {
            key: PageKey::Ref(2),
            bytes: Box::new([4u8; GRAIN_BYTES as usize]),
        };
        let mut p = vec![9u8; 3];
        Meta::image_batch_into(&[node, count], Some(12), &mut p);
        let recs = Record::decode_all(&p[BATCH_HEADER_BYTES..]).unwrap();
        assert_eq!(
            recs,
            vec![
                Record::PageImage {
                    grain: 9,
                    data: Box::new([3u8; GRAIN_BYTES as usize])
                },
                Record::RefPageImage {
                    page: 2,
                    data: Box::new([4u8; GRAIN_BYTES as usize])
                },
                Record::GenerationEnd { next: 12 },
            ]
        );
        assert!(Meta::IMAGES_PER_BATCH * (GRAIN_BYTES as usize + 9) <= IMAGE_BATCH_BYTES_MAX);
    }
}
