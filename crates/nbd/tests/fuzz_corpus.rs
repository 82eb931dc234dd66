//! Replays the committed corpus of the `nbd_session` fuzz target
//! (fuzz/corpus/nbd_session: sessions captured from qemu-io, qemu-img and
//! nbdinfo, sessions written by hand, and what fuzzing kept) through the
//! real server, as the fuzz target does: none may panic or hang.

use std::path::Path;

#[test]
fn every_corpus_session_is_served_to_its_end() {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../fuzz/corpus/nbd_session");
    let mut n = 0;
    for e in std::fs::read_dir(&dir).unwrap() {
        let path = e.unwrap().path();
        let input = std::fs::read(&path).unwrap();
        let answered = strata_nbd::fuzzing::session(&input).answered_bytes;
        // The greeting at least; a captured qemu-io session read 64 KiB,
        // half of it data (every other grain of the fuzz export is a hole).
        assert!(
            answered >= 18,
            "{}: {answered} bytes answered",
            path.display()
        );
        if path.ends_with("real_qemu_io") {
            assert!(
                answered > 32 << 10,
                "real_qemu_io: {answered} bytes answered"
            );
        }
        n += 1;
    }
    assert!(n >= 9, "only {n} sessions in {}", dir.display());
}
