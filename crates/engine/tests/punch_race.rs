//! Freed grains go back to the file system (a hole punch) before they can be
//! allocated again. If they were allocatable first, a write landing while
//! the committer is still punching could take one of them, and the punch
//! would then zero that write's data.
//!
//! The pool's storage here runs a hook inside its first armed punch: another
//! thread writes new data and flushes, while the committer is still in the
//! punch. Afterwards the new data must read back.
#![allow(clippy::too_many_lines, clippy::too_many_arguments)] // test code is outside the ratchet (crates/tidy)

use std::io;
use std::sync::Arc;
use std::time::Duration;

use parking_lot::Mutex;
use strata_block::BlockDevice;
use strata_engine::{Datastore, InitOptions, OpenOptions, Provisioning};
use strata_storage::{Backend, SimBackend, Storage};

type Hook = Box<dyn FnOnce() + Send>;

/// A backend whose pool file runs `hook` (once) at the start of a punch.
struct HookBackend {
    inner: SimBackend,
    hook: Arc<Mutex<Option<Hook>>>,
}

struct HookStorage {
    inner: Arc<dyn Storage>,
    hook: Arc<Mutex<Option<Hook>>>,
}

impl Storage for HookStorage {
    fn read_at(&self, buf: &mut [u8], offset: u64) -> io::Result<()> {
        self.inner.read_at(buf, offset)
    }
    fn write_at(&self, buf: &[u8], offset: u64) -> io::Result<()> {
        self.inner.write_at(buf, offset)
    }
    fn sync(&self) -> io::Result<()> {
        self.inner.sync()
    }
    fn len(&self) -> io::Result<u64> {
        self.inner.len()
    }
    fn punch_hole(&self, offset: u64, len: u64) -> io::Result<()> {
        let hook = self.hook.lock().take();
        if let Some(hook) = hook {
            hook();
        }
        self.inner.punch_hole(offset, len)
    }
    fn set_len(&self, len: u64) -> io::Result<()> {
        self.inner.set_len(len)
    }
}

impl Backend for HookBackend {
    fn open(&self, name: &str, create: bool) -> io::Result<Arc<dyn Storage>> {
        let inner = self.inner.open(name, create)?;
        if name != strata_format::FILE_POOL {
            return Ok(inner);
        }
        Ok(Arc::new(HookStorage {
            inner,
            hook: self.hook.clone(),
        }))
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

#[test]
fn a_write_during_the_punch_of_freed_grains_keeps_its_data() {
    let sim = SimBackend::new();
    Datastore::init(Arc::new(sim.clone()), &InitOptions::default()).unwrap();
    let hook: Arc<Mutex<Option<Hook>>> = Arc::new(Mutex::new(None));
    let backend = HookBackend {
        inner: sim,
        hook: hook.clone(),
    };
    let ds = Arc::new(
        Datastore::open(
            Arc::new(backend) as Arc<dyn Backend>,
            &OpenOptions::default(),
            None,
        )
        .unwrap(),
    );
    ds.create_disk("d", 16 << 20, Provisioning::Thin, &mut |_, _| {})
        .unwrap();
    let disk = ds.open_disk("d").unwrap();

    // 4 MiB (four whole allocation blocks) of data, durable, then unmapped:
    // its grains are freed by the next commit, and they are the lowest free
    // blocks, where the allocator goes first.
    let old = vec![0xAAu8; 4 << 20];
    disk.write_at(&old, 0, false).unwrap();
    disk.flush().unwrap();
    disk.unmap(0, 4 << 20).unwrap();

    // While that commit punches, another thread writes 4 MiB elsewhere and
    // flushes. Neither needs anything the punching committer holds: a
    // client's flush does not wait for the punch. (If it did, the hook gives
    // up after 10 s and the test fails.)
    let new = vec![0x5Bu8; 4 << 20];
    let (done_tx, done_rx) = std::sync::mpsc::channel();
    {
        let disk = ds.open_disk("d").unwrap();
        let new = new.clone();
        *hook.lock() = Some(Box::new(move || {
            std::thread::spawn(move || {
                let r = disk
                    .write_at(&new, 8 << 20, false)
                    .and_then(|()| disk.flush());
                let _ = done_tx.send(r.is_ok());
            });
            let ok = done_rx.recv_timeout(Duration::from_secs(10));
            assert_eq!(
                ok,
                Ok(true),
                "the write and flush did not finish while the punch waited"
            );
        }));
    }
    disk.flush().unwrap();
    assert!(hook.lock().is_none(), "the commit punched nothing");

    let mut back = vec![0u8; 4 << 20];
    disk.read_at(&mut back, 8 << 20).unwrap();
    let lost = back
        .chunks(4096)
        .filter(|g| g.iter().any(|&b| b != 0x5B))
        .count();
    assert_eq!(lost, 0, "{lost} grains of the concurrent write were lost");
    let mut head = vec![1u8; 4 << 20];
    disk.read_at(&mut head, 0).unwrap();
    assert!(
        head.iter().all(|&b| b == 0),
        "the unmapped range reads zeros"
    );
}
