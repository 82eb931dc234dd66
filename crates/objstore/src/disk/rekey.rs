//! Deep rekey of an object-store disk (FORMAT.md §16.7): region by region,
//! every grain the head or a snapshot maps there is re-encrypted into a
//! new segment, the maps are copied on write, and one owner commit names
//! them with the cursor moved past the region.

use std::collections::HashMap;
use std::ops::Range;

use strata_crypt::{DataCipher, Xts};

use super::fold::Folder;
use super::*;
use crate::keys::keyring_of;

/// Virtual grains per step (4 MiB): a multiple of a leaf's 256.
pub const REKEY_REGION: u64 = 1024;

/// The grain after the last one a deep rekey must pass: the largest size
/// of the head and its snapshots.
pub fn rekey_end(man: &Manifest) -> u64 {
    let bytes = man
        .snapshots
        .iter()
        .map(|s| s.size_bytes)
        .fold(man.size_bytes, u64::max);
    bytes.div_ceil(G)
}

/// Clears a step's region when the step ends, however it ends, and wakes
/// the writes that waited for it.
struct RegionOpen<'a>(&'a ObjectDisk);

impl Drop for RegionOpen<'_> {
    fn drop(&mut self) {
        self.0.state.lock().unwrap().rekey_region = None;
        self.0.landed.notify_all();
    }
}

impl ObjectDisk {
    /// The pass of a deep rekey under way (its begin record committed):
    /// from the newest manifest's cursor to the end, one step per region,
    /// `progress(done, total)` in bytes before each, `pace(bytes)` after
    /// each (an error from it, a cancel, stops the pass where it is, and
    /// so does `strata lock`: each step needs the keys held). The bytes
    /// re-encrypted.
    pub fn rekey_pass(
        &self,
        to: &Arc<Xts>,
        progress: &mut dyn FnMut(u64, u64),
        pace: &mut dyn FnMut(u64) -> Result<()>,
    ) -> Result<u64> {
        self.may_write()?;
        let mut total = 0;
        loop {
            self.check_unlocked()?;
            let (at, end) = {
                let st = self.state.lock().unwrap();
                let d = self.rekey_cursor(&st.man)?;
                (d, rekey_end(&st.man))
            };
            progress(at.min(end) * G, end * G);
            if at >= end {
                return Ok(total);
            }
            let region_end = ((at / REKEY_REGION + 1) * REKEY_REGION).min(end);
            let n = self.rekey_step(at..region_end, to)?;
            total += n;
            pace(n)?;
        }
    }

    /// The end record (§16.7 step 3): the old data key (and an own-key
    /// clone's own keys) leave the record, once the cursor is past every
    /// version, checked in the commit itself (an extend and a write past
    /// the old end would otherwise lose the key they were sealed under).
    /// The index of the data key the disk is under now.
    pub fn finish_rekey(&self) -> Result<u32> {
        let disk = self.disk_name();
        let keys = self
            .ds
            .held_keys(self.id)
            .ok_or_else(|| strata_crypt::locked_error(disk))?;
        let mut index = 0;
        self.admin(|man| {
            let mut rec = keyring_of(disk, man)?;
            let (at, end) = (self.rekey_cursor(man)?, rekey_end(man));
            if at < end {
                return Err(Error::new(
                    ErrorKind::Unavailable,
                    format!(
                        "disk '{disk}' grew past its deep rekey's end ({} of {} bytes); run \
                         'strata rekey --deep {disk}' again",
                        at * G,
                        end * G
                    ),
                ));
            }
            rec.finish_deep(&keys)
                .map_err(|e| strata_crypt::disk_error(disk, e))?;
            index = rec.base_index();
            Ok(Manifest {
                keyring: Some(rec),
                ..man.clone()
            })
        })?;
        Ok(index)
    }

    /// The cursor of `man`'s deep rekey; Gone when none is under way.
    fn rekey_cursor(&self, man: &Manifest) -> Result<u64> {
        let k = keyring_of(self.disk_name(), man)?;
        k.deep_rekey.map(|d| d.next_grain).ok_or_else(|| {
            Error::new(
                ErrorKind::Gone,
                format!("disk '{}': no deep rekey is under way", self.name),
            )
        })
    }

    /// One step (§16.7, steps (i) to (v)) over `region`: its writes wait,
    /// the acknowledged ones are committed, then one owner commit names
    /// the region's grains re-encrypted and the cursor past it. The bytes
    /// re-encrypted.
    fn rekey_step(&self, region: Range<u64>, to: &Arc<Xts>) -> Result<u64> {
        // Compaction and the pass take turns.
        let _one = self.compactor.pass.lock().unwrap();
        self.state.lock().unwrap().rekey_region = Some(region.clone());
        let _open = RegionOpen(self);
        let mut bytes = 0;
        self.admin(|man| {
            let (next, n) = self.rekeyed(man, &region, to)?;
            bytes = n;
            Ok(next)
        })?;
        Ok(bytes)
    }

    /// `man` (its tail folded) with `region`'s grains re-encrypted from
    /// the keys `man`'s record gives them (the old data key at and past
    /// its cursor, or an own key) to `to` in new segments, uploaded here,
    /// the head's and every snapshot's map pointing at them, and the
    /// cursor at the region's end; the bytes re-encrypted.
    fn rekeyed(
        &self,
        man: &Manifest,
        region: &Range<u64>,
        to: &Arc<Xts>,
    ) -> Result<(Manifest, u64)> {
        let mut rec = keyring_of(self.disk_name(), man)?;
        let Some(mut d) = rec.deep_rekey.filter(|d| d.next_grain == region.start) else {
            return Err(Error::new(
                ErrorKind::Refused,
                format!(
                    "disk '{}': its deep rekey's cursor moved meanwhile; run it again",
                    self.name
                ),
            ));
        };
        assert!(
            man.tail.is_empty(),
            "an owner change starts from a folded tail"
        );
        let versions: Vec<(Option<Entry>, u8)> = std::iter::once((man.root, man.levels))
            .chain(man.snapshots.iter().map(|s| (s.root, s.levels)))
            .collect();
        let mapped = versions
            .iter()
            .map(|(root, levels)| self.mapped_in(*root, *levels, region))
            .collect::<Result<Vec<_>>>()?;
        let (segments, renamed) = self.reencrypted(man, &mapped, to)?;
        let mut next = man.clone();
        let nodes = self.refolded(man, &mut next, (&versions, &mapped), &renamed)?;
        // Rule 3: what the manifest names is in the store first.
        self.upload_rekeyed(&segments, nodes)?;
        self.copy_root_node(&mut next);
        d.next_grain = region.end;
        rec.deep_rekey = Some(d);
        next.keyring = Some(rec);
        Ok((next, renamed.len() as u64 * G))
    }

    /// `next` (a copy of `man`) with each version's map copied on write
    /// so that its grains in `mapped` point at their `renamed` entries:
    /// the head's root in `next.root`, the snapshots' in theirs. The node
    /// segment, and the nodes made in it.
    #[allow(clippy::type_complexity)]
    fn refolded(
        &self,
        man: &Manifest,
        next: &mut Manifest,
        (versions, mapped): (&[(Option<Entry>, u8)], &[Vec<(u64, Entry)>]),
        renamed: &HashMap<(u64, Entry), Entry>,
    ) -> Result<(SegmentBuilder, Vec<(Entry, MapNode)>)> {
        let mut nodes = SegmentBuilder::new(self.next_segment(man));
        let mut made = Vec::new();
        for (i, found) in mapped.iter().enumerate() {
            if found.is_empty() {
                continue;
            }
            let tail: Tail = found
                .iter()
                .map(|&(vg, old)| (vg, Some(renamed[&(vg, old)])))
                .collect();
            let (root, levels) = versions[i];
            let folded =
                Folder::new(self, man, &mut nodes, &mut made).fold_tail(root, levels, &tail)?;
            match i {
                0 => (next.root, next.levels) = folded,
                _ => {
                    let s = &mut next.snapshots[i - 1];
                    (s.root, s.levels) = folded;
                }
            }
        }
        Ok((nodes, made))
    }

    /// Seal and upload a step's grain segments and its node segment (if
    /// it made nodes), and keep the nodes in the cache.
    fn upload_rekeyed(
        &self,
        segments: &[SegmentBuilder],
        (nodes, made): (SegmentBuilder, Vec<(Entry, MapNode)>),
    ) -> Result<()> {
        let mut sealed: Vec<(SegId, Bytes)> = segments
            .iter()
            .map(|b| (b.id, Bytes::from(b.seal(now_ms()))))
            .collect();
        if !made.is_empty() {
            sealed.push((nodes.id, Bytes::from(nodes.seal(now_ms()))));
        }
        self.upload(&sealed)?;
        for (e, n) in made {
            self.ds.cache.insert_node(&e, n);
        }
        Ok(())
    }

    /// The grains `mapped` names (each version's, in order), read,
    /// decrypted under the key `man`'s record gives each and re-encrypted
    /// under `to` (key index 0) into new segments of `man`'s generation:
    /// one new grain for each old one, however many versions share it.
    /// The segments, and each old grain's new entry.
    #[allow(clippy::type_complexity)]
    fn reencrypted(
        &self,
        man: &Manifest,
        mapped: &[Vec<(u64, Entry)>],
        to: &Arc<Xts>,
    ) -> Result<(Vec<SegmentBuilder>, HashMap<(u64, Entry), Entry>)> {
        let old = self.cipher_of(man)?;
        let cipher = DataCipher::single(to.clone());
        let mut renamed = HashMap::new();
        let mut segments: Vec<SegmentBuilder> = Vec::new();
        let mut fetched = None;
        let mut buf = vec![0u8; GRAIN];
        for &(vg, e) in mapped.iter().flatten() {
            if renamed.contains_key(&(vg, e)) {
                continue;
            }
            if segments
                .last()
                .is_none_or(|b| b.grain_count() >= SEGMENT_GRAINS)
            {
                segments.push(SegmentBuilder::new(self.next_segment(man)));
            }
            let read = self.stored_grain(&e, &mut fetched, &mut buf);
            if let Err(err) =
                read.and_then(|_| self.decrypt_grain(old.as_deref(), &e, vg, &mut buf))
            {
                buf.fill(0);
                return Err(err);
            }
            let b = segments.last_mut().expect("just pushed");
            renamed.insert((vg, e), b.add_data(vg, &buf, Some(&cipher)));
        }
        // The last grain's plaintext.
        buf.fill(0);
        Ok((segments, renamed))
    }

    /// A new segment of `man`'s generation.
    fn next_segment(&self, man: &Manifest) -> SegId {
        let mut st = self.state.lock().unwrap();
        let ctr = st.next_ctr;
        st.next_ctr += 1;
        SegId {
            disk: self.id,
            gen: man.generation,
            ctr,
        }
    }

    /// The grains the map at `root` (`levels` levels) holds in `region`
    /// (whole leaves): (virtual grain, entry), in order.
    fn mapped_in(
        &self,
        root: Option<Entry>,
        levels: u8,
        region: &Range<u64>,
    ) -> Result<Vec<(u64, Entry)>> {
        let leaf = MapNode::span_of_entry(1);
        let mut out = Vec::new();
        let mut first = region.start / leaf * leaf;
        while first < region.end {
            if let Some(node) = self.leaf_noting(root, levels, first, &mut Vec::new())? {
                for (i, e) in node.entries.iter().enumerate() {
                    let vg = first + i as u64;
                    if let Some(e) = e.filter(|_| region.contains(&vg)) {
                        out.push((vg, e));
                    }
                }
            }
            first += leaf;
        }
        Ok(out)
    }
}
