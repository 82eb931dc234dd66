//! A virtio-blk descriptor chain (guest memory layout and contents, the
//! descriptors, the limits) taken apart and carried out by the real
//! vhost-user-blk request code against real guest memory and an in-memory
//! disk (`strata_vhost::fuzzing::chain`): no panic, and the status byte,
//! used length and disk contents are what the request says.
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    strata_vhost::fuzzing::chain(data);
});
