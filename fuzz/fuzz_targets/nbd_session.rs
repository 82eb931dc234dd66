//! A client's bytes (flags, options, requests, payloads) served by the
//! real NBD server over a socket pair against in-memory exports
//! (`strata_nbd::fuzzing::session`): the server must not panic or hang.
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    strata_nbd::fuzzing::session(data);
});
