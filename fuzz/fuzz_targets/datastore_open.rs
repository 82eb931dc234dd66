//! A whole datastore: the input is its files (`strata_engine::fuzzing::open`:
//! the superblock, catalogs, logs, count pages and a sparse pool, joined
//! by `\0--file--\0`), opened from an in-memory backend with recovery,
//! every disk and snapshot read, `check` run, and after a clean check a
//! write read back and a close. Errors are fine; panics, hangs, huge
//! allocations and reads of the wrong length are not.
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    strata_engine::fuzzing::open(data);
});
