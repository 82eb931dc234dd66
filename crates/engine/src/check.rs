//! `strata check`: recompute every reference count and counter from the
//! trees and compare (DESIGN.md invariant 3).

use std::collections::{BTreeMap, HashMap, HashSet};

use strata_api::CheckReport;
use strata_format::packed::decode_packed;
use strata_format::{
    leaf_grain, leaf_key, leaf_packed, leaf_spills, BLOCK_GRAINS, GRAIN_BYTES, GRAIN_SHIFT,
    MAP_FANOUT, MAP_FANOUT_SHIFT, REFS_PER_PAGE,
};

use crate::error::Result;
use crate::meta::Meta;
use crate::store::Store;

/// Problems reported before the list is cut short.
const ERRORS_MAX: usize = 1000;

/// A problem the recount found, noted in its report (up to [`ERRORS_MAX`]).
trait Note {
    fn error(&mut self, e: String);
}

impl Note for CheckReport {
    fn error(&mut self, e: String) {
        if self.errors.len() < ERRORS_MAX {
            self.errors.push(e);
        }
    }
}

/// The recount's walk over every version's map: what it has found so far,
/// and the pool end every entry must lie below.
struct Walk {
    /// The pool end (high-water mark): an entry at or past it is damage.
    hwm: u64,
    expected: HashMap<u64, u32>,
    nodes: HashSet<u64>,
    data: HashSet<u64>,
    /// The key index each data grain is mapped with (FORMAT.md §16.4):
    /// every sharer maps a grain with the same.
    keys: HashMap<u64, u8>,
    /// (mapped grains, non-empty blocks, highest key index) per node,
    /// memoised.
    counts: HashMap<u64, Counted>,
    /// Packed stream grains and the virtual grains mapped to each, with
    /// whether the entry says its fragment spills (FORMAT.md §18.8).
    packed: BTreeMap<u64, Vec<(u64, bool)>>,
}

/// What a subtree holds: mapped grains, non-empty blocks, and the highest
/// key index of its leaf entries.
type Counted = (u64, u64, u8);

impl Walk {
    /// A walk over a pool that ends at `hwm`, nothing found yet.
    fn new(hwm: u64) -> Walk {
        Walk {
            hwm,
            expected: HashMap::new(),
            nodes: HashSet::new(),
            data: HashSet::new(),
            keys: HashMap::new(),
            counts: HashMap::new(),
            packed: BTreeMap::new(),
        }
    }

    /// What the walk found, into `r`: how many map nodes and data grains,
    /// and any grain used as both.
    fn tally(&self, r: &mut CheckReport) {
        r.map_nodes = self.nodes.len() as u64;
        r.data_grains = self.data.len() as u64;
        for n in &self.nodes {
            if self.data.contains(n) {
                r.error(format!("grain {n} is used both as data and as a map node"));
            }
        }
    }

    /// Count the references under map node `node` at `level` (0: a leaf);
    /// returns what it holds, memoised per node.
    fn visit(
        &mut self,
        m: &mut Meta,
        r: &mut CheckReport,
        (node, level, base): (u64, u8, u64),
    ) -> Result<Counted> {
        let hwm = self.hwm;
        if let Some(c) = self.counts.get(&node) {
            return Ok(*c);
        }
        self.nodes.insert(node);
        let entries: [u64; MAP_FANOUT] = match m.node(node, level) {
            Ok(e) => *e,
            Err(e) => {
                r.damaged_pages += 1;
                r.error(e.message);
                return Ok((0, 0, 0));
            }
        };
        let mut mapped = 0;
        let mut blocks = 0;
        let mut top_key = 0;
        for (i, e) in entries.iter().copied().enumerate() {
            if e == 0 {
                continue;
            }
            let e = if level == 0 {
                top_key = top_key.max(leaf_key(e));
                self.leaf_entry(r, e, base + i as u64)
            } else {
                e
            };
            if e >= hwm {
                r.error(format!(
                    "map node {node} entry {i} points at grain {e}, past the pool end {hwm}"
                ));
                continue;
            }
            *self.expected.entry(e).or_insert(0) += 1;
            if level == 0 {
                self.data.insert(e);
                mapped += 1;
            } else {
                if self.data.contains(&e) {
                    r.error(format!("grain {e} is used both as data and as a map node"));
                    continue;
                }
                let span = 1u64 << (MAP_FANOUT_SHIFT * u32::from(level));
                let child = (e, level - 1, base + i as u64 * span);
                let (cm, cb, ck) = self.visit(m, r, child)?;
                mapped += cm;
                blocks += cb;
                top_key = top_key.max(ck);
            }
        }
        if level == 0 {
            blocks = entries
                .chunks(BLOCK_GRAINS as usize)
                .filter(|c| c.iter().any(|&e| e != 0))
                .count() as u64;
        }
        self.counts.insert(node, (mapped, blocks, top_key));
        Ok((mapped, blocks, top_key))
    }

    /// Note leaf entry `e`, at virtual grain `v`: its key index, and for
    /// a packed one its stream grain (and a spill's reference to the
    /// next grain, FORMAT.md §18.8). Returns the grain it names.
    fn leaf_entry(&mut self, r: &mut CheckReport, e: u64, v: u64) -> u64 {
        let g = leaf_grain(e);
        self.one_key(r, g, leaf_key(e));
        if leaf_packed(e) {
            let spills = leaf_spills(e);
            self.packed.entry(g).or_default().push((v, spills));
            if spills {
                *self.expected.entry(g + 1).or_insert(0) += 1;
            }
        }
        g
    }

    /// Note that data grain `g` is mapped under key index `key`; a sharer
    /// that maps it under another is damage (one of them reads garbage).
    fn one_key(&mut self, r: &mut CheckReport, g: u64, key: u8) {
        let first = *self.keys.entry(g).or_insert(key);
        if first != key {
            r.error(format!(
                "grain {g} is mapped under key index {first} and under {key}"
            ));
        }
    }
}

/// A version whose highest key index is `top_key` against its limit (from
/// [`key_limits`]; None: an orphan, not checked).
fn within_key_limit(r: &mut CheckReport, limit: Option<&(u8, String)>, top_key: u8) {
    if let Some((_, who)) = limit.filter(|(own, _)| top_key > *own) {
        r.error(format!(
            "{who} maps a grain under key index {top_key}, which its keyring does not have"
        ));
    }
}

/// The highest key index each version's map may hold: the own keys of its
/// disk's keyring (FORMAT.md §16.4), 0 for a plain disk and for a keyring
/// without own keys. Orphans are not listed: they are on their way out.
fn key_limits(m: &Meta) -> HashMap<u64, (u8, String)> {
    let mut out = HashMap::new();
    for d in &m.catalog.disks {
        let own = d
            .keyring
            .and_then(|k| m.catalog.keyring(k))
            .map_or(0, |k| k.own.len() as u8);
        out.insert(d.head, (own, format!("disk '{}'", d.name)));
        for s in m.catalog.snapshots.iter().filter(|s| s.disk == d.id) {
            out.insert(
                s.version,
                (own, format!("snapshot '{}@{}'", d.name, s.name)),
            );
        }
    }
    out
}

/// Groups: members exist and are in one group each; a group snapshot
/// names one existing snapshot of each of its disks, of its own name.
fn check_groups(m: &Meta, r: &mut CheckReport) {
    let mut member_of: HashMap<u64, &str> = HashMap::new();
    for g in &m.catalog.groups {
        for d in &g.disks {
            if m.catalog.disk_by_id(*d).is_none() {
                r.error(format!("group '{}': disk id {d} does not exist", g.name));
            }
            if let Some(other) = member_of.insert(*d, &g.name) {
                r.error(format!(
                    "disk id {d} is in groups '{other}' and '{}'",
                    g.name
                ));
            }
        }
        for gs in &g.snapshots {
            for mr in &gs.members {
                match m.catalog.snapshots.iter().find(|s| s.id == mr.snapshot) {
                    Some(s) if s.disk == mr.disk && s.name == gs.name => {}
                    _ => r.error(format!(
                        "group snapshot '{}@{}': no snapshot '{}' with id {} on disk id {}",
                        g.name, gs.name, gs.name, mr.snapshot, mr.disk
                    )),
                }
            }
        }
    }
}

/// Recount `m`; packed stream grains are read from `store`'s pool.
pub(crate) fn run(m: &mut Meta, store: &Store) -> Result<CheckReport> {
    let mut r = CheckReport::default();
    let hwm = m.hwm();
    r.pool_grains = hwm;
    let mut w = Walk::new(hwm);
    let limits = key_limits(m);
    let (owners, orphans) = catalog_owners(m, &mut r);
    let ids = m.version_ids();
    r.versions = ids.len();
    for id in ids {
        if !owners.contains_key(&id) {
            r.error(format!(
                "version {id} belongs to no disk or snapshot (leaked)"
            ));
        }
        let st = m.version_state(id).expect("listed");
        let (mapped, nb, top_key) = if st.root == 0 {
            (0, 0, 0)
        } else if st.root >= hwm {
            r.error(format!(
                "version {id} root {} is past the pool end",
                st.root
            ));
            (0, 0, 0)
        } else {
            *w.expected.entry(st.root).or_insert(0) += 1;
            w.visit(m, &mut r, (st.root, st.levels - 1, 0))?
        };
        within_key_limit(&mut r, limits.get(&id), top_key);
        // An orphan's counters froze when it was dropped; its map shrinks.
        if orphans.contains(&id) {
            continue;
        }
        if r.damaged_pages > 0 {
            continue; // counters cannot be compared with part of a map unread
        }
        if mapped != st.mapped_grains {
            r.error(format!(
                "version {id} counts {} mapped grains, its map has {mapped}",
                st.mapped_grains
            ));
        }
        if nb != st.nb {
            r.error(format!(
                "version {id} counts nb={}, its map has {nb}",
                st.nb
            ));
        }
    }
    w.tally(&mut r);
    // With a damaged node the expected counts are incomplete: comparing
    // them would only report the damage again, as leaks.
    if r.damaged_pages > 0 {
        r.error(format!(
            "reference counts not compared: {} damaged map node(s) hide part of the maps",
            r.damaged_pages
        ));
        return Ok(r);
    }
    check_packed(store, &w, &mut r);
    compare_counts(m, hwm, &w.expected, &mut r);
    Ok(r)
}

/// Packed stream grains (FORMAT.md §18.8): each one's directory, and
/// every fragment a leaf names read whole (its CRC, a spill's rest in the
/// next grain, decompressed to its exact size), the entry's spill bit
/// against where the fragment ends.
fn check_packed(store: &Store, w: &Walk, r: &mut CheckReport) {
    for (&g, vs) in &w.packed {
        let mut b = vec![0u8; GRAIN_BYTES as usize];
        if let Err(e) = store.pool.read_at(&mut b, g << GRAIN_SHIFT) {
            r.error(format!("packed grain {g}: {e}"));
            continue;
        }
        let p = match decode_packed(&b) {
            Ok(p) => p,
            Err(e) => {
                r.error(format!("packed grain {g}: {e}"));
                continue;
            }
        };
        let mut read = HashSet::new();
        for &(v, spills) in vs {
            let Some(f) = p.find(v) else {
                r.error(format!(
                    "packed grain {g}: virtual grain {v} is mapped to it, its directory does not hold it"
                ));
                continue;
            };
            if (p.spilled(f) > 0) != spills {
                r.error(format!(
                    "packed grain {g}: the entry of virtual grain {v} says spills {spills}, its fragment the other"
                ));
            }
            if read.insert(f.v) {
                if let Err(e) = store.unpack_in(g, (&b, &p), v) {
                    r.error(e.message);
                }
            }
        }
    }
}

/// The catalog's owners of each version (disks' heads, snapshots,
/// orphans), checked: every version has exactly one owner, every owner a
/// version, every snapshot a disk; and the orphans.
fn catalog_owners(m: &Meta, r: &mut CheckReport) -> (HashMap<u64, u32>, HashSet<u64>) {
    let mut owners: HashMap<u64, u32> = HashMap::new();
    for d in &m.catalog.disks {
        *owners.entry(d.head).or_insert(0) += 1;
    }
    for s in &m.catalog.snapshots {
        *owners.entry(s.version).or_insert(0) += 1;
        if m.catalog.disk_by_id(s.disk).is_none() {
            r.error(format!(
                "snapshot '{}' belongs to a disk that does not exist",
                s.name
            ));
        }
    }
    for o in &m.catalog.orphans {
        *owners.entry(*o).or_insert(0) += 1;
    }
    check_groups(m, r);
    let orphans: HashSet<u64> = m.catalog.orphans.iter().copied().collect();
    for (v, n) in &owners {
        if *n != 1 {
            r.error(format!("version {v} is owned {n} times"));
        }
        if m.version_state(*v).is_none() {
            r.error(format!(
                "version {v} is named in the catalog but does not exist"
            ));
        }
    }
    (owners, orphans)
}

/// Every reference count in the pool against `expected` (what the maps
/// reach), then the used and free accounting; a damaged count page is
/// reported once and its grains skipped. Sets `used_bytes`.
fn compare_counts(m: &mut Meta, hwm: u64, expected: &HashMap<u64, u32>, r: &mut CheckReport) {
    let mut nonzero = 0u64;
    let mut bad_page = None;
    for g in 0..hwm {
        let page = g / REFS_PER_PAGE as u64;
        if bad_page == Some(page) {
            continue;
        }
        let actual = match m.ref_get(g) {
            Ok(c) => c,
            Err(e) => {
                bad_page = Some(page);
                r.damaged_pages += 1;
                r.error(e.message);
                continue;
            }
        };
        let expected = expected.get(&g).copied().unwrap_or(0);
        if g == 0 && actual != 0 {
            r.error("grain 0 has a reference count".into());
        }
        if actual != 0 {
            nonzero += 1;
        }
        if actual > expected {
            r.leaked_grains += 1;
            r.error(format!(
                "grain {g}: count {actual} but {expected} references (leaked)"
            ));
        } else if actual < expected {
            r.overshared_grains += 1;
            r.error(format!(
                "grain {g}: count {actual} but {expected} references (owned more than counted)"
            ));
        }
    }
    if bad_page.is_none() && nonzero != m.used_grains() {
        r.error(format!(
            "accounting: {} grains counted as used, {nonzero} have a count",
            m.used_grains()
        ));
    }
    let free = m.free_grains();
    let pending = m.pending_len() as u64;
    let total = hwm.saturating_sub(1);
    if bad_page.is_none() && free + pending + nonzero != total {
        r.error(format!(
            "free space: {free} free + {pending} pending + {nonzero} used != {total} grains in the pool"
        ));
    }
    r.used_bytes = nonzero * GRAIN_BYTES;
}
