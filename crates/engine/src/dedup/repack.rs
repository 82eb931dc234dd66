//! Repacking half-dead stream grains (docs/FORMAT.md §18.10): of the
//! stream grains a region's packed entries name, those whose live bytes
//! are under half of the bytes in them give up their live fragments,
//! moved as they lie (stored bytes, neither decompressed nor
//! recompressed) into the region's new streams, so the old grains' counts
//! reach zero when the pack pass installs them.

use std::collections::{BTreeMap, HashSet};

use strata_format::packed::{decode_packed, Fragment, Packed};
use strata_format::{GRAIN_BYTES, GRAIN_SHIFT};

use super::pack::{Frag, Source};
use crate::datastore::Datastore;
use crate::error::{Error, ErrorKind, Result};

const GRAIN: usize = GRAIN_BYTES as usize;

/// Stream grains read for one region: each one's bytes and directory.
type Grains = BTreeMap<u64, (Vec<u8>, Packed)>;

/// A stream grain's damage, met by the pass.
fn damaged(g: u64, why: impl std::fmt::Display) -> Error {
    Error::new(
        ErrorKind::Corrupt,
        format!("compress: stream grain {g}: {why}"),
    )
}

/// What the entries say of a stream grain's bytes: which of the
/// fragments starting in it some packed entry names, and whether the one
/// carried into it from the grain before is named.
struct Liveness {
    own: Vec<bool>,
    carry: bool,
}

impl Datastore {
    /// The live fragments of the half-dead grains among `streams` (the
    /// stream grains a region's packed entries name), ready to lay out
    /// again, and the bytes read to find them. A fragment is live while a
    /// packed entry names its grain at one of its virtual grains; the
    /// bytes in a grain are its carry and its own fragments' parts in it.
    /// Only live grains are read: the grain before one whose carry is
    /// dead, or after one whose spilling fragment is, may be free. With
    /// `zone`, every grain at or above it is taken too, whatever its live
    /// bytes (free-space consolidation, FORMAT.md §10.4).
    pub(super) fn half_dead(&self, streams: &[u64], zone: Option<u64>) -> Result<(Vec<Frag>, u64)> {
        if streams.is_empty() {
            return Ok((Vec::new(), 0));
        }
        let mut grains = Grains::new();
        for &g in streams {
            self.read_stream_grain(g, &mut grains)?;
        }
        let live = self.liveness(streams, &grains)?;
        let picked = pick(streams, &grains, &live, zone);
        let mut moved = Vec::new();
        let mut taken = HashSet::new();
        for (g, l) in picked {
            if l.carry {
                self.read_stream_grain(g - 1, &mut grains)?;
                let (s, f) = carried_into(&grains, g)?;
                if taken.insert((s, f.v)) {
                    moved.push(moved_fragment(&grains, s, &f)?);
                }
            }
            let own: Vec<Fragment> = grains[&g].1.fragments.to_vec();
            for (f, &named) in own.iter().zip(&l.own) {
                if !named || !taken.insert((g, f.v)) {
                    continue;
                }
                if grains[&g].1.spilled(f) > 0 {
                    self.read_stream_grain(g + 1, &mut grains)?;
                }
                moved.push(moved_fragment(&grains, g, f)?);
            }
        }
        Ok((moved, grains.len() as u64 * GRAIN_BYTES))
    }

    /// Stream grain `g` read and its directory decoded into `grains`
    /// (once).
    fn read_stream_grain(&self, g: u64, grains: &mut Grains) -> Result<()> {
        if grains.contains_key(&g) {
            return Ok(());
        }
        let mut b = vec![0u8; GRAIN];
        self.inner.pool.read_at(&mut b, g << GRAIN_SHIFT)?;
        let p = decode_packed(&b).map_err(|e| damaged(g, e))?;
        grains.insert(g, (b, p));
        Ok(())
    }

    /// Under the metadata lock, what the entries say of each of
    /// `streams`: a fragment is live when some packed entry names the
    /// grain at one of its virtual grains; the carry is live when the
    /// grain's count is more than its own fragments' entries (the rest
    /// are the spill references of the fragment carried in, §18.8).
    fn liveness(&self, streams: &[u64], grains: &Grains) -> Result<Vec<Liveness>> {
        let mut m = self.inner.meta.lock();
        let mut out = Vec::with_capacity(streams.len());
        let memo = &mut crate::meta::SpanLeaves::default();
        for &g in streams {
            let p = &grains[&g].1;
            let mut own = Vec::with_capacity(p.fragments.len());
            let mut named = 0u64;
            for f in &p.fragments {
                let mut n = 0;
                for v in f.v..f.v + u64::from(f.span) {
                    n += u64::from(m.packed_naming(memo, v, g)?);
                }
                own.push(n > 0);
                named += n;
            }
            let carry = p.carry_in > 0 && u64::from(m.ref_get(g)?) > named;
            out.push(Liveness { own, carry });
        }
        Ok(out)
    }
}

/// The half-dead grains of `streams` (their liveness `live`), each with
/// its liveness: those whose live bytes are under half of the bytes in
/// them, counting as dead what moves out with a grain already picked (the
/// live carry of a grain whose predecessor moves, the spilling last
/// fragment of one whose successor does), until no other grain is; so a
/// pass leaves no grain half-dead behind it. Those at or above `zone`
/// are picked from the start.
fn pick<'a>(
    streams: &[u64],
    grains: &Grains,
    live: &'a [Liveness],
    zone: Option<u64>,
) -> Vec<(u64, &'a Liveness)> {
    let mut picked: HashSet<u64> = streams
        .iter()
        .copied()
        .filter(|&g| zone.is_some_and(|z| g >= z))
        .collect();
    loop {
        let before = picked.len();
        for (&g, l) in streams.iter().zip(live) {
            if picked.contains(&g) {
                continue;
            }
            let p = &grains[&g].1;
            let mut bytes = p.carry_in as usize;
            let mut alive = if l.carry && !picked.contains(&(g - 1)) {
                bytes
            } else {
                0
            };
            let last = p.fragments.len().saturating_sub(1);
            for (i, (f, &named)) in p.fragments.iter().zip(&l.own).enumerate() {
                let here = f.stored_len().min(GRAIN - f.offset as usize);
                bytes += here;
                let leaves = i == last && p.spills && picked.contains(&(g + 1));
                alive += if named && !leaves { here } else { 0 };
            }
            if alive * 2 < bytes {
                picked.insert(g);
            }
        }
        if picked.len() == before {
            break;
        }
    }
    streams
        .iter()
        .zip(live)
        .filter(|(g, _)| picked.contains(g))
        .map(|(&g, l)| (g, l))
        .collect()
}

/// The fragment carried into stream grain `g` (the last of `g − 1`, which
/// must say it spills), with the grain where it starts.
fn carried_into(grains: &Grains, g: u64) -> Result<(u64, Fragment)> {
    let before = &grains[&(g - 1)].1;
    match before.fragments.last() {
        Some(f) if before.spills => Ok((g - 1, *f)),
        _ => Err(damaged(
            g,
            "it carries bytes the grain before does not spill",
        )),
    }
}

/// Fragment `f`, starting in stream grain `s`, as a piece of a new
/// stream: its stored bytes (CRC checked), taken from `s` and, where it
/// spills, the grain after.
fn moved_fragment(grains: &Grains, s: u64, f: &Fragment) -> Result<Frag> {
    let (b, p) = &grains[&s];
    let next = grains.get(&(s + 1)).map(|n| n.0.as_slice());
    let stored = p.stored(f, b, next).map_err(|e| damaged(s, e))?;
    Ok(Frag {
        v: f.v,
        span: f.span,
        codec: f.codec,
        len: f.len as usize,
        bytes: stored.into_owned(),
        from: Source::Stream(s),
    })
}

/// Put each moved fragment in the first layer where none of its virtual
/// grains is yet (a stream holds a virtual grain once), a new layer when
/// none has room; each layer in virtual-grain order again.
pub(super) fn add_moved(layers: &mut Vec<Vec<Frag>>, moved: Vec<Frag>) {
    if moved.is_empty() {
        return;
    }
    let span = |f: &Frag| f.v..f.v + u64::from(f.span);
    let mut used: Vec<HashSet<u64>> = layers
        .iter()
        .map(|l| l.iter().flat_map(span).collect())
        .collect();
    for f in moved {
        let k = match used.iter().position(|u| !span(&f).any(|v| u.contains(&v))) {
            Some(k) => k,
            None => {
                layers.push(Vec::new());
                used.push(HashSet::new());
                layers.len() - 1
            }
        };
        used[k].extend(span(&f));
        layers[k].push(f);
    }
    for l in layers.iter_mut() {
        l.sort_by_key(|f| f.v);
    }
}
