//! Manifests (FORMAT.md §11.5): a disk's whole state at one point, its
//! snapshots and owner, the tail of grains written since the last fold,
//! encoded as format 2 (payload, tail, body, footer) and checked at both
//! ends.

use super::*;

/// A snapshot, as a manifest carries it (§11.5).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct SnapshotRec {
    pub id: u64,
    pub name: String,
    #[serde(default)]
    pub description: String,
    pub created_ms: u64,
    pub size_bytes: u64,
    pub levels: u8,
    pub root: Option<Entry>,
    /// The snapshot the disk descended from when this one was taken (the
    /// tree, §11.3); none for a root.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub parent: Option<u64>,
    /// The group snapshot this snapshot is a member of (§11.11); it counts
    /// only once that group snapshot's object exists.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub group: Option<GroupRef>,
}

/// A member snapshot's group snapshot: group id and group snapshot id.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct GroupRef {
    pub group: u32,
    pub snapshot: u64,
}

/// Where a linked clone came from.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ParentRef {
    pub disk: u32,
    pub snapshot: u64,
    /// `DISK@SNAP` when the clone was made.
    pub name: String,
}

/// A disk's whole state at one point (§11.5).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Manifest {
    pub disk: u32,
    pub seq: u64,
    pub generation: u32,
    pub owner: Option<Owner>,
    pub written_ms: u64,
    /// Random per write: two writers never produce the same bytes, so a
    /// create that finds its own bytes knows it was its own retry.
    pub nonce: u64,
    pub size_bytes: u64,
    pub levels: u8,
    pub root: Option<Entry>,
    pub next_ctr: u32,
    #[serde(default)]
    pub snapshots: Vec<SnapshotRec>,
    #[serde(default)]
    pub parent: Option<ParentRef>,
    #[serde(default)]
    pub removed: bool,
    /// The snapshot the disk's live state descends from (the last one
    /// taken or reverted to), if any.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub current: Option<u64>,
    /// I/O limits (`strata limit`), absent when there are none.
    #[serde(default, skip_serializing_if = "IoLimits::is_none")]
    pub limits: IoLimits,
    /// A copy of the node `root` points at, base64 (§11.5): a host that
    /// opens the disk walks one level less on its first reads. A hint,
    /// used only if it matches `root`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub root_node: Option<String>,
    /// The manifest this one extends (§11.4b); absent on a disk's first
    /// manifest and on manifests of builds before it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub prev: Option<PrevRef>,
    /// Written while `prev` was still in flight (§11.4b): valid only if
    /// the object at `prev.seq` carries `prev.nonce`.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub pipelined: bool,
    /// The disk's keyring (§16.7), wrapped as on a local datastore;
    /// absent for a plain disk. Its `id` is 0: no catalog numbers it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub keyring: Option<strata_crypt::KeyringRec>,
    /// Where the grains written since the map was last folded live
    /// (§11.4a; None: a hole); they win over the map. Stored in binary
    /// beside the body, not in it.
    #[serde(skip)]
    pub tail: Arc<Tail>,
}

/// The manifest a manifest extends (§11.4b).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct PrevRef {
    pub seq: u64,
    pub nonce: u64,
}

impl PrevRef {
    pub fn of(m: &Manifest) -> PrevRef {
        PrevRef {
            seq: m.seq,
            nonce: m.nonce,
        }
    }
}

/// A manifest's tail (§11.4a): virtual grain → entry (None: a hole).
pub type Tail = BTreeMap<u64, Option<Entry>>;

/// The footer of a format-2 manifest (§11.5).
struct Footer {
    payload: u64,
    tail: u32,
    body: u32,
    /// CRC-32C of tail and body.
    crc: u32,
    /// `STRMAN03` or `STRMAN05`: a pipelined manifest (§11.4b).
    pipelined: bool,
    /// `STRMAN04` or `STRMAN05`: an encrypted disk's (§16.7).
    encrypted: bool,
}

/// The footer magic of a manifest that is (or is not) pipelined and
/// encrypted.
fn footer_magic(pipelined: bool, encrypted: bool) -> &'static [u8; 8] {
    match (pipelined, encrypted) {
        (false, false) => MAGIC_MANIFEST_2,
        (true, false) => MAGIC_MANIFEST_3,
        (false, true) => MAGIC_MANIFEST_4,
        (true, true) => MAGIC_MANIFEST_5,
    }
}

impl Footer {
    /// The footer in the last 32 bytes of `end`: None if they are too few
    /// or do not start with `STRMAN02` to `STRMAN05` (format 1), an error
    /// if its own CRC fails.
    fn read(key: &str, end: &[u8]) -> crate::Result<Option<Footer>> {
        let Some(at) = end.len().checked_sub(MANIFEST_FOOTER_BYTES) else {
            return Ok(None);
        };
        let f = &end[at..];
        let kinds = [(false, false), (true, false), (false, true), (true, true)];
        let Some((pipelined, encrypted)) = kinds
            .into_iter()
            .find(|&(p, e)| f[..8] == footer_magic(p, e)[..])
        else {
            return Ok(None);
        };
        let w = |i: usize| u32::from_le_bytes(f[i..i + 4].try_into().unwrap());
        if w(28) != crc32c::crc32c(&f[..28]) {
            return Err(corrupt(format!(
                "{key}: the manifest footer is damaged (torn)"
            )));
        }
        Ok(Some(Footer {
            payload: u64::from_le_bytes(f[8..16].try_into().unwrap()),
            tail: w(16),
            body: w(20),
            crc: w(24),
            pipelined,
            encrypted,
        }))
    }
}

impl Manifest {
    /// Manifest 1 of disk `disk` (§11.2): generation 1, no owner, an
    /// empty map of `levels` levels; written now, with a fresh nonce.
    pub fn first(disk: u32, size_bytes: u64, levels: u8) -> Manifest {
        Manifest {
            disk,
            seq: 1,
            generation: 1,
            owner: None,
            written_ms: crate::now_ms(),
            nonce: rand::random(),
            size_bytes,
            levels,
            root: None,
            next_ctr: 0,
            snapshots: Vec::new(),
            parent: None,
            removed: false,
            current: None,
            limits: Default::default(),
            root_node: None,
            prev: None,
            pipelined: false,
            keyring: None,
            tail: Default::default(),
        }
    }

    pub fn key(&self) -> String {
        manifest_key(self.disk, self.seq)
    }

    /// The manifest a pipelined manifest needs in place to be valid
    /// (§11.4b); None for one that is not pipelined.
    pub fn pipelined_on(&self) -> Option<PrevRef> {
        self.prev.filter(|_| self.pipelined)
    }

    /// The node `root` points at, from the copy this manifest carries, if
    /// it has one that matches `root` (its CRC) and `levels`.
    pub fn root_node(&self) -> Option<MapNode> {
        use base64::Engine as _;
        let (e, copy) = (self.root?, self.root_node.as_ref()?);
        let b = base64::engine::general_purpose::STANDARD
            .decode(copy)
            .ok()?;
        if self.levels == 0 || b.len() != NODE_BYTES || crc32c::crc32c(&b) != e.crc {
            return None;
        }
        MapNode::decode(&self.key(), &b, self.levels - 1, 0).ok()
    }

    /// Carry a copy of `node`, the node `root` points at.
    pub fn set_root_node(&mut self, node: &MapNode) {
        use base64::Engine as _;
        self.root_node = Some(base64::engine::general_purpose::STANDARD.encode(node.encode()));
    }

    /// What must hold of every manifest, checked before one is written
    /// and after one is read (§11.5): a map and a size, tail entries
    /// inside the disk, a pipelined manifest extending an earlier one,
    /// snapshot ids given once, and the snapshot the disk descends from
    /// among its snapshots.
    pub fn check(&self) -> crate::Result<()> {
        match self.broken() {
            Some(why) => Err(corrupt(format!("{}: a bad manifest: {why}", self.key()))),
            None => Ok(()),
        }
    }

    /// The rule of [`Manifest::check`] this manifest breaks, if any.
    fn broken(&self) -> Option<String> {
        if self.seq == 0 || self.generation == 0 {
            return Some(format!(
                "sequence {} and generation {} start at 1",
                self.seq, self.generation
            ));
        }
        // (An extended disk keeps its levels until a commit writes past
        // their reach, so `levels` may reach less than `size_bytes`.)
        let grains = self.size_bytes.div_ceil(GRAIN as u64);
        if self.levels == 0 || self.size_bytes == 0 {
            return Some(format!(
                "a map of {} levels for {} bytes",
                self.levels, self.size_bytes
            ));
        }
        if let Some((&vg, _)) = self.tail.range(grains..).next() {
            return Some(format!(
                "its tail names grain {vg}, past the disk's {grains} grains"
            ));
        }
        if let Some(p) = self.prev.filter(|p| p.seq >= self.seq) {
            return Some(format!(
                "manifest {} extends manifest {}, not an earlier one",
                self.seq, p.seq
            ));
        }
        if self.pipelined && self.prev.is_none() {
            return Some("pipelined, with no manifest it extends".into());
        }
        let mut ids = std::collections::HashSet::new();
        if let Some(s) = self.snapshots.iter().find(|s| !ids.insert(s.id)) {
            return Some(format!("two snapshots have id {}", s.id));
        }
        if let Some(c) = self.current.filter(|c| !ids.contains(c)) {
            return Some(format!(
                "it descends from snapshot {c}, which it does not list"
            ));
        }
        if let Some(Err(e)) = self.keyring.as_ref().map(|k| k.validate()) {
            return Some(format!("its keyring: {e}"));
        }
        None
    }

    /// Format 2 (§11.5): `payload` (a sealed segment with this
    /// manifest's payload id, or empty), the tail, the body, the footer.
    /// A root node copy that does not match `root` is left out.
    ///
    /// # Panics
    /// On a manifest that fails [`Manifest::check`]: a bad manifest is a
    /// bug in this process, and committing it would hand the bug to every
    /// host that reads the disk (fail-stop, as the engine's checks).
    pub fn encode(&self, payload: &[u8]) -> Vec<u8> {
        if let Some(why) = self.broken() {
            panic!("refusing to write a bad manifest {}: {why}", self.key());
        }
        if self.root_node.is_some() && self.root_node().is_none() {
            let mut m = self.clone();
            m.root_node = None;
            return m.encode(payload);
        }
        let body = serde_json::to_vec(self).expect("json");
        let t = self.tail.len();
        let mut out = Vec::with_capacity(payload.len() + t * TAIL_ENTRY_BYTES + body.len() + 32);
        out.extend_from_slice(payload);
        let mut e = [0u8; TAIL_ENTRY_BYTES];
        for (vg, entry) in self.tail.iter() {
            e[..8].copy_from_slice(&vg.to_le_bytes());
            Entry::encode(entry.as_ref(), &mut e[8..]);
            out.extend_from_slice(&e);
        }
        out.extend_from_slice(&body);
        let crc = crc32c::crc32c(&out[payload.len()..]);
        let mut f = [0u8; MANIFEST_FOOTER_BYTES];
        f[..8].copy_from_slice(footer_magic(self.pipelined, self.keyring.is_some()));
        f[8..16].copy_from_slice(&(payload.len() as u64).to_le_bytes());
        f[16..20].copy_from_slice(&(t as u32).to_le_bytes());
        f[20..24].copy_from_slice(&(body.len() as u32).to_le_bytes());
        f[24..28].copy_from_slice(&crc.to_le_bytes());
        let fcrc = crc32c::crc32c(&f[..28]);
        f[28..32].copy_from_slice(&fcrc.to_le_bytes());
        out.extend_from_slice(&f);
        out
    }

    /// Format 1 (§11.5), as builds before §11.4a wrote it (tests of
    /// stores those builds left).
    pub fn encode_v1(&self) -> Vec<u8> {
        assert!(self.tail.is_empty(), "format 1 has no tail");
        envelope::seal(MAGIC_MANIFEST, &serde_json::to_vec(self).expect("json"))
    }

    /// How many bytes at the end of a manifest object of `size` bytes hold
    /// its tail and body, given its last bytes `end` (at least the
    /// footer; None: it is format 1, read it whole).
    pub fn needs(key: &str, size: u64, end: &[u8]) -> crate::Result<Option<u64>> {
        if size < MANIFEST_FOOTER_BYTES as u64 {
            return Ok(None);
        }
        let Some(f) = Footer::read(key, end)? else {
            return Ok(None);
        };
        let want = f.tail as u64 * TAIL_ENTRY_BYTES as u64 + f.body as u64;
        if f.payload.checked_add(want + MANIFEST_FOOTER_BYTES as u64) != Some(size) {
            return Err(corrupt(format!(
                "{key}: the manifest footer gives {} + {want} + 32 bytes, the object has {size} (torn)",
                f.payload
            )));
        }
        Ok(Some(want + MANIFEST_FOOTER_BYTES as u64))
    }

    /// Decode a manifest from its object: `obj` is the whole object (format
    /// 1 or 2) or, for format 2, at least its last
    /// [`Manifest::needs`] bytes (the payload is not needed).
    pub fn decode(key: &str, obj: &[u8]) -> crate::Result<Manifest> {
        if obj.starts_with(MAGIC_MANIFEST) {
            let body = envelope::open(MAGIC_MANIFEST, key, obj)?;
            return Self::decode_body(key, body, Tail::new());
        }
        if obj.len() < MANIFEST_FOOTER_BYTES {
            return Err(corrupt(format!(
                "{key}: {} bytes: not a manifest (torn)",
                obj.len()
            )));
        }
        let Some(f) = Footer::read(key, obj)? else {
            return Err(corrupt(format!(
                "{key}: not a manifest (neither STRMAN01 at its start nor STRMAN02 to STRMAN05 at its end)"
            )));
        };
        let (t, b) = (f.tail as usize, f.body as usize);
        let len = t * TAIL_ENTRY_BYTES + b;
        let Some(start) = (obj.len() - MANIFEST_FOOTER_BYTES).checked_sub(len) else {
            return Err(corrupt(format!(
                "{key}: shorter than its footer says (torn)"
            )));
        };
        let rest = &obj[start..obj.len() - MANIFEST_FOOTER_BYTES];
        let actual = crc32c::crc32c(rest);
        if actual != f.crc {
            return Err(corrupt(format!(
                "{key}: checksum mismatch in the manifest's tail and body (stored {:#010x}, computed {actual:#010x})",
                f.crc
            )));
        }
        let mut tail = Tail::new();
        let mut last = None;
        for (i, e) in rest[..t * TAIL_ENTRY_BYTES]
            .chunks(TAIL_ENTRY_BYTES)
            .enumerate()
        {
            let vg = u64::from_le_bytes(e[..8].try_into().unwrap());
            if last.is_some_and(|l| l >= vg) {
                return Err(corrupt(format!("{key}: tail entry {i} is out of order")));
            }
            last = Some(vg);
            let entry = Entry::decode(&e[8..])
                .map_err(|why| why.context(format_args!("{key}: tail entry {i}")))?;
            tail.insert(vg, entry);
        }
        let m = Self::decode_body(key, &rest[t * TAIL_ENTRY_BYTES..], tail)?;
        if m.pipelined != f.pipelined || (m.pipelined && m.prev.is_none()) {
            return Err(corrupt(format!(
                "{key}: its footer and its body disagree on whether it is pipelined (damaged)"
            )));
        }
        if m.keyring.is_some() != f.encrypted {
            return Err(corrupt(format!(
                "{key}: its footer and its body disagree on whether the disk is encrypted (damaged)"
            )));
        }
        Ok(m)
    }

    fn decode_body(key: &str, body: &[u8], tail: Tail) -> crate::Result<Manifest> {
        let mut m: Manifest = serde_json::from_slice(body)
            .map_err(|e| corrupt(format!("{key}: not a manifest: {e}")))?;
        if m.key() != key {
            return Err(corrupt(format!(
                "{key}: the manifest says it is {}",
                m.key()
            )));
        }
        m.tail = Arc::new(tail);
        m.check()?;
        Ok(m)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::layout::tests::id;

    #[test]
    fn manifests_round_trip_and_name_their_key() {
        let m = Manifest {
            seq: 42,
            generation: 2,
            owner: Some(Owner {
                host: "h".into(),
                name: "vm1".into(),
                pid: 99,
            }),
            written_ms: 5,
            nonce: 77,
            root: Some(Entry {
                seg: id(),
                slot: 1,
                crc: 2,
                key: 0,
                stored: 0,
            }),
            next_ctr: 13,
            ..Manifest::first(3, 1 << 30, 3)
        };
        let b = m.encode_v1();
        assert_eq!(Manifest::decode(&m.key(), &b).unwrap(), m);
        let e = Manifest::decode(&manifest_key(3, 43), &b).unwrap_err();
        assert!(e.message.contains("the manifest says it is"), "{e}");

        // Format 2, with a payload and a tail; read whole or from its end.
        let mut m = m;
        let mut tail = Tail::new();
        tail.insert(7, None);
        tail.insert(
            9,
            Some(Entry {
                seg: SegId::payload(3, 42),
                slot: 0,
                crc: 5,
                // An own-key clone's grain (§16.7): its index round-trips.
                key: 3,
                stored: 0,
            }),
        );
        m.tail = Arc::new(tail);
        let mut p = SegmentBuilder::new(SegId::payload(3, 42));
        p.add_grain(9, &[1u8; GRAIN]);
        let payload = p.seal(1);
        let b = m.encode(&payload);
        assert_eq!(Manifest::decode(&m.key(), &b).unwrap(), m);
        let need = Manifest::needs(&m.key(), b.len() as u64, &b[b.len() - 40..])
            .unwrap()
            .unwrap();
        assert_eq!(need as usize, b.len() - payload.len());
        let end = &b[b.len() - need as usize..];
        assert_eq!(Manifest::decode(&m.key(), end).unwrap(), m);
        assert_eq!(
            verify_segment(&m.key(), &b[..payload.len()])
                .unwrap()
                .grains,
            1
        );
        for i in (payload.len()..b.len()).step_by(5) {
            let mut d = b.clone();
            d[i] ^= 0x20;
            assert!(Manifest::decode(&m.key(), &d).is_err(), "flip at {i}");
        }
        let e = Manifest::needs(&m.key(), b.len() as u64 + 1, &b).unwrap_err();
        assert!(e.message.contains("torn"), "{e}");
        assert_eq!(SegId::payload(3, 42).key(), m.key());
        assert_eq!(SegId::payload(3, 42).payload_of(), Some(42));
        assert_eq!(SegId::from_key(&m.key()), None);
        let big = SegId::payload(3, (5u64 << 32) | 6);
        assert_eq!(big.payload_of(), Some((5u64 << 32) | 6));
        assert_eq!(SegId::payload_from_key(&big.key()), Some(big));
        let m = Manifest {
            tail: Default::default(),
            ..m
        };
        let b = m.encode(&[]);
        let e = Manifest::decode(&manifest_key(3, 43), &b).unwrap_err();
        assert!(
            e.message
                .contains("the manifest says it is disks/00000003/m/000000000000002a"),
            "{e}"
        );
        let mut d = b.clone();
        let n = d.len() - 3;
        d[n] ^= 1;
        assert!(Manifest::decode(&m.key(), &d).is_err());

        // The root node's copy: carried when it matches `root` and
        // `levels`, dropped at encode when it does not.
        let mut node = MapNode::empty(2, 3, 2, 0);
        node.entries[4] = Some(Entry {
            seg: id(),
            slot: 3,
            crc: 9,
            key: 0,
            stored: 0,
        });
        let mut m = Manifest {
            root: Some(Entry {
                seg: id(),
                slot: 1,
                crc: crc32c::crc32c(&node.encode()),
                key: 0,
                stored: 0,
            }),
            ..m
        };
        m.set_root_node(&node);
        assert_eq!(m.root_node(), Some(node.clone()));
        let back = Manifest::decode(&m.key(), &m.encode(&[])).unwrap();
        assert_eq!(back.root_node(), Some(node.clone()));
        for stale in [
            Manifest {
                root: Some(Entry {
                    crc: 1,
                    ..m.root.unwrap()
                }),
                ..m.clone()
            },
            Manifest {
                levels: 4,
                ..m.clone()
            },
        ] {
            assert_eq!(stale.root_node(), None);
            let back = Manifest::decode(&m.key(), &stale.encode(&[])).unwrap();
            assert_eq!(back.root_node, None);
        }
    }

    /// A manifest that breaks a rule of §11.5 is never written (the
    /// writer panics: a bug, fail-stop) and is refused when read, naming
    /// its key and the rule.
    #[test]
    fn a_bad_manifest_is_neither_written_nor_read() {
        let good = Manifest::first(3, 1 << 30, 3);
        let mut tail = Tail::new();
        tail.insert(1 << 18, None);
        let bad = [
            (
                Manifest {
                    levels: 0,
                    ..good.clone()
                },
                "a map of 0 levels",
            ),
            (
                Manifest {
                    seq: 0,
                    ..good.clone()
                },
                "start at 1",
            ),
            (
                Manifest {
                    tail: Arc::new(tail),
                    ..good.clone()
                },
                "past the disk's 262144 grains",
            ),
            (
                Manifest {
                    prev: Some(PrevRef { seq: 1, nonce: 0 }),
                    ..good.clone()
                },
                "not an earlier one",
            ),
            (
                Manifest {
                    current: Some(5),
                    ..good.clone()
                },
                "which it does not list",
            ),
        ];
        for (m, why) in bad {
            let e = std::panic::catch_unwind(|| m.encode(&[])).expect_err(why);
            let e = e.downcast_ref::<String>().unwrap();
            assert!(
                e.contains("refusing to write a bad manifest") && e.contains(why),
                "{e}"
            );
            if m.tail.is_empty() && m.seq > 0 {
                let e = Manifest::decode(&m.key(), &m.encode_v1()).unwrap_err();
                assert!(
                    e.message.contains(&m.key()) && e.message.contains(why),
                    "{e}"
                );
                assert_eq!(e.kind, crate::ErrorKind::Corrupt);
            }
        }
    }

    /// `b` with its footer's magic replaced (and the footer's CRC fixed).
    fn relabel(b: &[u8], magic: &[u8; 8]) -> Vec<u8> {
        let mut d = b.to_vec();
        let f = d.len() - 32;
        d[f..f + 8].copy_from_slice(magic);
        let crc = crc32c::crc32c(&d[f..f + 28]);
        d[f + 28..].copy_from_slice(&crc.to_le_bytes());
        d
    }

    #[test]
    fn encrypted_disks_manifests_carry_their_own_magics_and_keyring() {
        let slot = strata_crypt::NewSlot {
            secret: &[7u8; 32],
            source: "file",
            label: None,
            argon2: Default::default(),
            now_unix: 1,
        };
        let (rec, _) = strata_crypt::KeyringRec::create(0, &slot).unwrap();
        let mut m = Manifest::first(3, 1 << 30, 3);
        m.keyring = Some(rec);
        let b = m.encode(&[]);
        assert_eq!(&b[b.len() - 32..][..8], MAGIC_MANIFEST_4);
        let back = Manifest::decode(&m.key(), &b).unwrap();
        assert_eq!(back, m);
        assert!(back.keyring.unwrap().unlock(&[7u8; 32]).is_ok());
        let plain = Manifest::first(3, 1 << 30, 3).encode(&[]);
        let e = Manifest::decode(&m.key(), &relabel(&b, MAGIC_MANIFEST_2)).unwrap_err();
        assert!(e.message.contains("whether the disk is encrypted"), "{e}");
        let e = Manifest::decode(&m.key(), &relabel(&plain, MAGIC_MANIFEST_4)).unwrap_err();
        assert!(e.message.contains("whether the disk is encrypted"), "{e}");
        m.seq = 2;
        m.prev = Some(PrevRef { seq: 1, nonce: 5 });
        m.pipelined = true;
        let b = m.encode(&[]);
        assert_eq!(&b[b.len() - 32..][..8], MAGIC_MANIFEST_5);
        assert_eq!(Manifest::decode(&m.key(), &b).unwrap(), m);
        // A damaged record is a damaged manifest.
        m.keyring.as_mut().unwrap().uuid = "not hex".into();
        let e = m.check().unwrap_err();
        assert!(e.message.contains("its keyring"), "{e}");
    }

    #[test]
    fn pipelined_manifests_carry_their_own_magic() {
        let mut m = Manifest::first(3, 1 << 30, 3);
        m.seq = 9;
        m.prev = Some(PrevRef { seq: 8, nonce: 77 });
        let plain = m.encode(&[]);
        assert_eq!(&plain[plain.len() - 32..][..8], MAGIC_MANIFEST_2);
        assert_eq!(Manifest::decode(&m.key(), &plain).unwrap(), m);
        m.pipelined = true;
        let b = m.encode(&[]);
        assert_eq!(&b[b.len() - 32..][..8], MAGIC_MANIFEST_3);
        assert_eq!(
            Manifest::needs(&m.key(), b.len() as u64, &b).unwrap(),
            Some(b.len() as u64)
        );
        assert_eq!(Manifest::decode(&m.key(), &b).unwrap(), m);
        // A footer that says pipelined over a body that does not (or the
        // other way round) is damage, not a manifest.
        for d in [
            relabel(&b, MAGIC_MANIFEST_2),
            relabel(&plain, MAGIC_MANIFEST_3),
        ] {
            let e = Manifest::decode(&m.key(), &d).unwrap_err();
            assert!(
                e.message.contains("disagree on whether it is pipelined"),
                "{e}"
            );
        }
        // Pipelined without a predecessor is damage too.
        m.prev = None;
        let e = Manifest::decode(&m.key(), &m.encode_v1()).unwrap_err();
        assert!(e.message.contains("pipelined, with no manifest"), "{e}");
        // Builds before §11.4b read the body without the two fields.
        let mut old = serde_json::to_value(Manifest::first(3, 1 << 30, 3)).unwrap();
        old.as_object_mut().unwrap().remove("prev");
        let back: Manifest = serde_json::from_value(old).unwrap();
        assert_eq!((back.prev, back.pipelined), (None, false));
    }
}
