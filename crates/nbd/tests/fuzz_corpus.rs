//! Replays the committed corpus of the `nbd_session` fuzz target
//! (fuzz/corpus/nbd_session: sessions captured from qemu-io, qemu-img and
//! nbdinfo, sessions written by hand, and what fuzzing kept) through the
//! real server, as the fuzz target does: none may panic or hang. A
//! session that has not ended after [`SESSION_SECONDS_MAX`] fails the
//! test with its name.

use std::path::Path;
use std::sync::mpsc;
use std::time::Duration;

use strata_nbd::fuzzing::{self, Served};

/// How long one session may take before it counts as hung: each takes
/// milliseconds.
const SESSION_SECONDS_MAX: u64 = 60;

/// Serve `input` on a thread of its own and wait at most
/// [`SESSION_SECONDS_MAX`] for it: a server that hangs fails the test
/// instead of hanging the suite (the hung thread is left behind).
fn serve_within(name: &str, input: Vec<u8>) -> Served {
    let (tx, rx) = mpsc::channel();
    std::thread::Builder::new()
        .name(format!("session {name}"))
        .spawn(move || {
            let _ = tx.send(fuzzing::session(&input));
        })
        .unwrap();
    match rx.recv_timeout(Duration::from_secs(SESSION_SECONDS_MAX)) {
        Ok(served) => served,
        Err(mpsc::RecvTimeoutError::Timeout) => panic!(
            "{name}: the session has not ended after {SESSION_SECONDS_MAX} s: the server hangs"
        ),
        Err(mpsc::RecvTimeoutError::Disconnected) => panic!("{name}: the session panicked"),
    }
}

#[test]
fn every_corpus_session_is_served_to_its_end() {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../fuzz/corpus/nbd_session");
    let mut n = 0;
    for e in std::fs::read_dir(&dir).unwrap() {
        let path = e.unwrap().path();
        let name = path.file_name().unwrap().to_string_lossy().into_owned();
        let input = std::fs::read(&path).unwrap();
        let answered = serve_within(&name, input).answered_bytes;
        // The greeting at least; a captured qemu-io session read 64 KiB,
        // half of it data (every other grain of the fuzz export is a hole).
        assert!(answered >= 18, "{name}: {answered} bytes answered");
        if name == "real_qemu_io" {
            assert!(
                answered > 32 << 10,
                "real_qemu_io: {answered} bytes answered"
            );
        }
        n += 1;
    }
    assert!(n >= 9, "only {n} sessions in {}", dir.display());
}
