use std::fs;
use std::os::unix::fs::PermissionsExt;

use super::*;

fn key_file(dir: &tempfile::TempDir, name: &str, bytes: &[u8], mode: u32) -> PathBuf {
    let path = dir.path().join(name);
    fs::write(&path, bytes).unwrap();
    fs::set_permissions(&path, fs::Permissions::from_mode(mode)).unwrap();
    path
}

#[test]
fn file_mode_is_checked() {
    let dir = tempfile::tempdir().unwrap();
    let secret = b"0123456789abcdef0123456789abcdef\n";
    let ok = key_file(&dir, "ok", secret, 0o600);
    let s = KeySource::File(ok).read().unwrap();
    assert_eq!(s.expose(), secret, "read byte for byte, newline kept");
    let ro = key_file(&dir, "ro", secret, 0o400);
    assert_eq!(KeySource::File(ro).read().unwrap().expose(), secret);

    for mode in [0o644, 0o640, 0o604, 0o620, 0o602, 0o666] {
        let p = key_file(&dir, &format!("m{mode:o}"), secret, mode);
        let e = KeySource::File(p.clone()).read().unwrap_err();
        let msg = e.to_string();
        assert!(matches!(e, CryptError::Invalid(_)), "{mode:o}: {msg}");
        assert!(msg.contains(&format!("chmod 600 {}", p.display())), "{msg}");
    }
}

#[test]
fn file_size_limits() {
    let dir = tempfile::tempdir().unwrap();
    let empty = key_file(&dir, "empty", b"", 0o600);
    let e = KeySource::File(empty).read().unwrap_err();
    assert!(
        matches!(e, CryptError::Invalid(ref m) if m.contains("empty")),
        "{e}"
    );

    let max = key_file(&dir, "max", &vec![7u8; MAX_SECRET_BYTES], 0o600);
    assert_eq!(KeySource::File(max).read().unwrap().len(), MAX_SECRET_BYTES);
    let big = key_file(&dir, "big", &vec![7u8; MAX_SECRET_BYTES + 1], 0o600);
    let e = KeySource::File(big).read().unwrap_err();
    assert!(
        matches!(e, CryptError::Invalid(ref m) if m.contains("64 KiB")),
        "{e}"
    );

    let missing = KeySource::File(dir.path().join("absent"))
        .read()
        .unwrap_err();
    assert!(matches!(missing, CryptError::Io(_)), "{missing}");
    fs::set_permissions(dir.path(), fs::Permissions::from_mode(0o700)).unwrap();
    let e = KeySource::File(dir.path().to_path_buf())
        .read()
        .unwrap_err();
    assert!(e.to_string().contains("directory"), "{e}");
}

#[test]
fn helper_output_and_status() {
    let s = KeySource::Helper("printf secret".into()).read().unwrap();
    assert_eq!(s.expose(), b"secret");
    let s = KeySource::Helper("echo secret".into()).read().unwrap();
    assert_eq!(s.expose(), b"secret\n");

    let e = KeySource::Helper("exit 3".into()).read().unwrap_err();
    let msg = e.to_string();
    assert!(matches!(e, CryptError::Io(_)), "{msg}");
    assert!(msg.contains("exit status: 3"), "{msg}");
    // The output of a failed helper is not in the message.
    let e = KeySource::Helper("printf 'x%sy' abc; exit 4".into())
        .read()
        .unwrap_err();
    let msg = e.to_string();
    assert!(
        msg.contains("exit status: 4") && !msg.contains("xabcy"),
        "{msg}"
    );

    let e = KeySource::Helper("true".into()).read().unwrap_err();
    assert!(
        matches!(e, CryptError::Invalid(ref m) if m.contains("empty")),
        "{e}"
    );
}

#[test]
fn helper_output_is_capped() {
    let e = KeySource::Helper("head -c 70000 /dev/zero".into())
        .read()
        .unwrap_err();
    assert!(
        matches!(e, CryptError::Invalid(ref m) if m.contains("64 KiB")),
        "{e}"
    );
    // A helper that never stops writing is stopped.
    let e = KeySource::Helper("yes".into()).read().unwrap_err();
    assert!(
        matches!(e, CryptError::Invalid(ref m) if m.contains("64 KiB")),
        "{e}"
    );
    let s = KeySource::Helper(format!("head -c {MAX_SECRET_BYTES} /dev/zero"))
        .read()
        .unwrap();
    assert_eq!(s.len(), MAX_SECRET_BYTES);
}

#[test]
fn kinds() {
    assert_eq!(KeySource::File("/x".into()).kind(), "file");
    assert_eq!(KeySource::Keyring("k".into()).kind(), "keyring");
    assert_eq!(KeySource::Helper("true".into()).kind(), "helper");
}

const KEY_SPEC_PROCESS_KEYRING: libc::c_long = -2;
const KEYCTL_INVALIDATE: libc::c_long = 21;

/// Adds a `user` key to this process's keyring; `Err` carries errno.
fn add_key(desc: &str, payload: &[u8]) -> std::result::Result<libc::c_long, std::io::Error> {
    let desc = CString::new(desc).unwrap();
    // SAFETY: NUL-terminated type and description, a payload valid for its
    // length; the kernel copies them.
    let r = unsafe {
        libc::syscall(
            libc::SYS_add_key,
            c"user".as_ptr(),
            desc.as_ptr(),
            payload.as_ptr(),
            payload.len(),
            KEY_SPEC_PROCESS_KEYRING,
        )
    };
    if r < 0 {
        return Err(std::io::Error::last_os_error());
    }
    Ok(r)
}

#[test]
fn kernel_keyring() {
    let mut tag = [0u8; 8];
    aws_lc_rs::rand::fill(&mut tag).unwrap();
    let desc = format!("strata-crypt-test:{}", crate::hex::encode(&tag));
    let payload: Vec<u8> = (0..48u8).collect();
    let serial = match add_key(&desc, &payload) {
        Ok(s) => s,
        Err(e)
            if matches!(
                e.raw_os_error(),
                Some(libc::EPERM | libc::ENOSYS | libc::EACCES)
            ) =>
        {
            eprintln!("skipping kernel_keyring: add_key refused here ({e})");
            return;
        }
        Err(e) => panic!("add_key: {e}"),
    };
    let by_desc = KeySource::Keyring(desc.clone()).read().unwrap();
    assert_eq!(by_desc.expose(), &payload[..]);
    let by_serial = KeySource::Keyring(serial.to_string()).read().unwrap();
    assert_eq!(by_serial.expose(), &payload[..]);

    // SAFETY: invalidates the key this test made.
    unsafe { libc::syscall(libc::SYS_keyctl, KEYCTL_INVALIDATE, serial) };
    let e = KeySource::Keyring(format!("{desc}-absent"))
        .read()
        .unwrap_err();
    assert!(
        matches!(e, CryptError::Io(ref m) if m.contains("no user key")),
        "{e}"
    );
    let e = KeySource::Keyring("a\0b".into()).read().unwrap_err();
    assert!(matches!(e, CryptError::Invalid(_)), "{e}");
}
