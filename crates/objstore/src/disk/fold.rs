//! Folds (§11.4a): the tail turned into map nodes, inline or in the
//! background, and the node rewrites a fold makes.

use super::*;

impl ObjectDisk {
    /// After a commit: once the tail is [`TAIL_FOLD`] long, fold it in
    /// the background (one fold at a time); the next commit after it is
    /// uploaded names it.
    pub(super) fn maybe_fold(&self) {
        let (man, ctr) = {
            let mut st = self.state.lock().unwrap();
            if st.man.tail.len() < TAIL_FOLD
                || st.folding.is_some()
                || st.fold.is_some()
                || !st.owner
                || st.fenced.is_some()
            {
                return;
            }
            let ctr = st.next_ctr;
            st.next_ctr += 1;
            st.folding = Some(ctr);
            (st.man.clone(), ctr)
        };
        let Some(me) = self.me.upgrade() else { return };
        let spawned = std::thread::Builder::new()
            .name("strata-fold".into())
            .spawn(move || {
                let r = me.fold_in_background(&man, ctr);
                let mut st = me.state.lock().unwrap();
                st.folding = None;
                match r {
                    Ok(f) => st.fold = Some(f),
                    Err(e) => tracing::warn!(
                        "disk '{}': a background fold failed (a later one retries): {e}",
                        me.name
                    ),
                }
            });
        if spawned.is_err() {
            self.state.lock().unwrap().folding = None;
        }
    }

    /// Fold `man`'s tail into its map: upload the nodes as segment `ctr`.
    pub(super) fn fold_in_background(&self, man: &Manifest, ctr: u32) -> Result<Fold> {
        let mut b = SegmentBuilder::new(SegId {
            disk: self.id,
            gen: man.generation,
            ctr,
        });
        let mut nodes = Vec::new();
        let (root, levels) = Folder::new(self, man, &mut b, &mut nodes)
            .fold_tail(man.root, man.levels, &man.tail)?;
        if !nodes.is_empty() {
            self.upload(&[(b.id, Bytes::from(b.seal(now_ms())))])?;
            for (e, n) in nodes {
                self.ds.cache.insert_node(&e, n);
            }
        }
        Ok(Fold {
            gen: man.generation,
            base_root: man.root,
            base_levels: man.levels,
            folded: man.tail.clone(),
            root,
            levels,
        })
    }
}

/// One fold's copy-on-write of a map: the disk and manifest it folds
/// for, and where its new nodes go (the segment being built, and the list
/// of nodes made, for the cache once it is uploaded).
pub(super) struct Folder<'a> {
    disk: &'a ObjectDisk,
    man: &'a Manifest,
    b: &'a mut SegmentBuilder,
    made: &'a mut Vec<(Entry, MapNode)>,
}

impl<'a> Folder<'a> {
    pub(super) fn new(
        disk: &'a ObjectDisk,
        man: &'a Manifest,
        b: &'a mut SegmentBuilder,
        made: &'a mut Vec<(Entry, MapNode)>,
    ) -> Self {
        Folder { disk, man, b, made }
    }

    /// Apply `tail` to the map at `root` (`levels` levels), copy-on-write;
    /// grows the tree for grains past what it maps (§11.5). The new root
    /// and levels.
    pub(super) fn fold_tail(
        &mut self,
        root: Option<Entry>,
        levels: u8,
        tail: &Tail,
    ) -> Result<(Option<Entry>, u8)> {
        let items: Vec<(u64, Option<Entry>)> = tail.iter().map(|(k, e)| (*k, *e)).collect();
        let items = &items[..];
        let mut grown = levels;
        while items.last().is_some_and(|(vg, _)| !maps(grown, *vg)) {
            grown += 1;
        }
        let root = if grown == levels {
            self.apply(grown - 1, 0, root, items)?
        } else {
            self.apply_grown(grown - 1, levels, root, items)?
        };
        Ok((root, grown))
    }

    /// Copy-on-write the subtree at `level` covering from `first` (entry
    /// `at`) with `items` (sorted, all inside it); new nodes go into `b`.
    fn apply(
        &mut self,
        level: u8,
        first: u64,
        at: Option<Entry>,
        items: &[(u64, Option<Entry>)],
    ) -> Result<Option<Entry>> {
        let d = self.disk;
        let node = match at {
            Some(e) => (*d.ds.cache.node(&d.ds.store, &e, level, first)?).clone(),
            None => MapNode::empty(level, d.id, self.man.generation, first),
        };
        self.fill(node, level, first, items)
    }

    /// [`apply`](Self::apply) on a tree grown to `level + 1` levels from
    /// `root`'s `root_levels` (FORMAT.md §11.5): each new level a node
    /// whose entry 0 is the level below, the old root at the bottom.
    fn apply_grown(
        &mut self,
        level: u8,
        root_levels: u8,
        root: Option<Entry>,
        items: &[(u64, Option<Entry>)],
    ) -> Result<Option<Entry>> {
        if level + 1 == root_levels {
            if items.is_empty() {
                return Ok(root);
            }
            return self.apply(level, 0, root, items);
        }
        let below = items.partition_point(|(vg, _)| *vg < MapNode::span_of_entry(level));
        let mut node = MapNode::empty(level, self.disk.id, self.man.generation, 0);
        node.entries[0] = self.apply_grown(level - 1, root_levels, root, &items[..below])?;
        self.fill(node, level, 0, &items[below..])
    }

    /// Set `items` (sorted, inside `node`'s span) in `node`, copying on
    /// write the subtrees they fall in; the node goes into `b` (None: it
    /// maps nothing).
    fn fill(
        &mut self,
        mut node: MapNode,
        level: u8,
        first: u64,
        items: &[(u64, Option<Entry>)],
    ) -> Result<Option<Entry>> {
        node.disk = self.disk.id;
        node.gen = self.man.generation;
        let span = MapNode::span_of_entry(level);
        let mut i = 0;
        while i < items.len() {
            let idx = ((items[i].0 - first) / span) as usize;
            let mut j = i + 1;
            while j < items.len() && ((items[j].0 - first) / span) as usize == idx {
                j += 1;
            }
            node.entries[idx] = if level == 0 {
                items[i].1
            } else {
                let child_first = first + idx as u64 * span;
                self.apply(level - 1, child_first, node.entries[idx], &items[i..j])?
            };
            i = j;
        }
        if node.entries.iter().all(Option::is_none) {
            return Ok(None);
        }
        let e = self.b.add_node(&node);
        self.made.push((e, node));
        Ok(Some(e))
    }
}
