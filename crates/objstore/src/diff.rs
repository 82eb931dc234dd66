//! Where two versions' maps differ (docs/BACKUP.md): a walk of both trees
//! together that skips every entry the two share. Versions share subtrees
//! by entry (a snapshot's root is the head's root when it is taken; a
//! commit copies on write only the nodes on the paths it changes), so an
//! equal entry is an equal subtree and the walk's cost follows what
//! changed, not the disk's size.

use std::sync::Arc;

use crate::layout::{Entry, MapNode, FANOUT};
use crate::Result;

/// Reads the map node an entry points at, given the node's level and the
/// first grain it covers.
pub type NodeReader<'a> = dyn FnMut(&Entry, u8, u64) -> Result<Arc<MapNode>> + 'a;

/// One side of the walk: an entry and the height its subtree has (0: a
/// grain; a root's height is its map's `levels`). An entry can sit higher
/// than its own height: a map that grew a level when the disk was extended
/// keeps its old root as entry 0 of the new top (FORMAT.md §11.5), so a
/// shorter map is compared as if it had grown the same way.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
struct Side {
    entry: Option<Entry>,
    height: u8,
}

impl Side {
    /// The `FANOUT` entries one level below this side seen at height `h`.
    fn children(&self, h: u8, first: u64, node: &mut NodeReader<'_>) -> Result<Vec<Side>> {
        let none = Side {
            entry: None,
            height: h - 1,
        };
        let mut out = vec![none; FANOUT];
        match self.entry {
            None => {}
            // Grown above its own height: its subtree is entry 0 below.
            Some(_) if self.height < h => out[0] = *self,
            Some(e) => {
                let n = node(&e, h - 1, first)?;
                for (o, c) in out.iter_mut().zip(n.entries.iter()) {
                    o.entry = *c;
                }
            }
        }
        Ok(out)
    }
}

/// Call `visit(grain, present)` for every grain below `end` whose entry
/// differs between map `a` and map `b` (each a root and its levels; `a`
/// None: an empty map), ascending; `present`: `b` maps the grain. `node`
/// reads the map node an entry points at (its level and first grain).
pub fn diff_maps(
    a: (Option<Entry>, u8),
    b: (Option<Entry>, u8),
    end: u64,
    node: &mut NodeReader<'_>,
    visit: &mut dyn FnMut(u64, bool),
) -> Result<()> {
    let top = a.1.max(b.1);
    let side = |(entry, height): (Option<Entry>, u8)| Side { entry, height };
    Differ { end, node, visit }.walk(top, side(a), side(b), 0)
}

/// One comparison of two maps: the grain it stops at, how nodes are read
/// and who is told of each difference.
struct Differ<'n, 'r, 'v> {
    end: u64,
    node: &'n mut NodeReader<'r>,
    visit: &'v mut dyn FnMut(u64, bool),
}

impl Differ<'_, '_, '_> {
    /// Compare subtrees `a` and `b` of height `h` whose first grain is
    /// `first`.
    fn walk(&mut self, h: u8, a: Side, b: Side, first: u64) -> Result<()> {
        if first >= self.end || (a.entry == b.entry && (a.entry.is_none() || a.height == b.height))
        {
            return Ok(());
        }
        if h == 0 {
            (self.visit)(first, b.entry.is_some());
            return Ok(());
        }
        let span = MapNode::span_of_entry(h - 1);
        let ca = a.children(h, first, self.node)?;
        let cb = b.children(h, first, self.node)?;
        for (i, (x, y)) in ca.into_iter().zip(cb).enumerate() {
            self.walk(h - 1, x, y, first + i as u64 * span)?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use std::collections::{BTreeMap, HashMap};

    use super::*;
    use crate::layout::SegId;

    /// Maps built in memory, nodes shared between versions by entry as
    /// commits share them: `set` copies on write the path to a grain.
    #[derive(Default)]
    struct Maps {
        nodes: HashMap<(u32, u32), Arc<MapNode>>,
        next: u32,
    }

    impl Maps {
        fn entry(&mut self) -> Entry {
            self.next += 1;
            Entry {
                seg: SegId {
                    disk: 1,
                    gen: 1,
                    ctr: self.next,
                },
                slot: 0,
                crc: self.next,
                key: 0,
                stored: 0,
            }
        }

        /// Map `root` (height `h`) with grain `g` set (Some: a new grain)
        /// or cleared: the new root.
        fn set(&mut self, root: Option<Entry>, h: u8, g: u64, on: bool) -> Option<Entry> {
            if h == 0 {
                return on.then(|| self.entry());
            }
            let span = MapNode::span_of_entry(h - 1);
            let mut entries = match root {
                Some(e) => self.nodes[&(e.seg.ctr, e.slot)].entries.clone(),
                None => vec![None; FANOUT],
            };
            let i = (g / span) as usize;
            entries[i] = self.set(entries[i], h - 1, g % span, on);
            let e = self.entry();
            self.nodes.insert(
                (e.seg.ctr, e.slot),
                Arc::new(MapNode {
                    level: h - 1,
                    disk: 1,
                    gen: 1,
                    first: 0,
                    entries,
                }),
            );
            Some(e)
        }

        /// Grow a map of height `h` by one level (its root as entry 0).
        fn grow(&mut self, root: Option<Entry>, h: u8) -> Option<Entry> {
            let root = root?;
            let mut entries = vec![None; FANOUT];
            entries[0] = Some(root);
            let e = self.entry();
            self.nodes.insert(
                (e.seg.ctr, e.slot),
                Arc::new(MapNode {
                    level: h,
                    disk: 1,
                    gen: 1,
                    first: 0,
                    entries,
                }),
            );
            Some(e)
        }

        fn diff(
            &self,
            a: (Option<Entry>, u8),
            b: (Option<Entry>, u8),
            end: u64,
        ) -> (Vec<(u64, bool)>, usize) {
            let mut out = Vec::new();
            let mut reads = 0;
            diff_maps(
                a,
                b,
                end,
                &mut |e, _, _| {
                    reads += 1;
                    Ok(self.nodes[&(e.seg.ctr, e.slot)].clone())
                },
                &mut |g, p| out.push((g, p)),
            )
            .unwrap();
            (out, reads)
        }
    }

    #[test]
    fn only_what_differs_is_reported_and_shared_subtrees_are_not_read() {
        let mut m = Maps::default();
        let mut root = None;
        // 3 levels: 16M grains; data spread wide.
        for g in (0..1_000_000u64).step_by(4099) {
            root = m.set(root, 3, g, true);
        }
        let base = root;
        let mut want = BTreeMap::new();
        for (g, on) in [(5, true), (4099, false), (700_000, true), (999_999, true)] {
            root = m.set(root, 3, g, on);
            want.insert(g, on);
        }
        let (got, reads) = m.diff((base, 3), (root, 3), 1 << 24);
        assert_eq!(got, want.into_iter().collect::<Vec<_>>());
        // 4 changed paths of 3 nodes each, on both sides, at most.
        assert!(reads <= 4 * 3 * 2, "{reads} node reads");
        // Against nothing: every mapped grain.
        let (all, _) = m.diff((None, 0), (base, 3), 1 << 24);
        assert_eq!(all.len(), (0..1_000_000u64).step_by(4099).count());
        assert!(all.iter().all(|&(_, p)| p));
        // The same version: nothing, and nothing read.
        assert_eq!(m.diff((root, 3), (root, 3), 1 << 24), (vec![], 0));
        // `end` cuts.
        let (cut, _) = m.diff((base, 3), (root, 3), 700_000);
        assert_eq!(cut, [(5, true), (4099, false)]);
    }

    #[test]
    fn a_map_that_grew_a_level_compares_with_the_shorter_one() {
        let mut m = Maps::default();
        let mut root = None;
        for g in [1u64, 300, 65_000] {
            root = m.set(root, 2, g, true);
        }
        let base = root;
        // Extended: grows to 3 levels, then writes past the old end and
        // over one old grain.
        let mut grown = m.grow(root, 2);
        grown = m.set(grown, 3, 70_000, true);
        grown = m.set(grown, 3, 300, false);
        let (got, _) = m.diff((base, 2), (grown, 3), 1 << 24);
        assert_eq!(got, [(300, false), (70_000, true)]);
        // And the other way round (a newer base: what the older lacks).
        let (back, _) = m.diff((grown, 3), (base, 2), 1 << 24);
        assert_eq!(back, [(300, true), (70_000, false)]);
    }
}
