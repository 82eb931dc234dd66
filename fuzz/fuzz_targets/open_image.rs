//! Whole images: the input becomes files in an in-memory backend, which is
//! opened as a VMDK chain, read, asked for block status and checked
//! (`strata_vmdk::fuzzing::open_image`). Any result but a panic (or an
//! allocation libFuzzer flags as too large) is fine; a read that succeeds
//! must describe its buffer exactly and hold zeros where it says so.
//!
//! The input is split at each `\0--file--\0` into up to four files named
//! `f.vmdk` (opened), `a.vmdk`, `b.vmdk` and `c.vmdk`, so a descriptor can
//! name extents and parents: e.g. a descriptor with `RW 8 SESPARSE "a.vmdk"`
//! then the separator then an SEsparse extent.
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    strata_vmdk::fuzzing::open_image(data);
});
