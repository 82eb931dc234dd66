//! A passphrase typed at the terminal: read from `/dev/tty` with echo off,
//! one line, straight into locked memory (byte by byte through `read(2)`,
//! so no buffered copy is left behind); the newline that ends it is not
//! part of it.

use std::fs::File;
use std::io::{Read, Write};
use std::os::unix::io::AsRawFd;

use zeroize::Zeroize;

use crate::{CryptError, Result, SecretBytes};

use super::{check_size, MAX_SECRET_BYTES};

/// The terminal with echo turned off until this is dropped (also on an
/// error or a panic), then restored as it was.
struct NoEcho<'a> {
    tty: &'a File,
    saved: libc::termios,
}

impl<'a> NoEcho<'a> {
    fn new(tty: &'a File) -> Result<NoEcho<'a>> {
        let fd = tty.as_raw_fd();
        // SAFETY: a zeroed termios is a valid value to be overwritten.
        let mut saved: libc::termios = unsafe { std::mem::zeroed() };
        // SAFETY: fd is an open terminal; saved is valid for writes.
        if unsafe { libc::tcgetattr(fd, &mut saved) } != 0 {
            let e = std::io::Error::last_os_error();
            return Err(CryptError::Io(format!("the terminal: {e}")));
        }
        let mut quiet = saved;
        quiet.c_lflag &= !(libc::ECHO | libc::ECHONL);
        quiet.c_lflag |= libc::ICANON;
        // SAFETY: as above; quiet is a valid termios.
        if unsafe { libc::tcsetattr(fd, libc::TCSANOW, &quiet) } != 0 {
            let e = std::io::Error::last_os_error();
            return Err(CryptError::Io(format!(
                "turning the terminal's echo off: {e}"
            )));
        }
        Ok(NoEcho { tty, saved })
    }
}

impl Drop for NoEcho<'_> {
    fn drop(&mut self) {
        // SAFETY: restores the attributes read from the same terminal.
        unsafe { libc::tcsetattr(self.tty.as_raw_fd(), libc::TCSANOW, &self.saved) };
    }
}

/// One line from `tty` (echo off), without its newline.
fn read_line(mut tty: &File, prompt: &str) -> Result<SecretBytes> {
    let io = |e: std::io::Error| CryptError::Io(format!("the terminal: {e}"));
    tty.write_all(prompt.as_bytes()).map_err(io)?;
    let mut scratch = SecretBytes::zeroed(MAX_SECRET_BYTES + 1)?;
    let len = {
        let _quiet = NoEcho::new(tty)?;
        let buf = scratch.expose_mut();
        let mut len = 0;
        let mut byte = [0u8; 1];
        let r = loop {
            match tty.read(&mut byte) {
                Ok(0) => break Ok(()),
                Ok(_) if byte[0] == b'\n' => break Ok(()),
                Ok(_) if len < buf.len() => {
                    buf[len] = byte[0];
                    len += 1;
                }
                Ok(_) => {}
                Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
                Err(e) => break Err(io(e)),
            }
        };
        byte.zeroize();
        r?;
        len
    };
    // The newline typed was not echoed.
    tty.write_all(b"\n").map_err(io)?;
    let exposed = scratch.expose();
    let len = if len > 0 && exposed[len - 1] == b'\r' {
        len - 1
    } else {
        len
    };
    check_size("the passphrase", len)?;
    SecretBytes::from_slice(&exposed[..len])
}

/// Ask for a passphrase on the controlling terminal; with `confirm`, ask
/// twice and refuse two different answers.
pub(super) fn read_prompt(label: &str, confirm: bool) -> Result<SecretBytes> {
    let tty = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open("/dev/tty")
        .map_err(|e| {
            CryptError::Invalid(format!(
                "a passphrase prompt needs a terminal (/dev/tty: {e}); give the secret with \
                 a key file, the kernel keyring or a helper instead"
            ))
        })?;
    let first = read_line(&tty, &format!("{label}: "))?;
    if confirm {
        let again = read_line(&tty, &format!("{label} (again): "))?;
        if again.expose() != first.expose() {
            return Err(CryptError::Invalid("the two passphrases differ".into()));
        }
    }
    Ok(first)
}
