//! The bodies of the VMDK fuzz targets (fuzz/: `descriptor`,
//! `sparse_headers`, `open_image`), shared with the replay of their
//! corpora in the normal test suite (`tests/fuzz_corpus.rs`) and with the
//! proptest versions of the same checks (`tests/fuzz_parsers.rs`). Not
//! part of the crate's API.
//!
//! Each function panics when a check fails and otherwise returns a small
//! summary of what the input came to, so a replay can check that a seed
//! meant to be valid still parses or opens.

use std::sync::Arc;

use strata_block::{BlockDevice, Fill};
use strata_storage::{Backend, SimBackend};

use crate::sparse::{CowdHeader, KdmvHeader, SeSparseHeader, SeSparseVolatile};
use crate::{Descriptor, OpenOptions, VmdkImage};

/// What separates the files of an `open_image` input.
pub const SEP: &[u8] = b"\0--file--\0";
/// The names the files of an `open_image` input get, in order; the first
/// is opened.
pub const NAMES: [&str; 4] = ["f.vmdk", "a.vmdk", "b.vmdk", "c.vmdk"];
const MIB: u64 = 1 << 20;

/// What a descriptor came to.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct DescriptorSummary {
    /// `Descriptor::parse` accepted it.
    pub parsed: bool,
    /// Its extent lines.
    pub extents: usize,
    /// The sum of their sectors (saturating).
    pub sectors: u64,
}

/// Parse `data` as descriptor text: no panic, and what parses renders to
/// text that parses to the same disk (version, CIDs, create type, parent
/// hint, DDB, each extent's access, sectors and type).
pub fn descriptor(data: &[u8]) -> DescriptorSummary {
    let Ok(d) = Descriptor::parse(data) else {
        return DescriptorSummary::default();
    };
    let again = Descriptor::parse(d.render().as_bytes())
        .unwrap_or_else(|e| panic!("render of {d:?} does not parse: {e}"));
    assert_eq!(
        (again.version, again.cid, again.parent_cid),
        (d.version, d.cid, d.parent_cid)
    );
    assert_eq!(again.create_type, d.create_type);
    assert_eq!(again.parent_hint, d.parent_hint);
    assert_eq!(again.ddb, d.ddb);
    assert_eq!(again.extents.len(), d.extents.len());
    for (a, e) in again.extents.iter().zip(&d.extents) {
        assert_eq!((a.access, a.sectors, a.kind), (e.access, e.sectors, e.kind));
    }
    DescriptorSummary {
        parsed: true,
        extents: d.extents.len(),
        sectors: d
            .extents
            .iter()
            .fold(0u64, |s, e| s.saturating_add(e.sectors)),
    }
}

/// Which headers a sector decoded as.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct HeaderSummary {
    pub kdmv: bool,
    pub cowd: bool,
    pub sesparse: bool,
    pub sesparse_volatile: bool,
}

/// Decode `data` as each binary header (KDMV, SEsparse constant and
/// volatile from its first 512 bytes, zero-padded; COWD from the input as
/// it is): no panic, and a decoded header encodes to bytes that decode to
/// it.
pub fn sparse_headers(data: &[u8]) -> HeaderSummary {
    let mut b = [0u8; 512];
    let n = data.len().min(512);
    b[..n].copy_from_slice(&data[..n]);
    let mut s = HeaderSummary::default();
    if let Ok(h) = KdmvHeader::decode(&b) {
        assert_eq!(KdmvHeader::decode(&h.encode()), Ok(h));
        s.kdmv = true;
    }
    if let Ok(h) = SeSparseHeader::decode(&b) {
        assert_eq!(SeSparseHeader::decode(&h.encode()), Ok(h));
        s.sesparse = true;
    }
    if let Ok(v) = SeSparseVolatile::decode(&b) {
        assert_eq!(SeSparseVolatile::decode(&v.encode()), Ok(v));
        s.sesparse_volatile = true;
    }
    if let Ok(h) = CowdHeader::decode(data) {
        assert_eq!(CowdHeader::decode(&h.encode()), Ok(h));
        s.cowd = true;
    }
    s
}

/// The files of an `open_image` input: split at each [`SEP`], at most
/// [`NAMES`]`.len()` pieces (the last keeps any further separators).
pub fn split(mut data: &[u8]) -> Vec<&[u8]> {
    let mut out = Vec::new();
    while out.len() < NAMES.len() - 1 {
        match data.windows(SEP.len()).position(|w| w == SEP) {
            Some(i) => {
                out.push(&data[..i]);
                data = &data[i + SEP.len()..];
            }
            None => break,
        }
    }
    out.push(data);
    out
}

/// An in-memory backend holding the files of an `open_image` input under
/// [`NAMES`].
pub fn install(data: &[u8]) -> SimBackend {
    let b = SimBackend::new();
    for (name, bytes) in NAMES.iter().zip(split(data)) {
        let f = b.open(name, true).expect("sim open");
        f.write_at(bytes, 0).expect("sim write");
    }
    b
}

/// What an image came to.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct ImageSummary {
    /// Files in the input.
    pub files: usize,
    /// Why it did not open, if it did not.
    pub open_error: Option<String>,
    /// The disk's size in bytes (0 if it did not open).
    pub size: u64,
    /// Links in the chain.
    pub links: usize,
    /// Bytes read successfully.
    pub bytes_read: u64,
    /// Reads that failed.
    pub read_errors: usize,
    /// Of the bytes read, those a read reported as zeros.
    pub zero_bytes: u64,
    /// Block status or status calls that failed.
    pub status_errors: usize,
    /// Errors `check(false)` reported (1 if it failed itself).
    pub check_errors: usize,
}

impl ImageSummary {
    /// Opened, and every read, status and the check succeeded.
    pub fn clean(&self) -> bool {
        self.open_error.is_none()
            && self.read_errors == 0
            && self.status_errors == 0
            && self.check_errors == 0
    }
}

/// Open the input's files (see [`split`]) as a VMDK chain on a
/// [`SimBackend`] and [`exercise`] it, reading the whole disk up to 16 MiB
/// and 4 MiB windows of a larger one.
pub fn open_image(data: &[u8]) -> ImageSummary {
    let files = split(data).len();
    let b = install(data);
    let mut s = match VmdkImage::open_in(Arc::new(b), NAMES[0], &OpenOptions::default()) {
        Ok(img) => exercise(&img, 16 * MIB, 4 * MIB),
        Err(e) => ImageSummary {
            open_error: Some(e.to_string()),
            ..ImageSummary::default()
        },
    };
    s.files = files;
    s
}

/// One read of `buf.len()` bytes at `off`, counted in `s`: an error is
/// fine, and a read that succeeds must describe exactly its buffer and
/// hold zeros where it says so.
fn checked_read(img: &VmdkImage, s: &mut ImageSummary, buf: &mut [u8], off: u64) {
    buf.fill(0xa5);
    let Ok(fill) = img.read_at(buf, off) else {
        s.read_errors += 1;
        return;
    };
    assert_eq!(
        fill.len_bytes(),
        buf.len() as u64,
        "read of {} at {off}: {fill:?}",
        buf.len()
    );
    for (r, f) in fill.runs() {
        if f == Fill::Zeros {
            let run = &buf[r.start as usize..r.end as usize];
            assert!(
                run.iter().all(|&x| x == 0),
                "read at {off}: {r:?} reported as zeros holds data"
            );
            s.zero_bytes += r.end - r.start;
        }
    }
    s.bytes_read += buf.len() as u64;
}

/// Read an opened image (all of it up to `whole_up_to` bytes, else
/// `window` bytes at both ends and 1 MiB in the middle, and odd-sized
/// reads across grain edges), ask for block status and status of the
/// chain and each link, and check it. Any error is fine; a panic is not,
/// and a read that succeeds must describe exactly its buffer and hold
/// zeros where it says so; a read past the end must fail.
pub fn exercise(img: &VmdkImage, whole_up_to: u64, window: u64) -> ImageSummary {
    let size = img.size_bytes();
    let mut s = ImageSummary {
        size,
        links: img.links.len(),
        ..ImageSummary::default()
    };
    let windows: Vec<(u64, u64)> = if size <= whole_up_to {
        vec![(0, size)]
    } else {
        vec![
            (0, window),
            (size / 2 / 512 * 512, MIB),
            (size - window, window),
        ]
    };
    let mut buf = vec![0u8; MIB as usize];
    let read = |s: &mut ImageSummary, buf: &mut [u8], off: u64| checked_read(img, s, buf, off);
    for &(start, len) in &windows {
        let mut p = 0;
        while p < len {
            let n = (len - p).min(MIB);
            read(&mut s, &mut buf[..n as usize], start + p);
            p += n;
        }
        // Odd-sized reads across grain boundaries.
        for k in 0..8u64 {
            let off = (start + k * 4096 * 17 + 1536).min(start + len) / 512 * 512;
            let n = (3 * 512).min(start + len - off);
            if n > 0 {
                read(&mut s, &mut buf[..n as usize], off);
            }
        }
        if img.block_status(start, len).is_err() {
            s.status_errors += 1;
        }
    }
    assert!(
        img.read_at(&mut buf[..512], size).is_err(),
        "a read past the end of {size} bytes succeeded"
    );
    if size <= 1 << 30 && img.block_status(0, size).is_err() {
        s.status_errors += 1;
    }
    if img.status(0, size, 64).is_err() {
        s.status_errors += 1;
    }
    for level in 0..img.links.len() {
        if img.link_status(level, 0, size.min(64 * MIB), 4096).is_err() {
            s.status_errors += 1;
        }
    }
    s.check_errors = match img.check(false) {
        Ok(r) => r.iter().map(|(_, c)| c.errors.len()).sum(),
        Err(_) => 1,
    };
    let _ = img.current_cid();
    let _ = img.preferred_block_bytes();
    s
}
