//! Whole images: the input becomes files in an in-memory backend, which is
//! opened as a VMDK chain, read, asked for block status and checked. Any
//! result but a panic (or an allocation libFuzzer flags as too large) is fine.
//!
//! The input is split at each `\0--file--\0` into up to four files named
//! `f.vmdk` (opened), `a.vmdk`, `b.vmdk` and `c.vmdk`, so a descriptor can
//! name extents and parents: e.g. a descriptor with `RW 8 SESPARSE "a.vmdk"`
//! then the separator then an SEsparse extent.
#![no_main]

use std::sync::Arc;

use libfuzzer_sys::fuzz_target;
use strata_block::BlockDevice;
use strata_storage::{Backend, SimBackend};
use strata_vmdk::{OpenOptions, VmdkImage};

const SEP: &[u8] = b"\0--file--\0";
const NAMES: [&str; 4] = ["f.vmdk", "a.vmdk", "b.vmdk", "c.vmdk"];
const MIB: u64 = 1 << 20;

fn split(mut data: &[u8]) -> Vec<&[u8]> {
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

fuzz_target!(|data: &[u8]| {
    let b = SimBackend::new();
    for (name, bytes) in NAMES.iter().zip(split(data)) {
        let f = b.open(name, true).expect("sim open");
        f.write_at(bytes, 0).expect("sim write");
    }
    let Ok(img) = VmdkImage::open_in(Arc::new(b.clone()), NAMES[0], &OpenOptions::default()) else {
        return;
    };
    let size = img.size_bytes();
    // All of a small disk; the ends and the middle of a large one.
    let windows: Vec<(u64, u64)> = if size <= 16 * MIB {
        vec![(0, size)]
    } else {
        vec![
            (0, 4 * MIB),
            (size / 2 / 512 * 512, MIB),
            (size - 4 * MIB, 4 * MIB),
        ]
    };
    let mut buf = vec![0u8; MIB as usize];
    for (start, len) in windows {
        let mut p = 0;
        while p < len {
            let n = (len - p).min(MIB);
            let _ = img.read_at(&mut buf[..n as usize], start + p);
            p += n;
        }
        let _ = img.block_status(start, len);
    }
    let _ = img.status(0, size, 256);
    let _ = img.check(false);
});
