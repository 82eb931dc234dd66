//! `serve --cache none`: the pool is read and written with O_DIRECT. Real
//! clients (qemu-img, qemu-io over NBD) write aligned and unaligned data,
//! read it back, and find it again after a kill -9 of a server that had
//! flushed; the pool's pages stay out of the host page cache, as they do not
//! under `--cache writeback`.

mod common;
use common::*;

use std::path::Path;

fn random_file(path: &Path, len: usize, seed: u64) {
    let mut x = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    let mut data = vec![0u8; len];
    for chunk in data.chunks_mut(8) {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        chunk.copy_from_slice(&x.to_le_bytes()[..chunk.len()]);
    }
    std::fs::write(path, data).unwrap();
}

#[test]
fn cache_none_serves_real_clients_keeps_flushed_writes_and_bypasses_the_page_cache() {
    if !have("qemu-img") || !have("qemu-io") {
        return;
    }
    let s = Store::new();
    let e = s.fails(&["serve", "--nbd-unix", "/nonexistent/x", "--cache", "direct"]);
    assert!(e.contains("expected none or writeback"), "{e}");

    s.ok(&["create", "d", "--size", "32M"]);
    let pool = s.path().join("pool.data");
    let reference = s.path().join("ref.raw");
    random_file(&reference, 32 << 20, 5);

    let srv = s.serve_with(&["--cache", "none"]);
    let st = s.json(&["status"]);
    assert_eq!(st["cache_mode"], "none", "{st}");
    assert!(s.ok(&["status"]).contains("cache:        none"));
    evict(&pool);
    // 32 MiB of random data, then sub-grain writes at odd sectors.
    run_ok(
        "qemu-img",
        &[
            "convert",
            "-n",
            "-f",
            "raw",
            "-O",
            "raw",
            reference.to_str().unwrap(),
            &s.uri("d"),
        ],
    );
    // The same changes to the served disk (then flushed) and the reference.
    for target in [s.uri("d"), reference.to_str().unwrap().to_string()] {
        run_ok(
            "qemu-io",
            &[
                "-f",
                "raw",
                "-c",
                "write -P 0xab 512 1536",
                "-c",
                "write -P 0xcd 8191 2",
                "-c",
                "write -z 65536 4096",
                "-c",
                "flush",
                &target,
            ],
        );
    }
    let cmp = |what: &str| {
        let o = raw_compare(reference.to_str().unwrap(), &s.uri("d"));
        assert!(
            o.status.success(),
            "{what}: {}{}",
            String::from_utf8_lossy(&o.stdout),
            String::from_utf8_lossy(&o.stderr)
        );
    };
    cmp("served with --cache none");
    // Writes and reads of 32 MiB left (almost) nothing in the page cache:
    // only what passes through the refcount file and logs, which are not
    // pool.data. Allow a few pages for anything else that maps it.
    let direct = resident_pages(&pool);
    assert!(
        direct <= 16,
        "{direct} pages of pool.data in the page cache under --cache none"
    );

    // The flush was acknowledged: a kill -9 loses none of it.
    srv.kill9();
    let srv = s.serve_with(&["--cache", "none"]);
    cmp("after kill -9 and restart with --cache none");
    srv.stop();

    // The same datastore under writeback: reads fill the page cache, which
    // is what the assertion above tells apart.
    evict(&pool);
    let srv = s.serve();
    cmp("served with --cache writeback");
    let cached = resident_pages(&pool);
    eprintln!("pool.data pages cached: --cache none {direct}, writeback {cached}");
    assert!(cached > 4096, "only {cached} pages cached under writeback");
    assert_eq!(s.json(&["status"])["cache_mode"], "writeback");
    srv.stop();
    s.ok(&["check"]);
}
