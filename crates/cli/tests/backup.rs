//! Incremental backups (docs/BACKUP.md): `strata diff` against a byte
//! comparison of what real clients wrote and read, through trims,
//! WRITE_ZEROES, an extend, kill -9 of the server, revert and clones, and
//! snapshot ids that survive a reused name; on each kind of datastore.
#![allow(clippy::too_many_lines, clippy::too_many_arguments)] // test code is outside the ratchet (crates/tidy)

use crate::common;
use std::path::Path;

use common::*;
use serde_json::{json, Value};

const MIB: u64 = 1 << 20;
const GRAIN: usize = 4096;

/// `qemu-io` commands against `uri`, writing.
fn io(uri: &str, cmds: &[&str]) {
    let mut args = vec!["-f", "raw"];
    for c in cmds {
        args.extend(["-c", c]);
    }
    args.push(uri);
    run_ok("qemu-io", &args);
}

/// The ranges of a `diff --json` as (offset, length, type).
fn ranges(d: &Value) -> Vec<(u64, u64, String)> {
    d["ranges"]
        .as_array()
        .unwrap_or_else(|| panic!("no ranges: {d}"))
        .iter()
        .map(|r| {
            (
                r["offset"].as_u64().unwrap(),
                r["length"].as_u64().unwrap(),
                r["type"].as_str().unwrap().to_string(),
            )
        })
        .collect()
}

fn data(offset: u64, len: u64) -> (u64, u64, String) {
    (offset, len, "data".into())
}

fn zero(offset: u64, len: u64) -> (u64, u64, String) {
    (offset, len, "zero".into())
}

/// What a diff of `new` against `old` (raw images; `old` may be shorter)
/// must say, checked by bytes: every grain that differs lies in a range
/// (no false negative); a `zero` range reads zeros in `new`, a `data`
/// range holds no grain of only zeros (thin disks never store one).
fn agrees_with_bytes(d: &Value, old: &Path, new: &Path) {
    let a = std::fs::read(old).unwrap();
    let b = std::fs::read(new).unwrap();
    let rs = ranges(d);
    let find = |off: u64| rs.iter().find(|r| r.0 <= off && off < r.0 + r.1);
    for (i, g) in b.chunks(GRAIN).enumerate() {
        let off = (i * GRAIN) as u64;
        let before = a.get(i * GRAIN..(i * GRAIN + g.len()).min(a.len()));
        let same = before.is_some_and(|x| x == g) && (i * GRAIN + g.len()) <= a.len();
        let r = find(off);
        if !same {
            assert!(
                r.is_some(),
                "grain at {off} differs but is in no range: {d}"
            );
        }
        match r.map(|r| r.2.as_str()) {
            Some("zero") => assert!(g.iter().all(|&x| x == 0), "zero range at {off} reads data"),
            Some("data") => assert!(
                g.iter().any(|&x| x != 0),
                "data range at {off} is all zeros"
            ),
            _ => {}
        }
    }
    let total = |t: &str| -> u64 { rs.iter().filter(|r| r.2 == t).map(|r| r.1).sum() };
    assert_eq!(d["data_bytes"], total("data"), "{d}");
    assert_eq!(d["zero_bytes"], total("zero"), "{d}");
}

fn snapshot_id(s: &Store, disk: &str, snap: &str) -> u64 {
    let list = s.json(&["snapshot", "list", disk]);
    list.as_array()
        .unwrap()
        .iter()
        .find(|x| x["name"] == snap)
        .unwrap_or_else(|| panic!("{snap} in {list}"))["id"]
        .as_u64()
        .unwrap()
}

#[test]
fn a_diff_is_exact_through_trims_zeroes_an_extend_and_kill_9() {
    if !have("qemu-io") || !have("qemu-img") {
        return;
    }
    // SeaweedFS first: servers started from here on know its endpoint
    // (a local disk moves to it below).
    let _ = strata_s3::testing::shared();
    each_kind(|kind| {
        let s = Store::of(kind);
        let img = tempfile::tempdir().unwrap();
        let file = |n: &str| img.path().join(n);
        s.ok(&["create", "vm", "--size", "64M"]);
        let mut srv = s.serve();
        io(&s.uri("vm"), &["write -P 0x11 0 4M", "flush"]);
        s.ok(&["snapshot", "create", "vm", "s1"]);
        // Data, a trim, WRITE_ZEROES that may unmap (-u; without it qemu
        // sends NO_HOLE, and the zeros stay allocated: data), data far
        // off, and the same bytes written again over a grain (a rewrite
        // counts: never a false negative).
        io(
            &s.uri("vm"),
            &[
                "write -P 0x22 1M 64k",
                "discard 2M 64k",
                "write -z -u 3M 8k",
                "write -P 0x33 10M 4k",
                "write -P 0x11 0 4k",
                "flush",
            ],
        );
        s.ok(&["snapshot", "create", "vm", "s2"]);
        save(&s.uri("vm@s1"), &file("s1"));
        save(&s.uri("vm@s2"), &file("s2"));
        let d = s.json(&["diff", "vm@s2", "--from", "s1"]);
        assert_eq!(
            ranges(&d),
            [
                data(0, 4096),
                data(MIB, 64 << 10),
                zero(2 * MIB, 64 << 10),
                zero(3 * MIB, 8 << 10),
                data(10 * MIB, 4096)
            ],
            "{kind:?}"
        );
        agrees_with_bytes(&d, &file("s1"), &file("s2"));
        let id1 = snapshot_id(&s, "vm", "s1");
        assert_eq!((&d["base_id"], &d["base"]), (&json!(id1), &json!("vm@s1")));
        // By id, the same; the totals alone, the same figures.
        let by_id = s.json(&["diff", "vm@s2", "--from", &format!("id:{id1}")]);
        assert_eq!(by_id, d);
        let t = s.json(&["diff", "vm@s2", "--from", "s1", "--totals"]);
        assert!(t.get("ranges").is_none(), "{t}");
        assert_eq!(
            (&t["data_bytes"], &t["zero_bytes"]),
            (&d["data_bytes"], &d["zero_bytes"])
        );
        let human = s.ok(&["diff", "vm@s2", "--from", "s1"]);
        assert!(human.contains("vm@s2 (id "), "{human}");
        assert!(human.contains("  zero"), "{human}");

        // Extended between snapshots: all of the new range counts.
        s.ok(&["extend", "vm", "--size", "128M"]);
        io(&s.uri("vm"), &["write -P 0x44 100M 4k", "flush"]);
        s.ok(&["snapshot", "create", "vm", "s3"]);
        let d = s.json(&["diff", "vm@s3", "--from", "s2"]);
        assert_eq!(
            ranges(&d),
            [
                zero(64 * MIB, 36 * MIB),
                data(100 * MIB, 4096),
                zero(100 * MIB + 4096, 28 * MIB - 4096)
            ],
            "{kind:?}"
        );
        assert_eq!(
            (&d["base_size_bytes"], &d["size_bytes"]),
            (&json!(64 * MIB), &json!(128 * MIB))
        );
        save(&s.uri("vm@s3"), &file("s3"));
        agrees_with_bytes(&d, &file("s2"), &file("s3"));

        // Flushed writes, then kill -9: the diff of the head after the
        // restart has them, and agrees with the bytes.
        io(
            &s.uri("vm"),
            &["write -P 0x55 20M 64k", "discard 0 4k", "flush"],
        );
        srv.kill9();
        srv = s.serve();
        let d = s.json(&["diff", "vm", "--from", "s3"]);
        assert_eq!(
            ranges(&d),
            [zero(0, 4096), data(20 * MIB, 64 << 10)],
            "{kind:?}"
        );
        save(&s.uri("vm"), &file("head"));
        agrees_with_bytes(&d, &file("s3"), &file("head"));

        // A move to a datastore of the other kind and back keeps every
        // diff exact (the maps are rebuilt there, sharing as they did).
        if strata_s3::testing::shared().is_some() {
            let other = Store::of(match kind {
                Kind::Local => Kind::ObjectStore,
                Kind::ObjectStore => Kind::Local,
            });
            let diffs = |s: &Store| {
                [("vm@s3", "s2"), ("vm@s2", "s1"), ("vm", "s3")]
                    .map(|(t, f)| ranges(&s.json(&["diff", t, "--from", f])))
            };
            let before = diffs(&s);
            s.ok(&["move", "vm", "--to", other.path().to_str().unwrap()]);
            assert_eq!(diffs(&s), before, "{kind:?}: moved away");
            s.ok(&["move", "vm", "--to", s.path().to_str().unwrap()]);
            assert_eq!(diffs(&s), before, "{kind:?}: moved back");
        }

        // After a revert the head is s3 again; a linked clone differs from
        // its origin by what it wrote.
        s.ok(&["snapshot", "revert", "vm", "s3"]);
        assert_eq!(ranges(&s.json(&["diff", "vm", "--from", "s3"])), []);
        s.ok(&["clone", "vm@s3", "c"]);
        io(&s.uri("c"), &["write -P 0x66 5M 8k", "flush"]);
        let d = s.json(&["diff", "c", "--from", "vm@s3"]);
        assert_eq!(ranges(&d), [data(5 * MIB, 8192)], "{kind:?}");

        // A name reused: the old id is refused, never diffed silently.
        s.ok(&["snapshot", "delete", "vm", "s1"]);
        s.ok(&["snapshot", "create", "vm", "s1"]);
        assert_ne!(snapshot_id(&s, "vm", "s1"), id1);
        let e = s.fails(&["diff", "vm", "--from", &format!("id:{id1}")]);
        assert!(
            e.contains(&format!("no snapshot with id {id1}")) && e.contains("take a full one"),
            "{e}"
        );
        let e = s.fails(&["diff", "vm", "--from", "gone"]);
        assert!(
            e.contains("no snapshot 'gone'") && e.contains("take a full one"),
            "{e}"
        );
        let e = s.fails(&["diff", "vm", "--from", "id:x"]);
        assert!(e.contains("id:N"), "{e}");
        srv.stop();
        // Without a server the CLI answers the same.
        assert_eq!(
            ranges(&s.json(&["diff", "c", "--from", "vm@s3"])),
            [data(5 * MIB, 8192)]
        );
    });
}

/// Merged dirty intervals of a diff (its data and zero ranges alike).
fn dirty(d: &Value) -> Vec<(u64, u64)> {
    let mut out: Vec<(u64, u64)> = Vec::new();
    for (o, l, _) in ranges(d) {
        match out.last_mut() {
            Some(last) if last.0 + last.1 == o => last.1 += l,
            _ => out.push((o, l)),
        }
    }
    out
}

/// The dirty runs `nbdinfo --map=CONTEXT` prints for `uri`.
fn nbdinfo_dirty(uri: &str, context: &str) -> Vec<(u64, u64)> {
    let out = run_ok("nbdinfo", &[&format!("--map={context}"), uri]);
    out.lines()
        .filter_map(|l| {
            let f: Vec<&str> = l.split_whitespace().collect();
            let flags: u32 = f.get(2)?.parse().ok()?;
            (flags & 1 == 1).then(|| (f[0].parse().unwrap(), f[1].parse().unwrap()))
        })
        .collect()
}

/// What a pull-mode backup client does with libnbd: open `uri` with
/// `context` selected, walk BLOCK_STATUS over the whole export and copy
/// every dirty extent into the raw file `out` (a copy of the base).
const RESTORE: &str = r#"
import os, sys
uri, ctx, out = os.environ["URI"], os.environ["CTX"], os.environ["OUT"]
h.add_meta_context(ctx)
h.connect_uri(uri)
assert h.can_meta_context(ctx), ctx
f = open(out, "r+b")
f.truncate(h.get_size())
copied = 0
for pos, length in dirty_runs(h, ctx):
    at = pos
    while at < pos + length:
        n = min(pos + length - at, 8 << 20)
        f.seek(at)
        f.write(h.pread(n, at))
        at += n
    copied += length
f.close()
print(copied)
"#;

/// libnbd with `base:allocation` and a bitmap on one connection: a reply
/// per context to each BLOCK_STATUS, one extent each under REQ_ONE.
const BOTH: &str = r#"
import os
uri, ctx = os.environ["URI"], os.environ["CTX"]
h.add_meta_context("base:allocation")
h.add_meta_context(ctx)
h.connect_uri(uri)
assert h.can_meta_context("base:allocation") and h.can_meta_context(ctx)
for flags in (0, nbd.CMD_FLAG_REQ_ONE):
    seen = {}
    def cb(name, offset, entries, err):
        seen[name] = len(entries) // 2
        return 0
    h.block_status(h.get_size(), 0, cb, flags=flags)
    assert set(seen) == {"base:allocation", ctx}, seen
    if flags:
        assert all(n == 1 for n in seen.values()), seen
    print(flags, seen[ctx], seen["base:allocation"])
"#;

#[test]
fn backup_clients_read_dirty_bitmaps_over_nbd() {
    for tool in ["nbdinfo", "qemu-io", "qemu-img", "qemu-nbd", "nbdsh"] {
        if !have(tool) {
            return;
        }
    }
    each_kind(|kind| {
        let s = Store::of(kind);
        let img = tempfile::tempdir().unwrap();
        let file = |n: &str| img.path().join(n);
        s.ok(&["create", "vm", "--size", "64M"]);
        let _srv = s.serve();
        io(&s.uri("vm"), &["write -P 0x11 0 8M", "flush"]);
        s.ok(&["snapshot", "create", "vm", "s1"]);
        io(
            &s.uri("vm"),
            &[
                "write -P 0x22 1M 192k",
                "discard 4M 64k",
                "write -z 6M 4k",
                "write -P 0x33 40M 1M",
                "flush",
            ],
        );
        s.ok(&["snapshot", "create", "vm", "s2"]);
        let d = s.json(&["diff", "vm@s2", "--from", "s1"]);
        let want = dirty(&d);
        assert_eq!(want.len(), 4, "{kind:?}: {d}");
        let s2 = s.uri("vm@s2");
        let ctx = "qemu:dirty-bitmap:s1";

        // nbdinfo lists the contexts (not the export's own snapshot) and
        // maps exactly the ranges of `strata diff`.
        let list = run_ok("nbdinfo", &[&s2]);
        assert!(
            list.contains(ctx) && list.contains("base:allocation"),
            "{list}"
        );
        assert!(!list.contains("qemu:dirty-bitmap:s2"), "{list}");
        assert_eq!(nbdinfo_dirty(&s2, ctx), want, "{kind:?}");
        // An unknown context is not selected (the spec: no reply for it),
        // so the client refuses to map it.
        let o = run("nbdinfo", &["--map=qemu:dirty-bitmap:nope", &s2]);
        assert!(!o.status.success());
        assert!(
            String::from_utf8_lossy(&o.stderr).contains("does not support metadata context"),
            "{}",
            String::from_utf8_lossy(&o.stderr)
        );
        // qemu-nbd -L lists it too.
        let l = run_ok("qemu-nbd", &["-L", "-k", s.sock().to_str().unwrap()]);
        assert!(l.contains(ctx), "{l}");
        // qemu-img map with QEMU's x-dirty-bitmap: dirty reads as no data.
        let map = run_ok(
            "qemu-img",
            &[
                "map",
                "--output=json",
                "--image-opts",
                &format!(
                    "driver=nbd,export=vm@s2,server.type=unix,server.path={},x-dirty-bitmap={ctx}",
                    s.sock().display()
                ),
            ],
        );
        let map: Vec<Value> = serde_json::from_str(&map).unwrap();
        let mut from_map: Vec<(u64, u64)> = Vec::new();
        for e in map.iter().filter(|e| e["data"] == false) {
            let (o, l) = (e["start"].as_u64().unwrap(), e["length"].as_u64().unwrap());
            match from_map.last_mut() {
                Some(last) if last.0 + last.1 == o => last.1 += l,
                _ => from_map.push((o, l)),
            }
        }
        assert_eq!(from_map, want, "{kind:?}");

        // An incremental restore: a copy of s1 plus the dirty extents of
        // s2, read with libnbd, is s2 byte for byte.
        save(&s.uri("vm@s1"), &file("restore"));
        save(&s2, &file("s2"));
        let out = file("restore");
        let o = nbdsh(
            &format!("{WALK}{RESTORE}"),
            &[("URI", &s2), ("CTX", ctx), ("OUT", out.to_str().unwrap())],
        );
        assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
        let copied: u64 = String::from_utf8_lossy(&o.stdout).trim().parse().unwrap();
        assert_eq!(copied, want.iter().map(|r| r.1).sum::<u64>());
        assert!(
            std::fs::read(file("restore")).unwrap() == std::fs::read(file("s2")).unwrap(),
            "{kind:?}: the incremental restore differs from s2"
        );

        let o = nbdsh(BOTH, &[("URI", &s2), ("CTX", ctx)]);
        assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
        let lines = String::from_utf8_lossy(&o.stdout).to_string();
        // Without REQ_ONE the bitmap's reply has every run: 4 dirty ones
        // and the clean ones around them.
        assert!(lines.starts_with("0 9 "), "{lines}");

        // The head's bitmap is a live view: a write shows at once.
        io(&s.uri("vm"), &["write -P 0x44 60M 4k", "flush"]);
        let live = nbdinfo_dirty(&s.uri("vm"), "qemu:dirty-bitmap:s2");
        assert_eq!(live, [(60 * MIB, 4096)], "{kind:?}");
        assert_eq!(
            live,
            dirty(&s.json(&["diff", "vm", "--from", "s2"])),
            "{kind:?}"
        );
    });
}

/// `sh -c` with the datastore in the environment, for pipes.
/// `nbdsh -c SCRIPT` with `env`. nbdsh runs `python3` from PATH: Debian's
/// first, which has the binding (a Python of one's own would not).
fn nbdsh(script: &str, env: &[(&str, &str)]) -> std::process::Output {
    let path = format!(
        "/usr/bin:/bin:{}",
        std::env::var("PATH").unwrap_or_default()
    );
    std::process::Command::new("nbdsh")
        .args(["-c", script])
        .env("PATH", path)
        .envs(env.iter().copied())
        .output()
        .unwrap()
}

/// libnbd: `dirty_runs(h, ctx)`, the `(offset, length)` runs that a
/// BLOCK_STATUS walk over the whole export marks with bit 0 of `ctx`.
const WALK: &str = r#"
def dirty_runs(h, ctx):
    size, out, pos = h.get_size(), [], 0
    while pos < size:
        got = []
        def cb(name, offset, entries, err):
            if name == ctx:
                got.extend(zip(entries[0::2], entries[1::2]))
            return 0
        h.block_status(min(size - pos, 1 << 30), pos, cb)
        for length, flags in got:
            if flags & 1:
                out.append((pos, length))
            pos += length
    return out
"#;

/// A backup client's session: walk CTX over the export URI, evict the
/// pool file POOL from the host page cache, then read the first READS
/// dirty pieces (1 MiB each) one at a time and, if CACHE is set, send
/// NBD_CMD_CACHE for the piece after them. Prints the dirty offsets.
const FOLLOW: &str = r#"
import os
ctx = os.environ["CTX"]
h.add_meta_context(ctx)
h.connect_uri(os.environ["URI"])
runs = [at for at, _ in dirty_runs(h, ctx)]
os.sync()
fd = os.open(os.environ["POOL"], os.O_RDONLY)
os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
os.close(fd)
n = int(os.environ["READS"])
for at in runs[:n]:
    h.pread(1 << 20, at)
if os.environ.get("CACHE"):
    h.cache(1 << 20, runs[n])
print(" ".join(str(r) for r in runs))
h.shutdown()
"#;

#[test]
fn nbd_reads_ahead_along_the_dirty_ranges_a_backup_reads() {
    if !have("nbdsh") || !have("qemu-io") {
        return;
    }
    let s = Store::new();
    s.ok(&["create", "vm", "--size", "256M"]);
    s.ok(&["snapshot", "create", "vm", "s1"]);
    // 16 dirty pieces of 1 MiB, 15 MiB apart, written from the last to
    // the first: in the pool they lie in the reverse order, so reading
    // them in the disk's order is never sequential there (the host's own
    // read-ahead cannot help).
    let srv = s.serve();
    let writes: Vec<String> = (0..16u64)
        .rev()
        .map(|i| format!("write -P {} {}M 1M", i + 1, 8 + 15 * i))
        .collect();
    let mut cmds: Vec<&str> = writes.iter().map(|w| w.as_str()).collect();
    cmds.push("flush");
    io(&s.uri("vm"), &cmds);
    s.ok(&["snapshot", "create", "vm", "s2"]);
    let pool = s.path().join("pool.data");
    let follow = |extra: &[(&str, &str)]| {
        let mut env = vec![
            ("URI", s.uri("vm@s2")),
            ("CTX", "qemu:dirty-bitmap:s1".to_string()),
            ("READS", "2".to_string()),
            ("POOL", pool.display().to_string()),
        ];
        env.extend(extra.iter().map(|(k, v)| (*k, v.to_string())));
        let env: Vec<(&str, &str)> = env.iter().map(|(k, v)| (*k, v.as_str())).collect();
        let o = nbdsh(&format!("{WALK}{FOLLOW}"), &env);
        assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
        let runs: Vec<u64> = String::from_utf8_lossy(&o.stdout)
            .split_whitespace()
            .map(|x| x.parse().unwrap())
            .collect();
        assert_eq!(
            runs,
            (0..16).map(|i| (8 + 15 * i) * MIB).collect::<Vec<_>>()
        );
    };
    // What becomes cached of the pool, waiting up to 20 s for at least
    // `want` bytes (read-ahead completes in the background).
    let cached_within = |want: u64| {
        let t = std::time::Instant::now();
        loop {
            let c = resident_pages(&pool) as u64 * 4096;
            if c >= want || t.elapsed() > std::time::Duration::from_secs(20) {
                return c;
            }
            std::thread::sleep(std::time::Duration::from_millis(50));
        }
    };

    // With read-ahead (the default 8 MiB): after two pieces read, the
    // next pieces' data is brought in too.
    follow(&[]);
    let c = cached_within(2 * MIB + 6 * MIB);
    assert!(
        c >= 8 * MIB,
        "read-ahead brought {c} bytes of the pool into the cache"
    );
    srv.stop();

    // Without it: the two pieces and the pool's metadata only; then
    // NBD_CMD_CACHE of the third piece brings it in.
    let _srv = s.serve_with(&["--nbd-read-ahead", "0"]);
    follow(&[]);
    std::thread::sleep(std::time::Duration::from_millis(500));
    let c = resident_pages(&pool) as u64 * 4096;
    assert!(c < 4 * MIB, "without read-ahead, {c} bytes are cached");
    follow(&[("CACHE", "1")]);
    let c = cached_within(3 * MIB);
    assert!(c >= 3 * MIB, "NBD_CMD_CACHE left {c} bytes cached");
}

fn sh(s: &Store, script: &str) -> std::process::Output {
    std::process::Command::new("sh")
        .arg("-c")
        .arg(script)
        .env("STRATA", strata())
        .env("STRATA_DATASTORE", s.path())
        .output()
        .unwrap()
}

/// Whether two exports read the same (qemu-img compare).
fn same(a: &str, b: &str) -> bool {
    raw_compare(a, b).status.success()
}

#[test]
fn export_diff_and_import_diff_round_trip_through_files_pipes_and_rbd() {
    for tool in ["qemu-io", "qemu-img", "rbd"] {
        if !have(tool) {
            return;
        }
    }
    each_kind(|kind| {
        let s = Store::of(kind);
        let dir = tempfile::tempdir().unwrap();
        let file = |n: &str| dir.path().join(n);
        let p = |n: &str| file(n).to_str().unwrap().to_string();
        s.ok(&["create", "vm", "--size", "32M"]);
        s.ok(&["create", "copy", "--size", "32M"]);
        s.ok(&["create", "merged", "--size", "32M"]);
        let _srv = s.serve();
        io(&s.uri("vm"), &["write -P 0x11 0 6M", "flush"]);
        s.ok(&["snapshot", "create", "vm", "s1"]);
        // Data, a trim and zeros over data (the hole class: openzfs
        // #4050), then s2; an extend and data past the old end, then s3.
        io(
            &s.uri("vm"),
            &[
                "write -P 0x22 1M 100k",
                "discard 2M 1M",
                "write -z -u 5M 64k",
                "flush",
            ],
        );
        s.ok(&["snapshot", "create", "vm", "s2"]);
        s.ok(&["extend", "vm", "--size", "48M"]);
        io(&s.uri("vm"), &["write -P 0x33 40M 1M", "flush"]);
        s.ok(&["snapshot", "create", "vm", "s3"]);

        // Full export of s1, then the two increments: one to a file, one
        // through a pipe, as to another site.
        let full = s.json(&["export-diff", "vm@s1", &p("d01")]);
        assert_eq!(full["data_bytes"], 6 * MIB, "{full}");
        let d12 = s.json(&["export-diff", "vm@s2", "--from", "s1", &p("d12")]);
        assert_eq!(
            d12["zero_bytes"],
            MIB + (64 << 10),
            "the trim and the zeros: {d12}"
        );
        let o = sh(
            &s,
            &format!("\"$STRATA\" export-diff vm@s3 --from s2 - > {}", p("d23")),
        );
        assert!(o.status.success(), "{o:?}");
        assert!(
            String::from_utf8_lossy(&o.stderr).contains("exported vm@s3 since vm@s2 to -"),
            "the report goes to stderr: {o:?}"
        );
        // Applied out of turn (copy lacks s2 yet): refused before anything.
        let o = sh(
            &s,
            "\"$STRATA\" export-diff vm@s3 --from s2 - | \"$STRATA\" import-diff - copy",
        );
        assert!(!o.status.success(), "{o:?}");
        assert!(
            String::from_utf8_lossy(&o.stderr).contains("does not have"),
            "{o:?}"
        );
        s.ok(&["import-diff", &p("d01"), "copy"]);
        s.ok(&["import-diff", &p("d12"), "copy"]);
        assert!(same(&s.uri("copy@s2"), &s.uri("vm@s2")), "{kind:?}");
        let o = sh(
            &s,
            &format!("cat {} | \"$STRATA\" import-diff - copy --json", p("d23")),
        );
        assert!(o.status.success(), "{o:?}");
        let r: Value = serde_json::from_slice(&o.stdout).unwrap();
        assert_eq!(
            (&r["extended"], &r["snapshot"]),
            (&json!(true), &json!("s3")),
            "{r}"
        );
        assert!(same(&s.uri("copy"), &s.uri("vm@s3")), "{kind:?}");
        assert_eq!(
            ranges(&s.json(&["diff", "copy@s3", "--from", "s2"])),
            ranges(&s.json(&["diff", "vm@s3", "--from", "s2"]))
        );
        // The stream is the spec's, byte for byte where it is fixed.
        let b = std::fs::read(file("d12")).unwrap();
        assert!(
            b.starts_with(b"rbd diff v1\nf\x02\0\0\0s1t\x02\0\0\0s2s"),
            "{:?}",
            &b[..40]
        );
        assert_eq!(b.last(), Some(&b'e'));

        // Ceph's own tool merges strata's two increments; the merged
        // stream applied to s1 is s3.
        let o = std::process::Command::new("rbd")
            .args(["merge-diff", &p("d12"), &p("d23"), &p("d13")])
            .output()
            .unwrap();
        assert!(o.status.success(), "rbd merge-diff: {o:?}");
        s.ok(&["import-diff", &p("d01"), "merged"]);
        s.ok(&["import-diff", &p("d13"), "merged"]);
        assert!(same(&s.uri("merged"), &s.uri("vm@s3")), "{kind:?}");

        // A head that moved on since f is refused, naming where; --force
        // applies anyway.
        s.ok(&["create", "drift", "--size", "32M"]);
        s.ok(&["import-diff", &p("d01"), "drift"]);
        io(&s.uri("drift"), &["write -P 0x77 8M 4k", "flush"]);
        let e = s.fails(&["import-diff", &p("d12"), "drift"]);
        assert!(
            e.contains("first at offset 8388608") && e.contains("--force"),
            "{e}"
        );
        s.ok(&["import-diff", &p("d12"), "drift", "--force"]);

        // Damaged streams: refused with the byte offset, and the disk
        // stays as it was (truncated, out of order, a bad tag).
        s.ok(&["create", "victim", "--size", "32M"]);
        s.ok(&["import-diff", &p("d01"), "victim"]);
        save(&s.uri("victim"), &file("before"));
        let d = std::fs::read(file("d12")).unwrap();
        let header = 12 + 7 + 7 + 9;
        let mut cases: Vec<(&str, Vec<u8>, String)> = vec![
            (
                "truncated",
                d[..d.len() - 5000].to_vec(),
                "truncated".into(),
            ),
            ("no end", d[..d.len() - 1].to_vec(), "no 'e' record".into()),
        ];
        let mut bad_tag = d.clone();
        bad_tag[header] = b'q';
        cases.push((
            "bad tag",
            bad_tag,
            format!("/bad at {header}: unknown record tag"),
        ));
        // Swap the first two records' offsets: out of order.
        let mut order = d.clone();
        let second = header
            + 17
            + u64::from_le_bytes(d[header + 9..header + 17].try_into().unwrap()) as usize;
        order[second + 1..second + 9].copy_from_slice(&0u64.to_le_bytes());
        cases.push((
            "out of order",
            order,
            format!("/bad at {second}: records out of order"),
        ));
        for (what, bytes, want) in &cases {
            std::fs::write(file("bad"), bytes).unwrap();
            let e = s.fails(&["import-diff", &p("bad"), "victim"]);
            assert!(e.contains(want.as_str()), "{kind:?} {what}: {e}");
            assert!(
                same(&s.uri("victim"), &p("before")),
                "{kind:?} {what}: the disk changed"
            );
            let snaps = s.json(&["snapshot", "list", "victim"]);
            assert_eq!(snaps.as_array().unwrap().len(), 1, "{what}: {snaps}");
        }
    });
}

/// Every run `nbdinfo --map=CONTEXT` prints for `uri`: (offset, length,
/// value), neighbours of one value merged.
fn nbdinfo_map(uri: &str, context: &str) -> Vec<(u64, u64, u32)> {
    let out = run_ok("nbdinfo", &[&format!("--map={context}"), uri]);
    let mut runs: Vec<(u64, u64, u32)> = Vec::new();
    for l in out.lines() {
        let f: Vec<&str> = l.split_whitespace().collect();
        let (Some(o), Some(n), Some(v)) = (f.first(), f.get(1), f.get(2)) else {
            continue;
        };
        let (o, n, v): (u64, u64, u32) =
            (o.parse().unwrap(), n.parse().unwrap(), v.parse().unwrap());
        match runs.last_mut() {
            Some(last) if last.2 == v && last.0 + last.1 == o => last.1 += n,
            _ => runs.push((o, n, v)),
        }
    }
    runs
}

#[test]
fn allocation_depth_is_what_qemu_reports_for_the_same_layers() {
    for tool in ["nbdinfo", "qemu-io", "qemu-img", "qemu-nbd"] {
        if !have(tool) {
            return;
        }
    }
    // Three layers: A, then B (overwriting part of A), then C (over part
    // of B), each 64 KiB-aligned (a qcow2 cluster); the same history as
    // a qcow2 chain exported by qemu-nbd --allocation-depth.
    let layers: [&[&str]; 3] = [
        &["write -P 0x11 0 2M", "write -P 0x12 8M 1M"],
        &["write -P 0x21 1M 2M", "write -P 0x22 12M 64k"],
        &["write -P 0x31 2M 512k", "write -P 0x32 8M 64k"],
    ];
    let img = tempfile::tempdir().unwrap();
    let qcow = |i: usize| img.path().join(format!("l{i}.qcow2"));
    for (i, cmds) in layers.iter().enumerate() {
        let mut args = vec!["create", "-q", "-f", "qcow2"];
        let backing;
        if i > 0 {
            backing = qcow(i - 1).display().to_string();
            args.extend(["-b", &backing, "-F", "qcow2"]);
        }
        let me = qcow(i).display().to_string();
        args.extend([me.as_str(), "16M"]);
        run_ok("qemu-img", &args);
        let mut io_args = vec!["-f", "qcow2"];
        for c in cmds.iter() {
            io_args.extend(["-c", c]);
        }
        io_args.push(&me);
        run_ok("qemu-io", &io_args);
    }
    let qsock = img.path().join("q.sock");
    let mut qnbd = std::process::Command::new("qemu-nbd")
        .args(["-A", "-r", "-f", "qcow2", "-k"])
        .arg(&qsock)
        .arg(qcow(2))
        .spawn()
        .unwrap();
    wait_for(&qsock);
    let qemu = nbdinfo_map(
        &format!("nbd+unix:///?socket={}", qsock.display()),
        "qemu:allocation-depth",
    );
    let _ = qnbd.kill();
    let _ = qnbd.wait();
    assert_eq!(
        qemu.iter().map(|r| r.2).max(),
        Some(3),
        "qemu-nbd reports three layers: {qemu:?}"
    );

    each_kind(|kind| {
        let s = Store::of(kind);
        s.ok(&["create", "vm", "--size", "16M"]);
        let _srv = s.serve();
        for (i, cmds) in layers.iter().enumerate() {
            let mut c = cmds.to_vec();
            c.push("flush");
            io(&s.uri("vm"), &c);
            if i < 2 {
                s.ok(&["snapshot", "create", "vm", &format!("s{}", i + 1)]);
            }
        }
        // nbdinfo lists the context; the head maps as qemu's top layer.
        assert!(run_ok("nbdinfo", &[&s.uri("vm")]).contains("qemu:allocation-depth"));
        assert_eq!(
            nbdinfo_map(&s.uri("vm"), "qemu:allocation-depth"),
            qemu,
            "{kind:?}: the head"
        );
        // A snapshot is one layer less deep: s2 is qemu's middle image.
        let s2 = nbdinfo_map(&s.uri("vm@s2"), "qemu:allocation-depth");
        assert!(s2.iter().all(|r| r.2 <= 2), "{kind:?}: {s2:?}");
        assert_eq!(
            s2.iter().filter(|r| r.2 > 0).map(|r| r.1).sum::<u64>(),
            3 * MIB + 1024 * 1024 + 64 * 1024,
            "{kind:?}: s2 maps A and B: {s2:?}"
        );
        // A linked clone of s2 continues its origin's ancestry: what it
        // writes is layer 1, s2's own layer 2, s1's layer 3.
        s.ok(&["clone", "vm@s2", "c"]);
        io(
            &s.uri("c"),
            &["write -P 0x41 2M 512k", "write -P 0x42 8M 64k", "flush"],
        );
        assert_eq!(
            nbdinfo_map(&s.uri("c"), "qemu:allocation-depth"),
            qemu,
            "{kind:?}: the clone"
        );
    });
}

/// An rbd diff v1 stream of a `size`-byte image: `data` as one `w`
/// record at 0, a `z` record after it, and the end.
fn rbd_diff_v1(size: u64, data: &[u8]) -> Vec<u8> {
    let mut b = b"rbd diff v1\n".to_vec();
    b.push(b's');
    b.extend_from_slice(&size.to_le_bytes());
    b.push(b'w');
    b.extend_from_slice(&0u64.to_le_bytes());
    b.extend_from_slice(&(data.len() as u64).to_le_bytes());
    b.extend_from_slice(data);
    b.push(b'z');
    b.extend_from_slice(&(2 * MIB).to_le_bytes());
    b.extend_from_slice(&MIB.to_le_bytes());
    b.push(b'e');
    b
}

/// Jobs that ended well read 100 %, their done equal to their total, in
/// `jobs --json` and in the table: an import-diff (whose progress counts
/// the stream's bytes), and an export-diff of a disk with no data (no
/// progress at all).
#[test]
fn finished_diff_jobs_read_100_percent() {
    let s = Store::new();
    let dir = tempfile::tempdir().unwrap();
    let stream = dir.path().join("d");
    std::fs::write(&stream, rbd_diff_v1(8 * MIB, &vec![0x5a; MIB as usize])).unwrap();
    s.ok(&["create", "vm", "--size", "8M"]);
    s.ok(&["create", "empty", "--size", "8M"]);
    let _srv = s.serve();
    let r = s.json(&["import-diff", stream.to_str().unwrap(), "vm"]);
    assert_eq!(r["data_bytes"], MIB, "{r}");
    let out = dir.path().join("e");
    s.ok(&["export-diff", "empty", out.to_str().unwrap()]);
    let jobs = s.json(&["jobs"]);
    let jobs = jobs.as_array().unwrap();
    assert_eq!(jobs.len(), 2, "{jobs:?}");
    for j in jobs {
        assert_eq!(j["state"], "done", "{j}");
        assert_eq!(j["percent"], 100, "{j}");
        assert_eq!(j["done"], j["total"], "{j}");
    }
    let table = s.ok(&["jobs"]);
    for what in ["import-diff", "export-diff"] {
        let line = table.lines().find(|l| l.contains(what)).unwrap();
        assert!(line.contains(" 100%"), "{table}");
    }
}

/// export-diff never replaces a file (`rbd export-diff` refuses an
/// existing one too): the refusal names it and its bytes stay. A device
/// is written to, and stays (`/dev/null` here; the CLI's pipe for `-` is
/// the same case).
#[test]
fn export_diff_refuses_an_existing_file_and_writes_to_a_device() {
    let s = Store::new();
    s.ok(&["create", "vm", "--size", "8M"]);
    let dir = tempfile::tempdir().unwrap();
    let old = dir.path().join("old.diff");
    std::fs::write(&old, b"last night's").unwrap();
    let e = s.fails(&["export-diff", "vm", old.to_str().unwrap()]);
    assert!(
        e.contains("old.diff already exists") && e.contains("does not overwrite"),
        "{e}"
    );
    assert_eq!(std::fs::read(&old).unwrap(), b"last night's");
    let r = s.json(&["export-diff", "vm", "/dev/null"]);
    assert_eq!(r["file"], "/dev/null", "{r}");
    use std::os::unix::fs::FileTypeExt;
    let t = std::fs::metadata("/dev/null").unwrap().file_type();
    assert!(t.is_char_device(), "/dev/null is still the device");
}
