//! NBD over TLS (`serve --tls-creds`) against clients nobody here wrote:
//! qemu-img and qemu-io (GnuTLS through QEMU's tls-creds-x509), nbdinfo
//! (libnbd), with credentials openssl makes in QEMU's directory layout.
#![allow(clippy::too_many_lines, clippy::too_many_arguments)] // test code is outside the ratchet (crates/tidy)

use crate::common;
use common::http::free_addr;
use common::tls::Ca;
use common::*;

use std::io::{Read, Write};
use std::path::Path;

fn have_all() -> bool {
    ["openssl", "qemu-img", "qemu-io", "nbdinfo"]
        .iter()
        .all(|t| have(t))
}

/// nbdinfo of export `d` over TLS on `addr`, trusting (and presenting)
/// what `creds` holds.
fn nbdinfo_tls(addr: &str, creds: &Path) -> std::process::Output {
    let port = addr.rsplit(':').next().unwrap();
    run(
        "nbdinfo",
        &[&format!(
            "nbds://localhost:{port}/d?tls-certificates={}",
            creds.display()
        )],
    )
}

/// QEMU's options for export `d` at `server` (`server.type=...` parts)
/// over TLS with the client credentials in `creds`.
fn qemu_tls(creds: &Path, server: &str) -> [String; 4] {
    [
        "--object".into(),
        format!(
            "tls-creds-x509,id=tls0,endpoint=client,dir={}",
            creds.display()
        ),
        "--image-opts".into(),
        format!("driver=nbd,{server},export=d,tls-creds=tls0,tls-hostname=localhost"),
    ]
}

fn tcp_server(addr: &str) -> String {
    let (host, port) = addr.rsplit_once(':').unwrap();
    format!("server.type=inet,server.host={host},server.port={port}")
}

/// `strata_nbd_refused_total{cause}` from the server's `/metrics` at
/// `web`.
fn refused(web: &str, creds: &Path, cause: &str) -> f64 {
    // With --tls-creds the listener speaks HTTPS, with the same certificate.
    let ca = creds.join("ca-cert.pem");
    let (_, metrics) = common::tls::curl(&ca, &format!("https://{web}/metrics"), None, None);
    let key = format!("strata_nbd_refused_total{{cause=\"{cause}\"}} ");
    let line = metrics.lines().find(|l| l.starts_with(&key));
    line.unwrap_or_else(|| panic!("no {key} in /metrics:\n{metrics}"))[key.len()..]
        .parse()
        .unwrap()
}

fn strs(v: &[String]) -> Vec<&str> {
    v.iter().map(|s| s.as_str()).collect()
}

#[test]
fn tls_required_serves_qemu_and_libnbd_and_refuses_plain_clients() {
    if !have_all() {
        return;
    }
    let s = Store::new();
    s.ok(&["create", "d", "--size", "64M"]);
    let ca = Ca::new(s.dir.path(), "ca");
    let srv = ca.creds("srv", Some("server"), "localhost");
    let cli = ca.creds("cli", Some("client"), "backup");
    let rogue = Ca::new(s.dir.path(), "rogue").creds("rogue-cli", None, "x");
    let addr = free_addr();
    let web = free_addr();
    let _srv = s.serve_with(&[
        "--nbd-tcp",
        &addr,
        "--tls-creds",
        srv.to_str().unwrap(),
        "--http",
        &web,
    ]);

    // Random data in through qemu-img (16 requests in flight: replies of
    // several workers share one TLS session), back out over the Unix
    // socket, compared.
    let src = s.dir.path().join("src.raw");
    let mut data = vec![0u8; 48 << 20];
    rand::Rng::fill(&mut rand::thread_rng(), &mut data[..]);
    std::fs::write(&src, &data).unwrap();
    let tcp = qemu_tls(&cli, &tcp_server(&addr));
    let mut args = vec![
        "convert",
        "-n",
        "-m",
        "16",
        "-W",
        "-f",
        "raw",
        src.to_str().unwrap(),
    ];
    args.extend(strs(&tcp[..2]));
    args.extend(["--target-image-opts", &tcp[3]]);
    run_ok("qemu-img", &args);
    let unix = qemu_tls(
        &cli,
        &format!("server.type=unix,server.path={}", s.sock().display()),
    );
    let out = s.dir.path().join("out.raw");
    let mut args = vec!["convert", "-m", "16", "-O", "raw"];
    args.extend(strs(&unix));
    args.push(out.to_str().unwrap());
    run_ok("qemu-img", &args);
    let back = std::fs::read(&out).unwrap();
    assert!(
        back[..data.len()] == data[..],
        "data read back over TLS differs"
    );
    assert!(back[data.len()..].iter().all(|&b| b == 0));

    // qemu-io: a write, a read that checks the pattern, a flush.
    let mut args = strs(&tcp);
    args.extend([
        "-c",
        "write -P 0x5a 1M 64k",
        "-c",
        "read -P 0x5a 1M 64k",
        "-c",
        "flush",
    ]);
    let o = run_ok("qemu-io", &args);
    assert!(o.contains("read 65536/65536"), "{o}");

    // libnbd over TCP.
    let o = nbdinfo_tls(&addr, &cli);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    assert!(String::from_utf8_lossy(&o.stdout).contains("with TLS"));

    // Plain clients are refused, with the reason QEMU prints.
    let o = run("qemu-img", &["info", &format!("nbd://{addr}/d")]);
    assert!(!o.status.success());
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(err.contains("requires TLS"), "{err}");
    let o = run("nbdinfo", &[&format!("nbd://{addr}/d")]);
    assert!(!o.status.success());
    // A client that trusts another CA does not take this server.
    let o = nbdinfo_tls(&addr, &rogue);
    assert!(!o.status.success());
    // EXPORT_NAME in the clear has no error reply: the server hangs up.
    assert!(
        common::nbd::opened(&addr, "d").is_none(),
        "EXPORT_NAME answered"
    );

    // Each refusal is counted by cause, once.
    assert!(refused(&web, &srv, "tls_required") >= 3.0);
    assert_eq!(refused(&web, &srv, "protocol_error"), 0.0);
    assert!(refused(&web, &srv, "tls_handshake") >= 1.0);
    assert_eq!(refused(&web, &srv, "not_granted"), 0.0);
}

#[test]
fn tls_allow_takes_both_and_verify_peer_wants_the_cas_client_certificate() {
    if !have_all() {
        return;
    }
    let s = Store::new();
    s.ok(&["create", "d", "--size", "16M"]);
    let ca = Ca::new(s.dir.path(), "ca");
    let srv = ca.creds("srv", Some("server"), "localhost");
    let cli = ca.creds("cli", Some("client"), "backup");
    let no_cert = ca.creds("nocert", None, "");
    let rogue_ca = Ca::new(s.dir.path(), "rogue");
    let rogue = rogue_ca.creds("rogue-cli", Some("client"), "intruder");
    // The rogue client trusts the server's CA, but its certificate is
    // signed by another.
    std::fs::copy(ca.ca_dir().join("ca-cert.pem"), rogue.join("ca-cert.pem")).unwrap();

    let addr = free_addr();
    let srv_path = srv.to_str().unwrap();
    let server = s.serve_with(&[
        "--nbd-tcp",
        &addr,
        "--tls-creds",
        srv_path,
        "--tls",
        "allow",
    ]);
    let o = run("nbdinfo", &[&format!("nbd://{addr}/d")]);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    assert!(String::from_utf8_lossy(&o.stdout).contains("without TLS"));
    let o = nbdinfo_tls(&addr, &no_cert);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    assert!(String::from_utf8_lossy(&o.stdout).contains("with TLS"));
    server.stop();

    let addr = free_addr();
    let _server = s.serve_with(&[
        "--nbd-tcp",
        &addr,
        "--tls-creds",
        srv_path,
        "--tls-verify-peer",
    ]);
    assert!(nbdinfo_tls(&addr, &cli).status.success());
    assert!(!nbdinfo_tls(&addr, &no_cert).status.success());
    assert!(!nbdinfo_tls(&addr, &rogue).status.success());
    // QEMU without a certificate, too.
    let mut args = vec!["info"];
    let q = qemu_tls(&no_cert, &tcp_server(&addr));
    args.extend(strs(&q));
    assert!(!run("qemu-img", &args).status.success());
}

/// A WRITE's payload sure to come lets the reader sleep until most of
/// it is there (`SO_RCVLOWAT`); a payload that trickles in, with pauses
/// and a last byte sent late, must still be read as it comes, and the
/// next small request answered at once, with TLS and without.
#[test]
fn a_write_payload_that_trickles_in_is_served_over_tls_and_plain() {
    if !have("openssl") || !have("python3") {
        return;
    }
    let s = Store::new();
    s.ok(&["create", "d", "--size", "16M"]);
    let ca = Ca::new(s.dir.path(), "ca");
    let srv = ca.creds("srv", Some("server"), "localhost");
    let addr = free_addr();
    let _server = s.serve_with(&[
        "--nbd-tcp",
        &addr,
        "--tls-creds",
        srv.to_str().unwrap(),
        "--tls",
        "allow",
    ]);
    let (host, port) = addr.rsplit_once(':').unwrap();
    let script = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/scripts/nbd_trickle.py");
    let ca_cert = srv.join("ca-cert.pem");
    for ca_arg in [ca_cert.to_str().unwrap(), "-"] {
        let o = run("python3", &[script, host, port, "d", ca_arg]);
        assert!(
            o.status.success() && String::from_utf8_lossy(&o.stdout).trim() == "ok",
            "trickled writes (CA {ca_arg}): {}{}",
            String::from_utf8_lossy(&o.stdout),
            String::from_utf8_lossy(&o.stderr)
        );
    }
}

#[test]
fn sighup_reloads_the_certificates_for_new_connections() {
    if !have_all() {
        return;
    }
    let s = Store::new();
    s.ok(&["create", "d", "--size", "16M"]);
    let old = Ca::new(s.dir.path(), "old");
    let new = Ca::new(s.dir.path(), "new");
    let srv = old.creds("srv", Some("server"), "localhost");
    let trusts_old = old.creds("cli-old", None, "");
    let trusts_new = new.creds("cli-new", None, "");
    let addr = free_addr();
    let server = s.serve_with(&["--nbd-tcp", &addr, "--tls-creds", srv.to_str().unwrap()]);
    assert!(nbdinfo_tls(&addr, &trusts_old).status.success());
    assert!(!nbdinfo_tls(&addr, &trusts_new).status.success());

    // Renewed by another CA, in place; then SIGHUP.
    let renewed = new.creds("srv-new", Some("server"), "localhost");
    for f in ["server-cert.pem", "server-key.pem", "ca-cert.pem"] {
        std::fs::copy(renewed.join(f), srv.join(f)).unwrap();
    }
    // SAFETY: kill(2) of our own child.
    unsafe { libc::kill(server.pid(), libc::SIGHUP) };
    eventually(
        "the server never took the renewed certificate",
        std::time::Duration::from_secs(10),
        || nbdinfo_tls(&addr, &trusts_new).status.success(),
    );
    assert!(!nbdinfo_tls(&addr, &trusts_old).status.success());

    // Damaged credentials on reload: the server keeps the ones it has.
    std::fs::write(srv.join("server-key.pem"), "not a key").unwrap();
    unsafe { libc::kill(server.pid(), libc::SIGHUP) };
    std::thread::sleep(std::time::Duration::from_millis(500));
    assert!(nbdinfo_tls(&addr, &trusts_new).status.success());
    server.stop();
}

#[test]
fn bad_credentials_are_named_at_start() {
    let s = Store::new();
    let dir = s.dir.path().join("empty");
    std::fs::create_dir(&dir).unwrap();
    let err = s.fails(&[
        "serve",
        "--nbd-unix",
        s.sock().to_str().unwrap(),
        "--tls-creds",
        dir.to_str().unwrap(),
    ]);
    assert!(err.contains("server-cert.pem"), "{err}");
    let err = s.fails(&[
        "serve",
        "--nbd-unix",
        s.sock().to_str().unwrap(),
        "--tls",
        "allow",
    ]);
    assert!(err.contains("--tls-creds"), "{err}");
}

/// How a test key is written: as `openssl genpkey` does (PKCS#8), as
/// `openssl pkey -traditional` rewrites it (PKCS#1 for RSA, SEC1 for EC),
/// or as `openssl ecparam -genkey` writes a P-256 key (SEC1 behind an
/// `EC PARAMETERS` block).
#[derive(Clone, Copy)]
enum KeyForm {
    Pkcs8,
    Traditional,
    EcparamP256,
}

/// A private key openssl makes in `dir` with `genpkey -algorithm
/// ALGORITHM [-pkeyopt OPT]`, written as `form`, checked to be in that
/// form by its PEM label.
fn openssl_key(dir: &Path, algorithm: &str, opt: &str, form: KeyForm) -> Vec<u8> {
    use common::tls::openssl;
    std::fs::create_dir_all(dir).unwrap();
    let mut args = match form {
        KeyForm::EcparamP256 => vec!["ecparam", "-name", "prime256v1", "-genkey"],
        KeyForm::Pkcs8 | KeyForm::Traditional => vec!["genpkey", "-algorithm", algorithm],
    };
    if !opt.is_empty() {
        args.extend(["-pkeyopt", opt]);
    }
    args.extend(["-out", "gen.pem"]);
    openssl(dir, &args);
    if let KeyForm::Traditional = form {
        let args = ["pkey", "-in", "gen.pem", "-traditional", "-out", "key.pem"];
        openssl(dir, &args);
    } else {
        std::fs::rename(dir.join("gen.pem"), dir.join("key.pem")).unwrap();
    }
    let label = match form {
        KeyForm::Pkcs8 => "PRIVATE KEY".to_string(),
        KeyForm::Traditional | KeyForm::EcparamP256 => format!("{algorithm} PRIVATE KEY"),
    };
    let pem = std::fs::read(dir.join("key.pem")).unwrap();
    let text = String::from_utf8_lossy(&pem);
    assert!(text.contains(&format!("-----BEGIN {label}-----")), "{text}");
    pem
}

/// Every kind of key QEMU's x509 credentials load serves NBD over TLS
/// (QEMU and libnbd, both GnuTLS) and HTTPS (curl, OpenSSL): RSA of sizes
/// ring refused (2432, 2560) and those it took, ECDSA on each NIST curve,
/// Ed25519, in each PEM form openssl writes.
#[test]
fn every_key_kind_qemu_loads_serves_nbd_and_https() {
    if !have_all() || !have("curl") {
        return;
    }
    let s = Store::new();
    s.ok(&["create", "d", "--size", "16M"]);
    let ca = Ca::new(s.dir.path(), "ca");
    let cli = ca.creds("cli", None, "");
    use KeyForm::*;
    // (name, genpkey's algorithm and option, form)
    let cases = [
        ("rsa2048-pkcs1", "RSA", "rsa_keygen_bits:2048", Traditional),
        ("rsa2432-pkcs8", "RSA", "rsa_keygen_bits:2432", Pkcs8),
        ("rsa2560-pkcs1", "RSA", "rsa_keygen_bits:2560", Traditional),
        ("rsa4096-pkcs8", "RSA", "rsa_keygen_bits:4096", Pkcs8),
        ("p256-sec1-ecparam", "EC", "", EcparamP256),
        ("p256-pkcs8", "EC", "ec_paramgen_curve:P-256", Pkcs8),
        ("p384-sec1", "EC", "ec_paramgen_curve:P-384", Traditional),
        ("p521-pkcs8", "EC", "ec_paramgen_curve:P-521", Pkcs8),
        ("ed25519-pkcs8", "ED25519", "", Pkcs8),
    ];
    let keys = s.dir.path().join("keys");
    for (i, (name, algorithm, opt, form)) in cases.into_iter().enumerate() {
        let key = openssl_key(&keys.join(name), algorithm, opt, form);
        let srv = ca.server_creds_with_key(name, &key);
        let addr = free_addr();
        let web = free_addr();
        let server = s.serve_with(&[
            "--nbd-tcp",
            &addr,
            "--tls-creds",
            srv.to_str().unwrap(),
            "--http",
            &web,
        ]);
        // QEMU writes a pattern and reads it back; libnbd reads the export.
        let pattern = format!("{}", i + 1);
        let qemu = qemu_tls(&cli, &tcp_server(&addr));
        let mut args = strs(&qemu);
        let write = format!("write -P {pattern} 0 64k");
        let read = format!("read -P {pattern} 0 64k");
        args.extend(["-c", &write, "-c", &read]);
        let o = run("qemu-io", &args);
        let out = String::from_utf8_lossy(&o.stdout);
        assert!(
            o.status.success() && out.contains("read 65536/65536"),
            "{name}: qemu-io: {out}{}",
            String::from_utf8_lossy(&o.stderr)
        );
        let o = nbdinfo_tls(&addr, &cli);
        assert!(
            o.status.success() && String::from_utf8_lossy(&o.stdout).contains("with TLS"),
            "{name}: nbdinfo: {}",
            String::from_utf8_lossy(&o.stderr)
        );
        let url = format!("https://{web}/metrics");
        let (status, _) = common::tls::curl(&srv.join("ca-cert.pem"), &url, None, None);
        assert_eq!(status, 200, "{name}: HTTPS");
        server.stop();
    }
}

/// An X.509 version 1 server certificate (what `openssl x509 -req` makes
/// without extensions: no subjectAltName, the host name in the CN) is
/// served, as qemu-nbd serves it; the client decides whether to trust it,
/// and GnuTLS's do.
#[test]
fn a_version_1_certificate_serves_as_it_does_with_qemu_nbd() {
    if !have_all() {
        return;
    }
    let s = Store::new();
    s.ok(&["create", "d", "--size", "16M"]);
    let ca = Ca::new(s.dir.path(), "ca");
    let cli = ca.creds("cli", None, "");
    let srv = ca.creds("srv", Some("server"), "localhost");
    // Signed again as it was, without the extensions.
    let (ca_cert, ca_key) = (
        ca.ca_dir().join("ca-cert.pem"),
        ca.ca_dir().join("ca-key.pem"),
    );
    let args = [
        "x509",
        "-req",
        "-in",
        "req.csr",
        "-CA",
        ca_cert.to_str().unwrap(),
        "-CAkey",
        ca_key.to_str().unwrap(),
        "-CAcreateserial",
        "-out",
        "server-cert.pem",
        "-days",
        "30",
    ];
    common::tls::openssl(&srv, &args);
    let text = run_ok(
        "openssl",
        &[
            "x509",
            "-noout",
            "-text",
            "-in",
            srv.join("server-cert.pem").to_str().unwrap(),
        ],
    );
    assert!(text.contains("Version: 1 (0x0)"), "{text}");
    let addr = free_addr();
    let _server = s.serve_with(&["--nbd-tcp", &addr, "--tls-creds", srv.to_str().unwrap()]);
    let qemu = qemu_tls(&cli, &tcp_server(&addr));
    let mut args = strs(&qemu);
    args.extend(["-c", "write -P 3 0 64k", "-c", "read -P 3 0 64k"]);
    let o = run_ok("qemu-io", &args);
    assert!(o.contains("read 65536/65536"), "{o}");
    let o = nbdinfo_tls(&addr, &cli);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
}

/// A key that cannot serve is refused at start by its cause, naming the
/// file: too small (with its size), encrypted, not a key at all, or not
/// the certificate's (naming both files and both keys).
#[test]
fn keys_that_cannot_serve_are_refused_by_cause() {
    if !have("openssl") {
        return;
    }
    let s = Store::new();
    let ca = Ca::new(s.dir.path(), "ca");
    let sock = s.sock();
    let serve = |dir: &Path| {
        s.fails(&[
            "serve",
            "--nbd-unix",
            sock.to_str().unwrap(),
            "--tls-creds",
            dir.to_str().unwrap(),
        ])
    };
    let keys = s.dir.path().join("keys");

    let opt = "rsa_keygen_bits:1024";
    let rsa1024 = openssl_key(&keys.join("rsa1024"), "RSA", opt, KeyForm::Traditional);
    let small = ca.server_creds_with_key("small", &rsa1024);
    let err = serve(&small);
    assert!(
        err.contains(small.join("server-key.pem").to_str().unwrap())
            && err.contains("RSA 1024 bits")
            && err.contains("at least 2048 bits"),
        "{err}"
    );

    // Encrypted (as `openssl pkey -aes256` writes it): strata reads keys
    // in the clear, and says so.
    let enc = ca.creds("enc", Some("server"), "localhost");
    std::fs::rename(enc.join("server-key.pem"), enc.join("clear.pem")).unwrap();
    common::tls::openssl(
        &enc,
        &[
            "pkey",
            "-in",
            "clear.pem",
            "-aes256",
            "-passout",
            "pass:secret",
            "-out",
            "server-key.pem",
        ],
    );
    let err = serve(&enc);
    assert!(
        err.contains(enc.join("server-key.pem").to_str().unwrap()) && err.contains("encrypted"),
        "{err}"
    );

    // Not a key at all.
    let garbage = ca.creds("garbage", Some("server"), "localhost");
    std::fs::write(garbage.join("server-key.pem"), "not a key\n").unwrap();
    let err = serve(&garbage);
    assert!(
        err.contains(garbage.join("server-key.pem").to_str().unwrap())
            && err.contains("cannot parse")
            && err.contains("no private key"),
        "{err}"
    );

    // Another server's key: of the same kind, then of another.
    let mine = ca.creds("mine", Some("server"), "localhost");
    let other = ca.creds("other", Some("server"), "localhost");
    std::fs::copy(other.join("server-key.pem"), mine.join("server-key.pem")).unwrap();
    let err = serve(&mine);
    assert!(
        err.contains(mine.join("server-key.pem").to_str().unwrap())
            && err.contains("does not match")
            && err.contains(mine.join("server-cert.pem").to_str().unwrap())
            && err.contains("both are ECDSA P-256"),
        "{err}"
    );
    let ed25519 = openssl_key(&keys.join("ed25519"), "ED25519", "", KeyForm::Pkcs8);
    std::fs::write(mine.join("server-key.pem"), ed25519).unwrap();
    let err = serve(&mine);
    assert!(
        err.contains("does not match")
            && err.contains("the key is Ed25519, the certificate's ECDSA P-256"),
        "{err}"
    );
}

/// Bytes sent right behind STARTTLS, before the server's answer, would be
/// read as if they came over TLS (the STARTTLS injection attack): the
/// server must drop the connection instead of answering.
#[test]
fn bytes_after_starttls_before_its_answer_end_the_connection() {
    if !have("openssl") {
        return;
    }
    let s = Store::new();
    s.ok(&["create", "d", "--size", "16M"]);
    let ca = Ca::new(s.dir.path(), "ca");
    let srv = ca.creds("srv", Some("server"), "localhost");
    let _server = s.serve_with(&["--tls-creds", srv.to_str().unwrap()]);
    let mut c = std::os::unix::net::UnixStream::connect(s.sock()).unwrap();
    c.set_read_timeout(Some(std::time::Duration::from_secs(10)))
        .unwrap();
    let mut hello = [0u8; 18];
    c.read_exact(&mut hello).unwrap();
    let mut msg = 3u32.to_be_bytes().to_vec(); // FIXED_NEWSTYLE | NO_ZEROES
    let option = |opt: u32, data: &[u8]| {
        let mut o = 0x49484156454F5054u64.to_be_bytes().to_vec();
        o.extend_from_slice(&opt.to_be_bytes());
        o.extend_from_slice(&(data.len() as u32).to_be_bytes());
        o.extend_from_slice(data);
        o
    };
    msg.extend(option(5, &[])); // STARTTLS
    msg.extend(option(1, b"d")); // EXPORT_NAME, injected
    c.write_all(&msg).unwrap();
    let mut rest = Vec::new();
    let _ = c.read_to_end(&mut rest);
    assert!(rest.is_empty(), "the server answered: {rest:?}");
}

#[test]
fn nbd_tcp_beyond_loopback_needs_tls_or_insecure() {
    let s = Store::new();
    s.ok(&["create", "d", "--size", "16M"]);
    let port = common::http::free_port();
    let any = format!("0.0.0.0:{port}");
    let sock = s.sock();
    let sock = sock.to_str().unwrap();
    let err = s.fails(&["serve", "--nbd-unix", sock, "--nbd-tcp", &any]);
    assert!(
        err.contains("reachable from other hosts") && err.contains("--insecure"),
        "{err}"
    );
    if have("openssl") {
        let ca = Ca::new(s.dir.path(), "ca");
        let srv = ca.creds("srv", Some("server"), "localhost");
        let srv = srv.to_str().unwrap();
        let err = s.fails(&[
            "serve",
            "--nbd-unix",
            sock,
            "--nbd-tcp",
            &any,
            "--tls-creds",
            srv,
            "--tls",
            "allow",
        ]);
        assert!(err.contains("--tls allow"), "{err}");
        let server = s.serve_with(&["--nbd-tcp", &any, "--tls-creds", srv]);
        server.stop();
    }
    let server = s.serve_with(&["--nbd-tcp", &any, "--insecure"]);
    if have("nbdinfo") {
        run_ok("nbdinfo", &[&format!("nbd://127.0.0.1:{port}/d")]);
    }
    server.stop();
}

#[test]
fn sockets_are_the_server_users_alone_unless_widened() {
    use std::os::unix::fs::PermissionsExt;
    let mode = |p: &Path| std::fs::metadata(p).unwrap().permissions().mode() & 0o777;
    let s = Store::new();
    s.ok(&["create", "d", "--size", "16M"]);
    let server = s.serve();
    assert_eq!(mode(&s.sock()), 0o600);
    assert_eq!(mode(&s.path().join("control.sock")), 0o600);
    server.stop();
    let server = s.serve_with(&["--socket-mode", "0660"]);
    assert_eq!(mode(&s.sock()), 0o660);
    assert_eq!(mode(&s.path().join("control.sock")), 0o600);
    server.stop();
}

#[test]
fn tls_authz_grants_exports_by_certificate_subject() {
    if !have_all() {
        return;
    }
    let s = Store::new();
    s.ok(&["create", "d", "--size", "16M"]);
    s.ok(&["create", "e", "--size", "16M"]);
    s.ok(&["snapshot", "create", "d", "s1"]);
    let ca = Ca::new(s.dir.path(), "ca");
    let srv = ca.creds("srv", Some("server"), "localhost");
    let kvm = ca.creds("kvm", Some("client"), "kvm3");
    let backup = ca.creds("backup", Some("client"), "backup");
    let other = ca.creds("other", Some("client"), "other");
    let rules = s.dir.path().join("authz");
    std::fs::write(
        &rules,
        "# who may open what\nrw d CN=kvm3,O=strata\nro d,d@* CN=backup,O=strata\n",
    )
    .unwrap();
    let addr = free_addr();
    let web = free_addr();
    let port = addr.rsplit(':').next().unwrap().to_string();
    let srv_path = srv.to_str().unwrap();
    let server = s.serve_with(&[
        "--nbd-tcp",
        &addr,
        "--tls-creds",
        srv_path,
        "--tls-authz",
        rules.to_str().unwrap(),
        "--http",
        &web,
    ]);
    let uri = |export: &str, creds: &Path| {
        format!(
            "nbds://localhost:{port}/{export}?tls-certificates={}",
            creds.display()
        )
    };
    let qemu = |creds: &Path, export: &str, args: &[&str]| {
        let q = qemu_tls(creds, &tcp_server(&addr));
        let opts = q[3].replace("export=d,", &format!("export={export},"));
        let mut a: Vec<&str> = vec![&q[0], &q[1], "--image-opts", &opts];
        a.extend(args);
        run("qemu-io", &a)
    };

    // kvm3 writes d; e is neither listed nor opened, and QEMU says why.
    let o = qemu(
        &kvm,
        "d",
        &["-c", "write -P 7 0 64k", "-c", "read -P 7 0 64k"],
    );
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let o = qemu(&kvm, "e", &["-c", "read 0 4k"]);
    assert!(!o.status.success());
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(err.contains("not granted to CN=kvm3,O=strata"), "{err}");
    let listed = run_ok("nbdinfo", &["--list", "--json", &uri("", &kvm)]);
    assert!(
        listed.contains("\"d\"") && !listed.contains("\"e\""),
        "{listed}"
    );

    // backup reads d and its snapshot, read-only.
    let o = run_ok("nbdinfo", &[&uri("d", &backup)]);
    assert!(o.contains("is_read_only: true"), "{o}");
    let o = qemu(&backup, "d", &["-r", "-c", "read -P 7 0 64k"]);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    assert!(run("nbdinfo", &[&uri("d@s1", &backup)]).status.success());
    let o = qemu(&backup, "d", &["-c", "write -P 9 0 4k"]);
    assert!(!o.status.success(), "a read-only grant took a write");
    assert!(!run("nbdinfo", &[&uri("e", &backup)]).status.success());

    // A certificate the CA signed, but no rule names it.
    assert!(!run("nbdinfo", &[&uri("d", &other)]).status.success());
    let listed = run("nbdinfo", &["--list", "--json", &uri("", &other)]);
    assert!(!String::from_utf8_lossy(&listed.stdout).contains("\"d\""));
    // kvm3's data is still what it wrote.
    let o = qemu(&kvm, "d", &["-r", "-c", "read -P 7 0 64k"]);
    assert!(o.status.success());
    assert!(refused(&web, &srv, "not_granted") >= 4.0);
    server.stop();

    // A damaged rules file is named, with its line, at start.
    std::fs::write(&rules, "rw d CN=kvm3\nrx e CN=x\n").unwrap();
    let err = s.fails(&[
        "serve",
        "--nbd-unix",
        s.sock().to_str().unwrap(),
        "--tls-creds",
        srv_path,
        "--tls-authz",
        rules.to_str().unwrap(),
    ]);
    assert!(err.contains("line 2") && err.contains("rx"), "{err}");
}
