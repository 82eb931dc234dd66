//! Online SEsparse shrink: `strata vmdk shrink FILE` on a file that
//! `strata serve --vmdk` serves asks that server to shrink it while NBD
//! clients keep using it (docs/FORMAT.md §9.3, Online shrink; §9.5). Data,
//! zeros and discards are written with qemu-io over NBD; the bytes are
//! compared with a reference copy by qemu-img compare, over NBD while served
//! and on the file after the server stops; qemu-img check and strata's check
//! must be clean, also after a kill -9 of the server in the middle.
#![allow(clippy::too_many_lines, clippy::too_many_arguments)] // test code is outside the ratchet (crates/tidy)

use crate::common;
use common::vmdk::*;
use common::*;

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

const MIB: usize = 1 << 20;

/// A store with a 2-link chain exported from a `size_mib` disk: a flat
/// base and an empty seSparse delta on top. Returns (store, top, top's
/// sesparse extent).
fn chain(size_mib: usize) -> (Store, PathBuf, PathBuf) {
    let s = Store::new();
    let dir = s.dir.path().to_path_buf();
    s.ok(&["create", "d", "--size", &format!("{size_mib}M")]);
    s.ok(&["snapshot", "create", "d", "s1"]);
    s.ok(&[
        "export",
        "d",
        p(&dir.join("vm.vmdk")),
        "--chain",
        "--subformat",
        "seSparse",
    ]);
    let top = dir.join("vm-000001.vmdk");
    let ext = dir.join("vm-000001-sesparse.vmdk");
    assert!(top.exists() && ext.exists());
    (s, top, ext)
}

/// `strata serve --vmdk vm=TOP` without a datastore; returns the server
/// and its NBD URI once its control socket is up.
fn serve(s: &Store, top: &Path) -> (Server, String) {
    let sock = s.dir.path().join("v.sock");
    let _ = std::fs::remove_file(&sock);
    let child = Command::new(strata())
        .env("STRATA_RUNTIME_DIR", runtime(s))
        .args(["--datastore", p(&s.dir.path().join("none")), "serve"])
        .args(["--nbd-unix", p(&sock), "--vmdk"])
        .arg(format!("vm={}", p(top)))
        .stdout(Stdio::null())
        .spawn()
        .unwrap();
    wait_for(&sock);
    wait_for(&PathBuf::from(format!("{}.strata.sock", p(top))));
    (
        Server { child: Some(child) },
        format!("nbd+unix:///vm?socket={}", p(&sock)),
    )
}

/// Write `pat` at [off, off+len) through NBD and into the model.
fn write(uri: &str, model: &mut [u8], pat: u8, off: usize, len: usize) {
    qemu_io_ok(RAW, uri, &[&format!("write -P {pat} {off} {len}")]);
    model[off..off + len].fill(pat);
}

/// qemu-img compare of `target` (format `fmt`) with the raw model.
fn same_bytes(fmt: &str, target: &str, model: &[u8], tmp: &Path) {
    std::fs::write(tmp, model).unwrap();
    run_ok(
        "qemu-img",
        &["compare", "-f", fmt, "-F", "raw", target, p(tmp)],
    );
}

fn checks_clean(s: &Store, top: &Path) {
    let c = run("qemu-img", &["check", "-f", "vmdk", p(top)]);
    assert!(
        c.status.success(),
        "qemu-img check: {}{}",
        String::from_utf8_lossy(&c.stdout),
        String::from_utf8_lossy(&c.stderr)
    );
    let v: serde_json::Value =
        serde_json::from_str(&ok(s, &["vmdk", "check", p(top), "--json"])).unwrap();
    assert_eq!(v["errors"], 0, "{v}");
}

fn len(f: &Path) -> u64 {
    std::fs::metadata(f).unwrap().len()
}

#[test]
fn a_served_sesparse_file_shrinks_online_while_a_client_writes() {
    if !have("qemu-img") || !have("qemu-io") {
        return;
    }
    let (s, top, ext) = chain(64);
    let (srv, uri) = serve(&s, &top);
    let mut model = vec![0u8; 64 * MIB];
    // Data, then space to give back: a discard, WRITE_ZEROES and literal
    // zero data (allocated grains that read all zeros).
    write(&uri, &mut model, 0x11, 0, 24 * MIB);
    write(&uri, &mut model, 0x22, 30 * MIB, 8 * MIB);
    write(&uri, &mut model, 0x00, 40 * MIB, 4 * MIB);
    write(&uri, &mut model, 0x44, 44 * MIB, 2 * MIB);
    qemu_io_ok(
        RAW,
        &uri,
        &[
            &format!("discard 0 {}", 16 * MIB),
            &format!("write -z {} {}", 32 * MIB, 2 * MIB),
            "flush",
        ],
    );
    model[..16 * MIB].fill(0);
    model[32 * MIB..34 * MIB].fill(0);
    same_bytes("raw", &uri, &model, &s.dir.path().join("m0.raw"));
    let before = len(&ext);

    // A client writes while the server shrinks (rate-limited, so the two
    // overlap): into a new 64 KiB range each time, in the discarded range
    // the scan passes first (so the server allocates grains the scan has
    // not seen, at the end of the file: the next ones the shrink moves),
    // and at once again in place with a pattern of its own (so a write
    // lost to a move shows), in place only once all 224 ranges are
    // written, until the shrink is over. Every write must be there.
    let at = |k: usize| 2 * MIB + (k % 224) * 65536;
    let pat = |k: usize| (k % 251) as u8 + 1;
    let done = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let writer = {
        let (uri, done) = (uri.clone(), done.clone());
        std::thread::spawn(move || {
            let mut rounds = 0;
            loop {
                let (o, p) = (at(rounds), pat(rounds));
                let w = [
                    format!("write -P 0xee {o} 65536"),
                    format!("write -P {p} {o} 65536"),
                ];
                qemu_io_ok(RAW, &uri, &[&w[0], &w[1]]);
                rounds += 1;
                if done.load(std::sync::atomic::Ordering::Acquire) {
                    return rounds;
                }
            }
        })
    };
    let out = ok(&s, &["vmdk", "shrink", p(&top), "--rate", "8M", "--json"]);
    done.store(true, std::sync::atomic::Ordering::Release);
    let rounds = writer.join().unwrap();
    eprintln!("the client wrote {rounds} times during the shrink");
    for k in 0..rounds {
        model[at(k)..at(k) + 65536].fill(pat(k));
    }
    let v: serde_json::Value = serde_json::from_str(&out).unwrap();
    let r = &v[0];
    let after = len(&ext);
    assert!(after < before, "{before} -> {after}: {v}");
    // The client's writes grow the file before the shrink begins and
    // after it ends, so the report's figures are compared with each other.
    assert!(r["bytes_before"].as_u64().unwrap() >= before, "{v}");
    assert!(
        r["bytes_after"].as_u64() < r["bytes_before"].as_u64(),
        "{v}"
    );
    assert!(r["zero_grains_found"].as_u64().unwrap() >= 1024, "{v}");
    assert!(r["moved"].as_u64().unwrap() > 0, "{v}");
    // Still served, same bytes (plus the concurrent writes).
    same_bytes("raw", &uri, &model, &s.dir.path().join("m1.raw"));
    // And still writable after the shrink: new grains append after the cut.
    write(&uri, &mut model, 0x55, 60 * MIB, MIB);
    same_bytes("raw", &uri, &model, &s.dir.path().join("m2.raw"));
    srv.stop();
    checks_clean(&s, &top);
    same_bytes("vmdk", p(&top), &model, &s.dir.path().join("m3.raw"));
}

#[test]
fn a_server_killed_mid_shrink_leaves_the_file_consistent() {
    if !have("qemu-img") || !have("qemu-io") {
        return;
    }
    let (s, top, ext) = chain(64);
    let (srv, uri) = serve(&s, &top);
    let mut model = vec![0u8; 64 * MIB];
    // Holes at the bottom, data above: the shrink moves every data grain.
    write(&uri, &mut model, 0x66, 0, 40 * MIB);
    qemu_io_ok(RAW, &uri, &[&format!("discard 0 {}", 28 * MIB), "flush"]);
    model[..28 * MIB].fill(0);
    let before = len(&ext);
    // A slow shrink (12 MiB read by the scan, 3072 grains moved: 36 MiB at
    // 4 MiB/s, so it cannot reach its truncation before about 9 s), killed
    // with its server after 5 s: in the scan or, usually, the moves.
    let shrink = Command::new(strata())
        .env("STRATA_RUNTIME_DIR", runtime(&s))
        .args(["vmdk", "shrink", p(&top), "--rate", "4M"])
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    std::thread::sleep(std::time::Duration::from_secs(5));
    srv.kill9();
    let o = shrink.wait_with_output().unwrap();
    assert!(
        !o.status.success(),
        "the shrink's server was killed, yet it reports success"
    );
    assert_eq!(len(&ext), before, "killed before the truncation");
    // Whatever the shrink had done, the file checks clean and reads the same.
    checks_clean(&s, &top);
    same_bytes("vmdk", p(&top), &model, &s.dir.path().join("k1.raw"));
    // Served again, and finished offline after stopping.
    let (srv, uri) = serve(&s, &top);
    same_bytes("raw", &uri, &model, &s.dir.path().join("k2.raw"));
    srv.stop();
    // Offline now; a rate runs the stepped shrink here.
    ok(&s, &["vmdk", "shrink", "--rate", "1G", p(&top)]);
    assert!(len(&ext) < before, "{before} -> {}", len(&ext));
    checks_clean(&s, &top);
    same_bytes("vmdk", p(&top), &model, &s.dir.path().join("k3.raw"));
}

#[test]
fn a_read_only_server_cannot_shrink_and_says_so() {
    let (s, top, _ext) = chain(8);
    let sock = s.dir.path().join("r.sock");
    let child = Command::new(strata())
        .env("STRATA_RUNTIME_DIR", runtime(&s))
        .args(["--datastore", p(&s.dir.path().join("none")), "serve"])
        .args(["--nbd-unix", p(&sock), "--vmdk-read-only", "--vmdk"])
        .arg(format!("vm={}", p(&top)))
        .stdout(Stdio::null())
        .spawn()
        .unwrap();
    let srv = Server { child: Some(child) };
    wait_for(&sock);
    let o = strata_cmd(&s, &["vmdk", "shrink", p(&top)]);
    assert!(!o.status.success());
    let e = String::from_utf8_lossy(&o.stderr);
    assert!(e.contains("in use") && e.contains("shared lock"), "{e}");
    srv.stop();
}

#[test]
fn a_datastore_server_shrinks_its_vmdk_export_through_its_control_socket() {
    if !have("qemu-img") || !have("qemu-io") {
        return;
    }
    let (s, top, ext) = chain(16);
    // The datastore is served too: the shrink goes to its control.sock.
    let sock = s.sock();
    let _ = std::fs::remove_file(&sock);
    let child = Command::new(strata())
        .env("STRATA_RUNTIME_DIR", runtime(&s))
        .args(["--datastore", p(&s.path()), "serve", "--nbd-unix", p(&sock)])
        .arg("--vmdk")
        .arg(format!("vm={}", p(&top)))
        .stdout(Stdio::null())
        .spawn()
        .unwrap();
    let srv = Server { child: Some(child) };
    wait_for(&sock);
    wait_for(&s.path().join("control.sock"));
    let uri = format!("nbd+unix:///vm?socket={}", p(&sock));
    let mut model = vec![0u8; 16 * MIB];
    write(&uri, &mut model, 0x21, 0, 8 * MIB);
    write(&uri, &mut model, 0x22, 8 * MIB, 4 * MIB);
    qemu_io_ok(RAW, &uri, &[&format!("discard 0 {}", 6 * MIB), "flush"]);
    model[..6 * MIB].fill(0);
    let before = len(&ext);
    let v: serde_json::Value =
        serde_json::from_str(&ok(&s, &["vmdk", "shrink", p(&top), "--json"])).unwrap();
    assert!(len(&ext) < before, "{before} -> {}: {v}", len(&ext));
    same_bytes("raw", &uri, &model, &s.dir.path().join("d1.raw"));
    // The datastore still answers as usual.
    ok(&s, &["--datastore", p(&s.path()), "status"]);
    srv.stop();
    checks_clean(&s, &top);
    same_bytes("vmdk", p(&top), &model, &s.dir.path().join("d2.raw"));
}

/// A server from before online shrink answers `vmdk_shrink` as it answers
/// every request but `status` (a VMDK-only server) or cannot parse it (a
/// datastore server): the CLI says the server cannot shrink online. The
/// old answers are played by a socket put where the server's was.
#[test]
fn a_server_too_old_to_shrink_online_gets_a_clear_error() {
    use std::io::{BufRead, BufReader, Write};
    use std::os::unix::net::UnixListener;
    let (s, top, _ext) = chain(8);
    let (srv, _uri) = serve(&s, &top);
    let ctl = PathBuf::from(format!("{}.strata.sock", p(&top)));
    let old_answers = [
        r#"{"error":{"kind":"refused","message":"this server serves VMDK files only (no datastore); it answers status only"}}"#,
        r#"{"error":{"kind":"invalid_argument","message":"bad control request: unknown variant `vmdk_shrink`, expected one of `status`, `list`"}}"#,
    ];
    for answer in old_answers {
        std::fs::remove_file(&ctl).unwrap();
        let l = UnixListener::bind(&ctl).unwrap();
        let fake = std::thread::spawn(move || {
            let (c, _) = l.accept().unwrap();
            let mut line = String::new();
            BufReader::new(c.try_clone().unwrap())
                .read_line(&mut line)
                .unwrap();
            writeln!(&c, "{answer}").unwrap();
            line
        });
        let o = strata_cmd(&s, &["vmdk", "shrink", p(&top)]);
        let asked = fake.join().unwrap();
        assert!(asked.contains(r#""op":"vmdk_shrink""#), "{asked}");
        assert!(!o.status.success());
        let e = String::from_utf8_lossy(&o.stderr);
        assert!(e.contains("cannot shrink online"), "{e}");
        assert!(e.contains(&format!("pid {}", srv.pid())), "{e}");
    }
    srv.kill9();
}
