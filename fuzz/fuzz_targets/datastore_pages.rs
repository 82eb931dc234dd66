//! The local datastore's pages: the first byte picks a superblock slot or
//! file, a log batch, records or a whole log file, a map node, a count
//! page or the catalog (`strata_engine::fuzzing::pages`); the real decoder
//! must not panic, what decodes must round-trip through its encoder, and
//! a changed byte under a checksum must be refused.
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    strata_engine::fuzzing::pages(data);
});
