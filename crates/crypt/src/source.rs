//! Where a user secret comes from: a file, the Linux kernel keyring, a
//! helper command, or a passphrase typed at the terminal.
//!
//! Every source reads straight into locked memory ([`SecretBytes`]): files
//! and pipes through unbuffered `read` calls, keys through `KEYCTL_READ`,
//! so no copy of the secret is left in ordinary heap buffers. A secret is
//! taken byte for byte (no newline is stripped, but for the one that ends
//! a typed passphrase) and must hold 1 to [`MAX_SECRET_BYTES`] bytes.

use std::ffi::CString;
use std::io::{ErrorKind, Read};
use std::os::unix::fs::PermissionsExt;
use std::path::PathBuf;
use std::process::{Command, Stdio};

use crate::{CryptError, Result, SecretBytes};

/// The largest secret a source may supply: 64 KiB.
pub const MAX_SECRET_BYTES: usize = 64 * 1024;

const KEYCTL_READ: libc::c_long = 11;

/// Where to read a user secret from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum KeySource {
    /// The raw bytes of a file (QEMU's `secret,file=` convention). The file
    /// must not be readable or writable by group or others.
    File(PathBuf),
    /// A `user` key in the kernel keyrings: its description (found with
    /// `request_key`) or its numeric serial.
    Keyring(String),
    /// The standard output of `sh -c COMMAND` (stdin is /dev/null, stderr
    /// is passed through); the command must exit 0.
    Helper(String),
    /// A line typed at the controlling terminal with echo off, its newline
    /// dropped; `label` is the prompt, and `confirm` asks twice (a new
    /// secret).
    Prompt { label: String, confirm: bool },
}

impl KeySource {
    /// "file", "keyring", "helper" or "passphrase" (what a keyslot records as
    /// its source).
    pub fn kind(&self) -> &'static str {
        match self {
            KeySource::File(_) => "file",
            KeySource::Keyring(_) => "keyring",
            KeySource::Helper(_) => "helper",
            KeySource::Prompt { .. } => "passphrase",
        }
    }

    /// Reads the secret.
    pub fn read(&self) -> Result<SecretBytes> {
        match self {
            KeySource::File(path) => read_file(path),
            KeySource::Keyring(key) => read_keyring(key),
            KeySource::Helper(cmd) => read_helper(cmd),
            KeySource::Prompt { label, confirm } => prompt::read_prompt(label, *confirm),
        }
    }
}

/// Reads `r` into locked memory until its end or [`MAX_SECRET_BYTES`] + 1
/// bytes, whichever comes first; returns the buffer and the count.
fn read_raw(r: &mut impl Read, what: &str) -> Result<(SecretBytes, usize)> {
    let mut scratch = SecretBytes::zeroed(MAX_SECRET_BYTES + 1)?;
    let buf = scratch.expose_mut();
    let mut filled = 0;
    while filled < buf.len() {
        match r.read(&mut buf[filled..]) {
            Ok(0) => break,
            Ok(n) => filled += n,
            Err(e) if e.kind() == ErrorKind::Interrupted => continue,
            Err(e) => return Err(CryptError::Io(format!("reading {what}: {e}"))),
        }
    }
    Ok((scratch, filled))
}

/// The first `len` bytes of `scratch` as the secret, after the size check.
fn finish(scratch: &SecretBytes, len: usize, what: &str) -> Result<SecretBytes> {
    check_size(what, len)?;
    SecretBytes::from_slice(&scratch.expose()[..len])
}

fn check_size(what: &str, len: usize) -> Result<()> {
    if len == 0 {
        return Err(CryptError::Invalid(format!("{what} is empty")));
    }
    if len > MAX_SECRET_BYTES {
        return Err(CryptError::Invalid(format!(
            "{what} holds more than {MAX_SECRET_BYTES} bytes; a key is at most 64 KiB"
        )));
    }
    Ok(())
}

fn read_file(path: &std::path::Path) -> Result<SecretBytes> {
    let shown = path.display();
    let what = format!("key file {shown}");
    let mut file =
        std::fs::File::open(path).map_err(|e| CryptError::Io(format!("opening {what}: {e}")))?;
    // Checked on the open file, so the file read is the file checked.
    let meta = file
        .metadata()
        .map_err(|e| CryptError::Io(format!("{what}: {e}")))?;
    let mode = meta.permissions().mode();
    if mode & 0o066 != 0 {
        return Err(CryptError::Invalid(format!(
            "{what} is readable or writable by group or others (mode {:04o}); \
             fix it with: chmod 600 {shown}",
            mode & 0o7777
        )));
    }
    if meta.is_dir() {
        return Err(CryptError::Invalid(format!("{what} is a directory")));
    }
    let (scratch, len) = read_raw(&mut file, &what)?;
    finish(&scratch, len, &what)
}

/// The serial of the key that `key` names: a positive number is a serial
/// as it is; anything else is a `user` key's description.
fn key_serial(key: &str) -> Result<libc::c_long> {
    if let Ok(serial) = key.parse::<i32>() {
        if serial > 0 {
            return Ok(libc::c_long::from(serial));
        }
    }
    let desc = CString::new(key)
        .map_err(|_| CryptError::Invalid(format!("key description {key:?} contains a NUL byte")))?;
    let ty = c"user";
    // SAFETY: two NUL-terminated strings that outlive the call, a null
    // callout and no destination keyring (0): request_key only searches.
    let r = unsafe {
        libc::syscall(
            libc::SYS_request_key,
            ty.as_ptr(),
            desc.as_ptr(),
            std::ptr::null::<libc::c_char>(),
            0 as libc::c_long,
        )
    };
    if r < 0 {
        let e = std::io::Error::last_os_error();
        return Err(CryptError::Io(format!(
            "no user key {key:?} in the kernel keyrings of this process: {e}"
        )));
    }
    Ok(r)
}

fn read_keyring(key: &str) -> Result<SecretBytes> {
    let serial = key_serial(key)?;
    let what = format!("kernel key {key:?}");
    let mut scratch = SecretBytes::zeroed(MAX_SECRET_BYTES + 1)?;
    let buf = scratch.expose_mut();
    // SAFETY: KEYCTL_READ writes at most buf.len() bytes into buf, which is
    // valid for writes for that length.
    let n = unsafe {
        libc::syscall(
            libc::SYS_keyctl,
            KEYCTL_READ,
            serial,
            buf.as_mut_ptr(),
            buf.len(),
        )
    };
    if n < 0 {
        let e = std::io::Error::last_os_error();
        return Err(CryptError::Io(format!("reading {what}: {e}")));
    }
    // KEYCTL_READ returns the key's full length even when that is more
    // than the buffer took.
    let len = usize::try_from(n).unwrap_or(usize::MAX);
    finish(&scratch, len, &what)
}

fn read_helper(cmd: &str) -> Result<SecretBytes> {
    let what = format!("key helper `{cmd}`");
    let mut child = Command::new("sh")
        .arg("-c")
        .arg(cmd)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .spawn()
        .map_err(|e| CryptError::Io(format!("starting {what}: {e}")))?;
    let out_what = format!("the output of {what}");
    let got = match child.stdout.take() {
        Some(mut out) => read_raw(&mut out, &out_what),
        None => Err(CryptError::Io(format!("{what}: no stdout pipe"))),
    };
    // Stopped before the end of the output (too much, or a read error):
    // the helper may still be writing, so it is stopped.
    let cut_short = match &got {
        Ok((_, len)) => *len > MAX_SECRET_BYTES,
        Err(_) => true,
    };
    if cut_short {
        let _ = child.kill();
    }
    let status = child
        .wait()
        .map_err(|e| CryptError::Io(format!("waiting for {what}: {e}")))?;
    let (scratch, len) = got?;
    if !cut_short && !status.success() {
        // The exit status only: the output may be (part of) the secret.
        return Err(CryptError::Io(format!("{what} failed ({status})")));
    }
    finish(&scratch, len, &out_what)
}

mod prompt;
#[cfg(test)]
mod tests;
