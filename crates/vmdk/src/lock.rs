//! Locks on the files of an open chain, QEMU's behaviour: a chain opened
//! for writing takes an exclusive lock on every file of its top link (the
//! descriptor and the extents it writes); every other file it opens, and
//! every file of a chain opened read-only, takes a shared lock. So one
//! writer excludes every other opener of its top, and any number of
//! readers, or children, can share a base. The locks are advisory
//! ([`strata_storage::Storage::try_lock`]: OFD locks on QEMU's lock bytes,
//! so QEMU and strata refuse each other too); the kernel drops them when
//! the files close, also on SIGKILL.
//!
//! [`LockingBackend`] wraps the backend a chain opens its files through, so
//! the chain code needs no lock calls of its own.

use std::io;
use std::sync::Arc;

use strata_storage::{Backend, LockMode, Storage};

/// Opens through `inner`, then locks: exclusive for a writable open
/// ([`Backend::open`]), shared for a read-only one. A conflict is an
/// [`io::ErrorKind::WouldBlock`] error.
pub struct LockingBackend {
    inner: Arc<dyn Backend>,
}

impl LockingBackend {
    pub fn new(inner: Arc<dyn Backend>) -> Self {
        Self { inner }
    }
}

/// Lock `f`, trying again for a moment on a conflict: a conflicting lock
/// can be a transient copy of a description this process has just closed,
/// held by a child another thread is starting (fork copies every
/// descriptor; the child drops it at exec, close-on-exec), and that must
/// not make an open fail. A real holder still fails after ~100 ms.
fn locked(f: Arc<dyn Storage>, mode: LockMode) -> io::Result<Arc<dyn Storage>> {
    let mut tries = 0;
    loop {
        match f.try_lock(mode) {
            Ok(()) => return Ok(f),
            Err(e) if e.kind() == io::ErrorKind::WouldBlock && tries < 5 => {
                tries += 1;
                std::thread::sleep(std::time::Duration::from_millis(20));
            }
            Err(e) => return Err(e),
        }
    }
}

impl Backend for LockingBackend {
    fn open(&self, name: &str, create: bool) -> io::Result<Arc<dyn Storage>> {
        locked(self.inner.open(name, create)?, LockMode::Exclusive)
    }

    fn open_read_only(&self, name: &str) -> io::Result<Arc<dyn Storage>> {
        locked(self.inner.open_read_only(name)?, LockMode::Shared)
    }

    fn exists(&self, name: &str) -> bool {
        self.inner.exists(name)
    }

    fn remove(&self, name: &str) -> io::Result<()> {
        self.inner.remove(name)
    }

    fn rename(&self, from: &str, to: &str) -> io::Result<()> {
        self.inner.rename(from, to)
    }

    fn describe(&self) -> String {
        self.inner.describe()
    }

    fn free_bytes(&self) -> Option<u64> {
        self.inner.free_bytes()
    }
}
