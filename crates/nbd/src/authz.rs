//! Who may open which export (`serve --tls-authz FILE`): clients are
//! known by the subject of the certificate they presented over TLS,
//! written as RFC 4514 says (`CN=backup1,O=Example Org`: the most specific
//! part first, as `openssl x509 -noout -subject -nameopt RFC2253` prints
//! it).
//!
//! The file: one rule per line, `ACCESS EXPORTS IDENTITY`, where
//! - ACCESS is `rw` (read and write) or `ro` (read only: the export is
//!   offered read-only, and writes are refused);
//! - EXPORTS is a comma-separated list of export names, in which `*`
//!   stands for any run of characters (`*` alone: every export; `vm1@*`:
//!   every snapshot of vm1);
//! - IDENTITY is the rest of the line: a certificate subject, or `*` for
//!   any client whose certificate the CA signed.
//!
//! Blank lines and lines starting with `#` are skipped. For a client and
//! an export the first rule that names both decides; no rule, no access.
//! A client without a certificate (TLS off, or not asked for) has no
//! identity and matches no rule.

use std::fmt;
use std::io;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use strata_block::{
    BlockDevice, BlockError, BlockResult, ErrorKind, Extent, ReadFill, ZeroOptions,
};

/// What a rule grants.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Access {
    ReadOnly,
    ReadWrite,
}

impl fmt::Display for Access {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Access::ReadOnly => "ro",
            Access::ReadWrite => "rw",
        })
    }
}

#[derive(Debug, Clone)]
struct Rule {
    access: Access,
    exports: Vec<String>,
    /// None: any verified client.
    identity: Option<String>,
}

/// The rules of one `--tls-authz` file.
#[derive(Debug, Clone)]
pub struct Authz {
    rules: Vec<Rule>,
    /// Where they came from (for messages).
    pub path: PathBuf,
}

/// Whether `name` matches `pattern`, where `*` matches any run of
/// characters (none included).
fn glob(pattern: &str, name: &str) -> bool {
    let mut parts = pattern.split('*');
    let first = parts.next().unwrap_or("");
    let Some(mut rest) = name.strip_prefix(first) else {
        return false;
    };
    let parts: Vec<&str> = parts.collect();
    let Some((last, middle)) = parts.split_last() else {
        // No `*`: the whole name.
        return rest.is_empty();
    };
    for p in middle {
        match rest.find(p) {
            Some(i) => rest = &rest[i + p.len()..],
            None => return false,
        }
    }
    rest.ends_with(last)
}

impl Authz {
    /// Parse the rules in `text` (from `path`, for messages).
    pub fn parse(text: &str, path: &Path) -> io::Result<Authz> {
        let bad = |n: usize, what: String| {
            io::Error::new(
                io::ErrorKind::InvalidInput,
                format!("{} line {}: {what}", path.display(), n + 1),
            )
        };
        let mut rules = Vec::new();
        for (n, line) in text.lines().enumerate() {
            let line = line.trim();
            if line.is_empty() || line.starts_with('#') {
                continue;
            }
            let mut words = line.splitn(3, char::is_whitespace);
            let access = match words.next() {
                Some("rw") => Access::ReadWrite,
                Some("ro") => Access::ReadOnly,
                Some(w) => return Err(bad(n, format!("access {w:?}: expected rw or ro"))),
                None => continue,
            };
            let exports: Vec<String> = match words.next() {
                Some(e) => e.split(',').map(str::to_string).collect(),
                None => return Err(bad(n, "no exports after the access".into())),
            };
            if exports.iter().any(|e| e.is_empty()) {
                return Err(bad(n, "an empty export name in the list".into()));
            }
            let identity = match words.next().map(str::trim) {
                Some("*") => None,
                Some(i) if !i.is_empty() => Some(i.to_string()),
                _ => {
                    return Err(bad(
                        n,
                        "no identity: expected ACCESS EXPORTS IDENTITY (a certificate subject such as CN=host,O=org, or *)"
                            .into(),
                    ))
                }
            };
            rules.push(Rule {
                access,
                exports,
                identity,
            });
        }
        Ok(Authz {
            rules,
            path: path.to_path_buf(),
        })
    }

    /// Read and parse the file at `path`.
    pub fn load(path: &Path) -> io::Result<Authz> {
        let text = std::fs::read_to_string(path)
            .map_err(|e| io::Error::new(e.kind(), format!("{}: {e}", path.display())))?;
        Authz::parse(&text, path)
    }

    /// What client `who` (its certificate subject, None without one) may
    /// do with `export`: the first rule naming both; None: nothing.
    pub fn access(&self, who: Option<&str>, export: &str) -> Option<Access> {
        let who = who?;
        self.rules
            .iter()
            .find(|r| {
                r.identity.as_deref().is_none_or(|i| i == who)
                    && r.exports.iter().any(|p| glob(p, export))
            })
            .map(|r| r.access)
    }
}

/// An export opened for a client granted only reads: offered read-only
/// (the transmission flags say so, and writes are refused before they
/// reach the device), whatever the device itself allows.
pub(crate) struct ReadOnly(pub Arc<dyn BlockDevice>);

impl BlockDevice for ReadOnly {
    fn size_bytes(&self) -> u64 {
        self.0.size_bytes()
    }
    fn read_only(&self) -> bool {
        true
    }
    fn read_at(&self, buf: &mut [u8], offset_bytes: u64) -> BlockResult<ReadFill> {
        self.0.read_at(buf, offset_bytes)
    }
    fn readv_at(&self, bufs: &mut [&mut [u8]], offset_bytes: u64) -> BlockResult<ReadFill> {
        self.0.readv_at(bufs, offset_bytes)
    }
    fn write_at(&self, _: &[u8], _: u64, _: bool) -> BlockResult<()> {
        Err(refused())
    }
    fn writev_at(&self, _: &[&[u8]], _: u64, _: bool) -> BlockResult<()> {
        Err(refused())
    }
    fn flush(&self) -> BlockResult<()> {
        Ok(())
    }
    fn unmap(&self, _: u64, _: u64) -> BlockResult<()> {
        Err(refused())
    }
    fn write_zeroes(&self, _: u64, _: u64, _: ZeroOptions) -> BlockResult<()> {
        Err(refused())
    }
    fn block_status(&self, offset_bytes: u64, len_bytes: u64) -> BlockResult<Vec<Extent>> {
        self.0.block_status(offset_bytes, len_bytes)
    }
    fn preferred_block_bytes(&self) -> u32 {
        self.0.preferred_block_bytes()
    }
    fn prefetch(&self, offset_bytes: u64, len_bytes: u64) {
        self.0.prefetch(offset_bytes, len_bytes)
    }
    fn plan_read(
        &self,
        buf: &mut [u8],
        offset_bytes: u64,
        wait: bool,
    ) -> Option<BlockResult<strata_block::Planned>> {
        self.0.plan_read(buf, offset_bytes, wait)
    }
}

fn refused() -> BlockError {
    BlockError::new(ErrorKind::ReadOnly, "this client may only read this export")
}

/// The subject of a DER certificate as RFC 4514 writes it, or None if it
/// does not parse.
pub(crate) fn subject(der: &[u8]) -> Option<String> {
    use x509_cert::der::Decode;
    let cert = x509_cert::Certificate::from_der(der).ok()?;
    Some(cert.tbs_certificate.subject.to_string())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn globs() {
        assert!(glob("*", "") && glob("*", "vm1@s"));
        assert!(glob("vm1", "vm1") && !glob("vm1", "vm10") && !glob("vm1", "vm"));
        assert!(glob("vm1@*", "vm1@a") && glob("vm1@*", "vm1@") && !glob("vm1@*", "vm1"));
        assert!(glob("*@nightly", "db@nightly") && !glob("*@nightly", "db@nightly2"));
        assert!(glob("a*b*c", "aXbYc") && glob("a*b*c", "abc") && !glob("a*b*c", "acb"));
    }

    #[test]
    fn the_first_rule_naming_both_decides() {
        let a = Authz::parse(
            "# comment\n\nro vm1@* CN=backup,O=Example Org\nrw vm1,vm2 CN=kvm3,O=Example Org\n\
             rw vm1 CN=backup,O=Example Org\nro * *\n",
            Path::new("authz"),
        )
        .unwrap();
        let backup = Some("CN=backup,O=Example Org");
        let kvm3 = Some("CN=kvm3,O=Example Org");
        assert_eq!(a.access(backup, "vm1@s1"), Some(Access::ReadOnly));
        assert_eq!(a.access(backup, "vm1"), Some(Access::ReadWrite));
        assert_eq!(a.access(kvm3, "vm2"), Some(Access::ReadWrite));
        // The catch-all, for any verified client.
        assert_eq!(a.access(kvm3, "vm3"), Some(Access::ReadOnly));
        assert_eq!(a.access(Some("CN=other"), "vm3"), Some(Access::ReadOnly));
        // No certificate, no identity: nothing.
        assert_eq!(a.access(None, "vm1"), None);
        let strict = Authz::parse("rw vm1 CN=a\n", Path::new("x")).unwrap();
        assert_eq!(strict.access(Some("CN=b"), "vm1"), None);
        assert_eq!(strict.access(Some("CN=a"), "vm2"), None);
    }

    #[test]
    fn bad_lines_are_named() {
        for (text, says) in [
            ("rx vm1 CN=a", "line 1: access \"rx\""),
            ("\nrw", "line 2: no exports"),
            ("rw vm1", "line 1: no identity"),
            ("rw vm1,,vm2 CN=a", "empty export"),
        ] {
            let e = Authz::parse(text, Path::new("f")).unwrap_err().to_string();
            assert!(e.contains(says), "{text:?}: {e}");
        }
    }
}
