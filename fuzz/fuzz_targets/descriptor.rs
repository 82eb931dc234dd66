//! Descriptor text: parsing never panics, and whatever parses renders to
//! text that parses again to the same disk.
#![no_main]

use libfuzzer_sys::fuzz_target;
use strata_vmdk::Descriptor;

fuzz_target!(|data: &[u8]| {
    let Ok(d) = Descriptor::parse(data) else {
        return;
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
});
