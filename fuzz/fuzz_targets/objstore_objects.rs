//! The objects of an object-store datastore: the first byte picks a
//! segment header, a whole segment, a map node, a map entry, a manifest or
//! the root object (`strata_objstore::fuzzing::objects`); the real decoder
//! must not panic, what decodes must round-trip through its encoder, and
//! a changed byte under a CRC must be refused.
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    strata_objstore::fuzzing::objects(data);
});
