//! `clone --full` on both kinds of datastore and between them, while a
//! client writes the source: the clone is one instant of it.
#![allow(clippy::too_many_lines, clippy::too_many_arguments)] // test code is outside the ratchet (crates/tidy)

use crate::common;

use std::path::Path;
use std::process::{Child, Command, Stdio};

use common::*;

/// Blocks the writer cycles through, and their size.
const BLOCKS: u64 = 64;
const BLOCK: u64 = 64 * 1024;
/// Passes over all blocks: pass `p` writes byte `p` into every block, in
/// block order.
const PASSES: u64 = 120;

/// A qemu-io client that writes pass after pass over the blocks (pass 1
/// is written before it starts).
fn writer(uri: &str) -> Child {
    let mut cmd = Command::new("qemu-io");
    cmd.args(["-f", "raw", "-t", "writeback"]);
    for p in 2..=PASSES {
        for b in 0..BLOCKS {
            cmd.arg("-c")
                .arg(format!("write -P {p} {} {BLOCK}", b * BLOCK));
        }
    }
    cmd.arg(uri)
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .expect("qemu-io")
}

/// The pass each block of `img` holds; a point in time of the writer is
/// `[p, .., p, p-1, .., p-1]`: a prefix written by pass p, the rest still
/// by p-1 (and every block uniform).
fn passes(img: &Path) -> Vec<u8> {
    let data = std::fs::read(img).unwrap();
    (0..BLOCKS as usize)
        .map(|b| {
            let blk = &data[b * BLOCK as usize..(b + 1) * BLOCK as usize];
            assert!(
                blk.iter().all(|&x| x == blk[0]),
                "block {b} is torn: {:?}",
                &blk[..16]
            );
            blk[0]
        })
        .collect()
}

fn one_instant(p: &[u8]) -> bool {
    let first = p[0];
    let split = p.iter().position(|&x| x != first).unwrap_or(p.len());
    p[split..].iter().all(|&x| x + 1 == first)
}

/// Full clones while a client writes: within one datastore of each kind,
/// and between kinds both ways; each clone reads as one instant, and the
/// source goes on unchanged (no snapshot left behind).
#[test]
fn a_full_clone_under_client_writes_is_one_instant_within_and_between_kinds() {
    if !have("qemu-io") || !have("qemu-img") {
        return;
    }
    let mut cases = vec![(Kind::Local, None)];
    if strata_s3::testing::shared().is_some() {
        cases.extend([
            (Kind::ObjectStore, None),
            (Kind::Local, Some(Kind::ObjectStore)),
            (Kind::ObjectStore, Some(Kind::Local)),
        ]);
    }
    for (home_kind, to_kind) in cases {
        eprintln!("--- clone --full from a {home_kind:?} datastore to {to_kind:?}");
        let home = Store::of(home_kind);
        let other = to_kind.map(Store::of);
        home.ok(&["create", "d", "--size", "16M"]);
        let server = home.serve();
        run_ok(
            "qemu-io",
            &[
                "-f",
                "raw",
                "-c",
                &format!("write -P 1 0 {}", BLOCKS * BLOCK),
                "-c",
                "flush",
                &home.uri("d"),
            ],
        );
        let w = writer(&home.uri("d"));
        std::thread::sleep(std::time::Duration::from_millis(200));
        let mut args = vec!["clone", "d", "c", "--full"];
        let to = other
            .as_ref()
            .map(|o| o.path().to_str().unwrap().to_string());
        if let Some(t) = &to {
            args.extend(["--to", t.as_str()]);
        }
        let info = home.json(&args);
        assert_eq!(info["name"], "c", "{info}");
        assert_eq!(info["size_bytes"], 16u64 << 20, "{info}");
        let o = w.wait_with_output().unwrap();
        assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
        // The clone is served by the home server wherever it was made.
        let dir = tempfile::tempdir().unwrap();
        let img = dir.path().join("c.raw");
        save(&home.uri("c"), &img);
        let p = passes(&img);
        assert!(one_instant(&p), "the clone is not one instant: {p:?}");
        // The source ends at the last pass and keeps no snapshot.
        save(&home.uri("d"), &dir.path().join("d.raw"));
        assert!(passes(&dir.path().join("d.raw"))
            .iter()
            .all(|&x| x as u64 == PASSES));
        assert_eq!(home.json(&["snapshot", "list", "d"]), serde_json::json!([]));
        // A clone onto a name in use is refused, and leaves nothing.
        let e = home.fails(&["clone", "d", "c", "--full"]);
        assert!(e.contains("'c'"), "{e}");
        assert_eq!(home.json(&["info", "c"])["size_bytes"], 16u64 << 20);
        server.stop();
        // It lives where it was made (a datastore the server held is
        // free once it stops).
        let lives = other.as_ref().unwrap_or(&home);
        let names = lives.disk_names();
        assert!(names.contains(&"c".to_string()), "{names:?}");
    }
}
