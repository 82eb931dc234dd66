//! The local datastore's formats fed to the real decoders and to a real
//! open, for the fuzz targets `datastore_pages` and `datastore_open`
//! (fuzz/) and for the replay of their corpora in the normal test suite
//! (`tests/fuzz_corpus.rs`). Not part of the engine's API.
//!
//! [`pages`]: the input's first byte picks a structure of docs/FORMAT.md
//! (§2 superblock, §3 map node, §4 count page, §5 log batch, records and
//! a whole log file, §6 catalog); the rest goes to its decoder. Decoders
//! must not panic; what decodes must encode to bytes that decode to the
//! same value (and, where the encoding is canonical, to the same bytes);
//! and where the format promises a checksum over a region, one changed
//! byte there must be refused.
//!
//! [`open`]: the input is a datastore's files (see [`FILES`]), which are
//! put in an in-memory backend and opened as a datastore: recovery, then
//! reads of every disk and snapshot, then `check`, then (when `check`
//! finds nothing wrong) a write read back and a clean close. Errors are
//! fine; panics, hangs, huge allocations and reads that return other
//! lengths than asked are not.

use std::sync::Arc;

use strata_block::BlockDevice;
use strata_format::{
    batch_checksum_ok, batch_span, decode_batch_header, decode_map_node, encode_batch,
    encode_map_node, encode_ref_page, journal_file, ref_page_off, FormatError, Record, Superblock,
    BATCH_HEADER_BYTES, ENTRY_GRAIN_MASK, FILE_POOL, FILE_REFCOUNT, FILE_SUPER, FORMAT_VERSION,
    GRAIN_BYTES, SUPER_HEADER_BYTES, SUPER_SLOT_BYTES,
};
use strata_storage::{Backend, SimBackend};

use crate::catalog::Catalog;
use crate::journal::LogFiles;
use crate::{Datastore, OpenOptions};

// ------------------------------------------------------------------ pages

/// What [`pages`] decoded, picked by the input's first byte (modulo the
/// number of kinds).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PageKind {
    /// One 4 KiB slot of `strata.super` (§2).
    SuperSlot,
    /// A slot whose checksum the harness sets first, so the checks after
    /// it are reached.
    SuperSlotFixedCrc,
    /// The whole `strata.super` (two slots, 8 KiB), through
    /// `Superblock::pick_slots`.
    SuperFile,
    /// One log batch (§5): header, checksum, records.
    Batch,
    /// A batch payload: records (§5), as format version 2 and as 1.
    Records,
    /// A whole log file, read by the engine's log reader.
    Journal,
    /// A map node (§3): 8 bytes of the grain it is read at, then the node.
    MapNode,
    /// The same with the node's checksum set by the harness.
    MapNodeFixedCrc,
    /// A count page (§4): 8 bytes of its page index, then the page.
    CountPage,
    /// The same, where an all-zero page is allowed (past the pool).
    CountPageBlankOk,
    /// The same with the page's checksum set by the harness.
    CountPageFixedCrc,
    /// The catalog (§6), with its checksum (kept in the superblock).
    Catalog,
}

const KINDS: [PageKind; 12] = [
    PageKind::SuperSlot,
    PageKind::SuperSlotFixedCrc,
    PageKind::SuperFile,
    PageKind::Batch,
    PageKind::Records,
    PageKind::Journal,
    PageKind::MapNode,
    PageKind::MapNodeFixedCrc,
    PageKind::CountPage,
    PageKind::CountPageBlankOk,
    PageKind::CountPageFixedCrc,
    PageKind::Catalog,
];

impl PageKind {
    /// The first byte that selects this kind.
    pub fn selector(self) -> u8 {
        KINDS.iter().position(|&k| k == self).expect("listed") as u8
    }
}

/// What [`pages`] did with its input.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PagesSummary {
    pub kind: Option<PageKind>,
    /// The structure decoded (for a batch: its header and checksum passed
    /// and its records decoded; for a log file: it held at least one batch).
    pub decoded: bool,
}

/// A position in `0..n` that depends on every input byte, for the byte a
/// checksum test changes.
fn pick(input: &[u8], n: usize) -> usize {
    (crc32c::crc32c(input) as usize) % n.max(1)
}

/// Decode `input[1..]` as the structure `input[0]` selects, checking what
/// the module documentation says.
pub fn pages(input: &[u8]) -> PagesSummary {
    let Some((&sel, rest)) = input.split_first() else {
        return PagesSummary {
            kind: None,
            decoded: false,
        };
    };
    let kind = KINDS[sel as usize % KINDS.len()];
    let decoded = match kind {
        PageKind::SuperSlot => super_slot(rest),
        PageKind::SuperSlotFixedCrc => {
            let mut b = rest.to_vec();
            fix_super_crc(&mut b);
            super_slot(&b)
        }
        PageKind::SuperFile => super_file(rest),
        PageKind::Batch => batch(rest),
        PageKind::Records => records(rest),
        PageKind::Journal => journal(rest),
        PageKind::MapNode => map_node(rest, false),
        PageKind::MapNodeFixedCrc => map_node(rest, true),
        PageKind::CountPage => count_page(rest, false, false),
        PageKind::CountPageBlankOk => count_page(rest, true, false),
        PageKind::CountPageFixedCrc => count_page(rest, false, true),
        PageKind::Catalog => catalog(rest),
    };
    PagesSummary {
        kind: Some(kind),
        decoded,
    }
}

fn u32_at(b: &[u8], off: usize) -> u32 {
    u32::from_le_bytes(b[off..off + 4].try_into().expect("4 bytes"))
}

/// Set a slot's checksum over the header length it gives (clamped to what
/// is there), as a writer would.
fn fix_super_crc(b: &mut [u8]) {
    use strata_format::super_off::{CHECKSUM, HEADER_BYTES};
    if b.len() < SUPER_HEADER_BYTES as usize {
        return;
    }
    let n = (u32_at(b, HEADER_BYTES) as usize).clamp(CHECKSUM + 4, b.len().min(SUPER_SLOT_BYTES));
    b[CHECKSUM..CHECKSUM + 4].fill(0);
    let crc = crc32c::crc32c(&b[..n]);
    b[CHECKSUM..CHECKSUM + 4].copy_from_slice(&crc.to_le_bytes());
}

fn super_slot(b: &[u8]) -> bool {
    use strata_format::super_off::HEADER_BYTES;
    let Ok(sb) = Superblock::decode(b) else {
        return false;
    };
    // Round trip: `encode` writes the current version whatever was read.
    let again = Superblock::decode(&sb.encode()).expect("an encoded superblock decodes");
    assert_eq!(
        again,
        Superblock {
            version: FORMAT_VERSION,
            ..sb.clone()
        },
        "superblock round trip"
    );
    // The checksum covers bytes 0..header_bytes (§2). The length field
    // itself is left alone: changing it changes what is covered.
    let header = u32_at(b, HEADER_BYTES) as usize;
    let mut at = pick(b, header - 4);
    if at >= HEADER_BYTES {
        at += 4;
    }
    let mut c = b.to_vec();
    c[at] ^= 0x01 << (at % 8);
    // Bytes 0..8 are the magic, checked first; the rest fail the checksum.
    let e = Superblock::decode(&c);
    assert!(
        matches!(e, Err(FormatError::BadChecksum { .. }))
            || (at < 8 && matches!(e, Err(FormatError::BadMagic { .. }))),
        "a superblock with byte {at} changed: {e:?}"
    );
    true
}

fn super_file(b: &[u8]) -> bool {
    let mut f = b.to_vec();
    f.resize(2 * SUPER_SLOT_BYTES, 0);
    let (s0, s1) = f.split_at(SUPER_SLOT_BYTES);
    let Ok(p) = Superblock::pick_slots(s0, s1) else {
        assert!(Superblock::decode(s0).is_err() && Superblock::decode(s1).is_err());
        return false;
    };
    // The current one is a valid slot of the highest generation.
    let valid: Vec<Superblock> = [s0, s1]
        .iter()
        .filter_map(|s| Superblock::decode(s).ok())
        .collect();
    assert_eq!(
        p.valid,
        [
            Superblock::decode(s0).is_ok(),
            Superblock::decode(s1).is_ok()
        ]
    );
    assert!(
        valid.contains(&p.current),
        "picked a slot that is not valid"
    );
    assert!(valid.iter().all(|s| s.generation <= p.current.generation));
    true
}

fn batch(b: &[u8]) -> bool {
    const PAYLOAD_BYTES: usize = 24;
    let Some(h) = decode_batch_header(b) else {
        return false;
    };
    let used = BATCH_HEADER_BYTES + h.payload_bytes as usize;
    if used > b.len() || !batch_checksum_ok(&b[..used]) {
        return false;
    }
    let Ok(recs) = Record::decode_all(&b[BATCH_HEADER_BYTES..used]) else {
        return false;
    };
    // Round trip of the header and payload.
    let e = encode_batch(h.generation, h.sequence, &b[BATCH_HEADER_BYTES..used]);
    assert_eq!(e.len() as u64, batch_span(h.payload_bytes));
    assert_eq!(decode_batch_header(&e), Some(h), "batch header round trip");
    assert!(batch_checksum_ok(&e[..used]));
    assert_eq!(
        Record::decode_all(&e[BATCH_HEADER_BYTES..used]).unwrap(),
        recs
    );
    // The checksum covers the header (its own field as 0) and the payload
    // (§5); the length field is left alone (it says what is covered).
    let mut at = pick(b, used - 4);
    if at >= PAYLOAD_BYTES {
        at += 4;
    }
    let mut c = b[..used].to_vec();
    c[at] ^= 0x80 >> (at % 8);
    assert!(
        decode_batch_header(&c).is_none() || !batch_checksum_ok(&c),
        "a batch with byte {at} changed still passes its checksum"
    );
    true
}

fn records(p: &[u8]) -> bool {
    let _ = Record::decode_all_v1(p);
    let Ok(recs) = Record::decode_all(p) else {
        return false;
    };
    // The encoding is canonical: the same bytes again.
    let mut out = Vec::with_capacity(p.len());
    for r in &recs {
        r.encode_into(&mut out);
    }
    assert_eq!(out, p, "records encode to other bytes than they came from");
    true
}

fn journal(b: &[u8]) -> bool {
    let sim = SimBackend::new();
    let files = [0u64, 1].map(|g| sim.open(journal_file(g), true).expect("sim open"));
    files[0].write_at(b, 0).expect("sim write");
    let logs = LogFiles::new(files);
    let generation = decode_batch_header(b).map_or(2, |h| h.generation);
    let _ = logs.first_generations();
    match logs.read_generation(generation) {
        Ok(log) => {
            assert!(log.end_offset <= (b.len() as u64).next_multiple_of(GRAIN_BYTES));
            // The other file is empty: nothing of any generation there.
            let other = logs
                .read_generation(generation.wrapping_add(1))
                .expect("an empty log");
            assert!(other.batches.is_empty());
            !log.batches.is_empty()
        }
        Err(_) => false,
    }
}

/// A node's CRC-32C as §3 defines it: all 4096 bytes, lanes 0 and 1 (the
/// top 16 bits of words 0 and 1) taken as 0.
fn node_crc(b: &[u8]) -> u32 {
    let mut c = b.to_vec();
    c[6..8].fill(0);
    c[14..16].fill(0);
    crc32c::crc32c(&c)
}

fn map_node(rest: &[u8], fix_crc: bool) -> bool {
    if rest.len() < 8 {
        return false;
    }
    let grain = u64::from_le_bytes(rest[..8].try_into().expect("8"));
    let mut b = rest[8..].to_vec();
    if fix_crc && b.len() == GRAIN_BYTES as usize {
        let crc = node_crc(&b);
        b[6..8].copy_from_slice(&(crc as u16).to_le_bytes());
        b[14..16].copy_from_slice(&((crc >> 16) as u16).to_le_bytes());
    }
    let Ok(n) = decode_map_node(&b, grain) else {
        return false;
    };
    assert!(n.entries.iter().all(|e| e & !ENTRY_GRAIN_MASK == 0));
    // A node names its grain in 48 bits; grain 0 never holds one, which
    // the reader's callers see to (entry 0 means "unmapped").
    if grain != 0 {
        let mut e = vec![0u8; GRAIN_BYTES as usize];
        encode_map_node(&n.entries, grain, n.level, &mut e);
        assert_eq!(e, b, "a map node encodes to other bytes than it came from");
    }
    // The checksum covers all 4096 bytes (§3).
    let at = pick(&b, b.len());
    b[at] ^= 0x10;
    assert!(
        decode_map_node(&b, grain).is_err(),
        "a map node with byte {at} changed still decodes"
    );
    true
}

fn count_page(rest: &[u8], blank_ok: bool, fix_crc: bool) -> bool {
    if rest.len() < 8 {
        return false;
    }
    let page = u64::from_le_bytes(rest[..8].try_into().expect("8"));
    let mut b = rest[8..].to_vec();
    if fix_crc && b.len() == GRAIN_BYTES as usize {
        let crc = crc32c::crc32c(&b[..ref_page_off::CRC]);
        b[ref_page_off::CRC..].copy_from_slice(&crc.to_le_bytes());
    }
    let Ok(counts) = strata_format::decode_ref_page(&b, page, blank_ok) else {
        return false;
    };
    let blank = b.iter().all(|&x| x == 0);
    if blank {
        assert!(blank_ok, "a blank count page decodes where it may not");
        assert!(counts.iter().all(|&c| c == 0));
        return true;
    }
    let mut e = vec![0u8; GRAIN_BYTES as usize];
    encode_ref_page(page, &counts, &mut e);
    assert_eq!(
        e, b,
        "a count page encodes to other bytes than it came from"
    );
    // The checksum covers bytes 0..4092, and is itself checked (§4).
    let at = pick(&b, b.len());
    b[at] ^= 0x02;
    assert!(
        strata_format::decode_ref_page(&b, page, blank_ok).is_err(),
        "a count page with byte {at} changed still decodes"
    );
    true
}

fn catalog(b: &[u8]) -> bool {
    let Ok(c) = Catalog::decode(b) else {
        return false;
    };
    let again = Catalog::decode(&c.encode()).expect("an encoded catalog decodes");
    assert_eq!(again, c, "catalog round trip");
    // As open reads it: from catalog.{generation % 2}, checked against the
    // superblock's length and checksum (§6); one changed byte is refused.
    let sb = Superblock {
        version: FORMAT_VERSION,
        generation: 3,
        capacity_bytes: 0,
        pool_grains: 0,
        catalog_bytes: b.len() as u64,
        catalog_checksum: crc32c::crc32c(b),
        uuid: [0; 16],
        created_unix_secs: 0,
        ro_compat: 0,
        compat: 0,
        incompat: 0,
    };
    let sim = SimBackend::new();
    let f = sim
        .open(strata_format::catalog_file(sb.generation), true)
        .expect("sim open");
    f.write_at(b, 0).expect("sim write");
    assert_eq!(
        crate::datastore::read_catalog(&sim, &sb).expect("the catalog as stored"),
        c
    );
    let at = pick(b, b.len());
    let mut d = b.to_vec();
    d[at] ^= 0x04;
    f.write_at(&d, 0).expect("sim write");
    assert!(
        crate::datastore::read_catalog(&sim, &sb).is_err(),
        "a catalog with byte {at} changed is read"
    );
    true
}

// ------------------------------------------------------------------- open

/// The files of a datastore, in the order [`open`] takes them from its
/// input.
pub const FILES: [&str; 7] = [
    FILE_SUPER,
    "catalog.0",
    "catalog.1",
    "journal.0",
    "journal.1",
    FILE_REFCOUNT,
    FILE_POOL,
];

// ----------------------------------------------------------- packed grain

/// What [`packed_grain`] found in its input.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct PackedSummary {
    /// The grain as given decoded.
    pub decoded: bool,
    /// With its directory's CRC set by the harness, it decoded.
    pub decoded_fixed: bool,
    /// Fragments that decompressed to a whole grain.
    pub fragments_read: usize,
}

/// Two grains of a packed stream (docs/FORMAT.md §18.8): the input, cut
/// or padded with zeros to 8 KiB, is a grain and the one after it. The
/// first goes through the decoder as it is and with its directory's CRC
/// set (the second's too, so a spill's checks are reached). Of what
/// decodes, every fragment's stored bytes are read (their CRC checked,
/// a spill's rest from the second grain) and decompressed; and a
/// directory whose fragments all read lays out again
/// ([`encode_stream`](strata_format::packed::encode_stream)) to a stream
/// that holds the same fragments with the same stored bytes. Errors are
/// fine; panics are not.
pub fn packed_grain(input: &[u8]) -> PackedSummary {
    use strata_format::packed::{decode_packed, seal_packed};
    let g = GRAIN_BYTES as usize;
    let mut b = input.to_vec();
    b.resize(2 * g, 0);
    let mut sum = PackedSummary::default();
    if let Ok(p) = decode_packed(&b[..g]) {
        sum.decoded = true;
        sum.fragments_read += read_fragments(&b[..g], &b[g..], &p);
    }
    let (first, next) = b.split_at_mut(g);
    if seal_packed(first) {
        seal_packed(next);
        if let Ok(p) = decode_packed(first) {
            sum.decoded_fixed = true;
            sum.fragments_read += read_fragments(first, next, &p);
        }
    }
    sum
}

/// Read and decompress each fragment of `p` (grain `g`, followed by
/// `next`); when all of them read, lay them out again and check the
/// stream holds the same. Returns how many decompressed.
fn read_fragments(g: &[u8], next: &[u8], p: &strata_format::packed::Packed) -> usize {
    use strata_format::packed::{decode_packed, encode_stream, Piece};
    let mut read = 0;
    let mut stored = Vec::new();
    let mut joined = Vec::new();
    for f in &p.fragments {
        // The read path's form says the same as the plain one.
        let quick = p
            .stored_in(f, g, Some(next), &mut joined)
            .ok()
            .map(<[u8]>::to_vec);
        let Ok(b) = p.stored(f, g, Some(next)) else {
            assert!(quick.is_none());
            continue;
        };
        assert_eq!(quick.as_deref(), Some(&b[..]));
        let mut out = vec![0u8; f.plain_bytes()];
        if crate::compress::decompress(f.codec, &b[..f.len as usize], &mut out).is_ok() {
            read += 1;
        }
        stored.push((f, b));
    }
    // (A grain of carried bytes only has nothing of its own to lay out.)
    if !stored.is_empty() && stored.len() == p.fragments.len() {
        let pieces: Vec<Piece<'_>> = stored
            .iter()
            .map(|(f, b)| Piece {
                v: f.v,
                span: f.span,
                codec: f.codec,
                len: f.len as usize,
                stored: b,
            })
            .collect();
        let s = encode_stream(&pieces).expect("a decoded directory lays out again");
        let grain = |i: usize| &s.grains[i * GRAIN_BYTES as usize..][..GRAIN_BYTES as usize];
        for (i, (f, b)) in stored.iter().enumerate() {
            let at = s.starts[i];
            let q = decode_packed(grain(at)).expect("a laid-out grain decodes");
            let e = q.find(f.v).expect("each fragment where it starts");
            assert_eq!(
                (e.v, e.span, e.codec, e.len, e.crc24),
                (f.v, f.span, f.codec, f.len, f.crc24)
            );
            let nx = (at + 1 < s.len()).then(|| grain(at + 1));
            assert_eq!(q.stored(e, grain(at), nx).ok().as_deref(), Some(&b[..]));
        }
    }
    read
}

/// What separates the files in [`open`]'s input.
pub const FILE_SEP: &[u8] = b"\0--file--\0";

/// Total bytes the in-memory backend lets the files grow to: the input is
/// at most a few MiB, and what open writes (a checkpoint) is not much more.
const SPACE_BYTES: u64 = 64 << 20;
/// Disks up to this size are read whole; larger ones at both ends and in
/// the middle.
const READ_WHOLE_BYTES: u64 = 8 << 20;
const MIB: u64 = 1 << 20;

/// Largest `pool.data` [`open`] makes (the length its input gives is cut
/// to this).
const POOL_MAX_BYTES: u64 = 32 << 20;

/// Files as [`open`] takes them (the inverse of its split). `pool.data`,
/// last, must be given as [`sparse_pool`] makes it.
pub fn join_files(files: &[&[u8]]) -> Vec<u8> {
    files.join(FILE_SEP)
}

/// `pool.data` as [`open`]'s input holds it: a pool is mostly zeros (its
/// grains are placed block by block, and its tail is held in advance), so
/// the input gives its length (u64 LE), then a record for each grain that
/// is not all zeros: the grain number (u64 LE) and its 4096 bytes.
pub fn sparse_pool(pool: &[u8]) -> Vec<u8> {
    let mut out = (pool.len() as u64).to_le_bytes().to_vec();
    for (g, grain) in pool.chunks(GRAIN_BYTES as usize).enumerate() {
        if grain.iter().any(|&b| b != 0) {
            out.extend_from_slice(&(g as u64).to_le_bytes());
            out.extend_from_slice(grain);
        }
    }
    out
}

/// Write the sparse pool `part` (see [`sparse_pool`]) into `f`.
fn expand_pool(part: &[u8], f: &dyn strata_storage::Storage) {
    let Some((len, mut recs)) = part.split_first_chunk::<8>() else {
        f.write_at(part, 0).expect("sim write");
        return;
    };
    f.set_len(u64::from_le_bytes(*len).min(POOL_MAX_BYTES))
        .expect("sim set_len");
    while recs.len() > 8 {
        let (g, rest) = recs.split_at(8);
        let data = &rest[..rest.len().min(GRAIN_BYTES as usize)];
        let g = u64::from_le_bytes(g.try_into().expect("8"));
        if let Some(at) = g.checked_mul(GRAIN_BYTES) {
            if at + GRAIN_BYTES <= POOL_MAX_BYTES {
                f.write_at(data, at).expect("sim write");
            }
        }
        recs = &recs[(8 + data.len()).min(recs.len())..];
    }
}

fn split_files(mut data: &[u8]) -> Vec<&[u8]> {
    let mut out = Vec::new();
    while out.len() < FILES.len() - 1 {
        match data.windows(FILE_SEP.len()).position(|w| w == FILE_SEP) {
            Some(i) => {
                out.push(&data[..i]);
                data = &data[i + FILE_SEP.len()..];
            }
            None => break,
        }
    }
    out.push(data);
    out
}

/// One disk or snapshot as [`open`] read it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ReadSummary {
    /// `DISK` or `DISK@SNAP`.
    pub target: String,
    pub size_bytes: u64,
    /// Whether every window was read whole (a small disk: all of it).
    pub whole: bool,
    /// CRC-32C of the bytes read, in order (reads that failed left out).
    pub crc: u32,
    pub failed_reads: usize,
}

/// What [`open`] did with its input.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct OpenSummary {
    /// Why open failed, if it did.
    pub open_error: Option<String>,
    pub reads: Vec<ReadSummary>,
    /// What `check` reported (None: not run, or it failed).
    pub check_errors: Option<Vec<String>>,
    /// After a clean check: a write read back, and a clean close.
    pub wrote: bool,
}

/// Open `input` (files joined by [`FILE_SEP`], in the order of [`FILES`],
/// `pool.data` in the form [`sparse_pool`] gives it) as a datastore and use it, as the module documentation says.
pub fn open(input: &[u8]) -> OpenSummary {
    let sim = SimBackend::new();
    sim.limit_space(Some(SPACE_BYTES));
    for (name, bytes) in FILES.iter().zip(split_files(input)) {
        let f = sim.open(name, true).expect("sim open");
        if *name == FILE_POOL {
            expand_pool(bytes, f.as_ref());
        } else {
            f.write_at(bytes, 0).expect("sim write");
        }
        f.sync().expect("sim sync");
    }
    let mut s = OpenSummary::default();
    let opts = OpenOptions {
        cache_bytes: 4 << 20,
        direct_io: false,
    };
    let ds = match Datastore::open(Arc::new(sim), &opts, None) {
        Ok(ds) => ds,
        Err(e) => {
            s.open_error = Some(e.to_string());
            return s;
        }
    };
    let mut targets = Vec::new();
    for d in ds.list_disks() {
        if let Ok(snaps) = ds.snapshot_list(&d.name) {
            targets.extend(
                snaps
                    .into_iter()
                    .map(|sn| (format!("{}@{}", d.name, sn.name), Some(sn.size_bytes))),
            );
        }
        targets.push((d.name.clone(), Some(d.size_bytes)));
    }
    for (target, size) in &targets {
        if let Some(r) = read_target(&ds, target, *size) {
            s.reads.push(r);
        }
    }
    s.check_errors = ds.check().ok().map(|r| r.errors);
    if s.check_errors.as_ref().is_some_and(|e| e.is_empty()) {
        s.wrote = write_back(&ds);
    }
    s
}

/// Read `target` (windows of a large disk), checking the lengths.
fn read_target(ds: &Datastore, target: &str, size: Option<u64>) -> Option<ReadSummary> {
    let h = ds.open_disk(target).ok()?;
    let size_bytes = h.size_bytes();
    if let Some(want) = size {
        assert_eq!(
            size_bytes, want,
            "{target}: the handle's size is not the catalog's"
        );
    }
    let windows: Vec<(u64, u64)> = if size_bytes <= READ_WHOLE_BYTES {
        vec![(0, size_bytes)]
    } else {
        let mid = size_bytes / 2 / GRAIN_BYTES * GRAIN_BYTES;
        vec![(0, 2 * MIB), (mid, MIB), (size_bytes - 2 * MIB, 2 * MIB)]
    };
    let mut r = ReadSummary {
        target: target.to_string(),
        size_bytes,
        whole: size_bytes <= READ_WHOLE_BYTES,
        crc: 0,
        failed_reads: 0,
    };
    let mut buf = vec![0u8; MIB as usize];
    for (start, len) in windows {
        let mut p = 0;
        while p < len {
            let n = (len - p).min(MIB) as usize;
            match h.read_at(&mut buf[..n], start + p) {
                Ok(fill) => {
                    assert_eq!(
                        fill.len_bytes(),
                        n as u64,
                        "{target}: a read of {n} bytes at {} says it filled another length",
                        start + p
                    );
                    r.crc = crc32c::crc32c_append(r.crc, &buf[..n]);
                }
                Err(_) => r.failed_reads += 1,
            }
            p += n as u64;
        }
    }
    // A read past the end is refused, not answered.
    assert!(
        h.read_at(&mut buf[..512], size_bytes).is_err(),
        "{target}: a read past the end succeeded"
    );
    Some(r)
}

/// Write a grain at the start of every disk, read it back, close.
fn write_back(ds: &Datastore) -> bool {
    let pattern: Vec<u8> = (0..GRAIN_BYTES as usize).map(|i| (i % 251) as u8).collect();
    for d in ds.list_disks() {
        if d.size_bytes < GRAIN_BYTES {
            continue;
        }
        let Ok(h) = ds.open_disk(&d.name) else {
            return false;
        };
        if h.write_at(&pattern, 0, false).is_err() || h.flush().is_err() {
            return false;
        }
        let mut back = vec![0u8; pattern.len()];
        if h.read_at(&mut back, 0).is_ok() {
            assert!(
                back == pattern,
                "{}: a grain written reads back other bytes",
                d.name
            );
        }
    }
    ds.close().is_ok()
}
