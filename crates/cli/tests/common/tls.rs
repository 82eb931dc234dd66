//! Test certificates made by openssl: a CA, and server and client
//! credentials it signs, in QEMU's tls-creds-x509 directory layout.

use std::path::{Path, PathBuf};
use std::process::Command;

pub fn openssl(dir: &Path, args: &[&str]) {
    let o = Command::new("openssl")
        .current_dir(dir)
        .args(args)
        .output()
        .unwrap();
    assert!(
        o.status.success(),
        "openssl {args:?}: {}",
        String::from_utf8_lossy(&o.stderr)
    );
}

/// A CA named `ca` in `root/ca` (its key and certificate), and
/// certificates it signs: `root/NAME/{server,client}-{cert,key}.pem` with
/// `ca-cert.pem` beside them, as QEMU's tls-creds-x509 reads a directory.
pub struct Ca {
    root: PathBuf,
    name: String,
}

impl Ca {
    pub fn new(root: &Path, name: &str) -> Ca {
        let dir = root.join(name);
        std::fs::create_dir_all(&dir).unwrap();
        openssl(
            &dir,
            &[
                "req",
                "-x509",
                "-newkey",
                "ec",
                "-pkeyopt",
                "ec_paramgen_curve:P-256",
                "-nodes",
                "-keyout",
                "ca-key.pem",
                "-out",
                "ca-cert.pem",
                "-days",
                "30",
                "-subj",
                &format!("/CN={name}"),
            ],
        );
        Ca {
            root: root.to_path_buf(),
            name: name.to_string(),
        }
    }

    pub fn ca_dir(&self) -> PathBuf {
        self.root.join(&self.name)
    }

    /// A directory holding this CA's certificate and, for `role` "server"
    /// or "client", a certificate and (ECDSA P-256) key it signed for `cn`.
    pub fn creds(&self, dir_name: &str, role: Option<&str>, cn: &str) -> PathBuf {
        let dir = self.dir_with_ca(dir_name);
        let Some(role) = role else { return dir };
        openssl(
            &dir,
            &[
                "genpkey",
                "-algorithm",
                "EC",
                "-pkeyopt",
                "ec_paramgen_curve:P-256",
                "-out",
                &format!("{role}-key.pem"),
            ],
        );
        self.sign(&dir, role, cn);
        dir
    }

    /// Server credentials for `localhost` whose `server-key.pem` is `key`
    /// (PEM, any kind openssl signs a request with), as written.
    pub fn server_creds_with_key(&self, dir_name: &str, key: &[u8]) -> PathBuf {
        let dir = self.dir_with_ca(dir_name);
        std::fs::write(dir.join("server-key.pem"), key).unwrap();
        self.sign(&dir, "server", "localhost");
        dir
    }

    /// `root/DIR_NAME`, holding this CA's certificate.
    fn dir_with_ca(&self, dir_name: &str) -> PathBuf {
        let dir = self.root.join(dir_name);
        std::fs::create_dir_all(&dir).unwrap();
        std::fs::copy(self.ca_dir().join("ca-cert.pem"), dir.join("ca-cert.pem")).unwrap();
        dir
    }

    /// `dir/ROLE-cert.pem`: this CA's certificate for `cn` and the key in
    /// `dir/ROLE-key.pem`.
    fn sign(&self, dir: &Path, role: &str, cn: &str) {
        let ext = if role == "server" {
            "subjectAltName=DNS:localhost,IP:127.0.0.1\nextendedKeyUsage=serverAuth\n"
        } else {
            "extendedKeyUsage=clientAuth\n"
        };
        std::fs::write(dir.join("ext"), format!("basicConstraints=CA:FALSE\n{ext}")).unwrap();
        openssl(
            dir,
            &[
                "req",
                "-new",
                "-key",
                &format!("{role}-key.pem"),
                "-out",
                "req.csr",
                "-subj",
                &format!("/O=strata/CN={cn}"),
            ],
        );
        let ca = self.ca_dir();
        openssl(
            dir,
            &[
                "x509",
                "-req",
                "-in",
                "req.csr",
                "-CA",
                ca.join("ca-cert.pem").to_str().unwrap(),
                "-CAkey",
                ca.join("ca-key.pem").to_str().unwrap(),
                "-CAcreateserial",
                "-out",
                &format!("{role}-cert.pem"),
                "-days",
                "30",
                "-extfile",
                "ext",
            ],
        );
    }
}

/// curl over HTTPS, trusting `ca`: (status, body); status 0 when no HTTP
/// answer came (a TLS failure).
pub fn curl(
    ca: &std::path::Path,
    url: &str,
    token: Option<&str>,
    post: Option<&str>,
) -> (u16, String) {
    let mut args = vec![
        "-s".to_string(),
        "-m".into(),
        "20".into(),
        "--cacert".into(),
        ca.display().to_string(),
        "-w".into(),
        "\n%{http_code}".into(),
    ];
    if let Some(t) = token {
        args.extend(["-H".into(), format!("Authorization: Bearer {t}")]);
    }
    if let Some(body) = post {
        args.extend([
            "-X".into(),
            "POST".into(),
            "-H".into(),
            "Content-Type: application/json".into(),
            "-d".into(),
            body.into(),
        ]);
    }
    args.push(url.into());
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let out = String::from_utf8_lossy(&crate::common::run("curl", &args).stdout).to_string();
    let (body, code) = out.rsplit_once('\n').unwrap_or(("", &out));
    (code.trim().parse().unwrap_or(0), body.to_string())
}
