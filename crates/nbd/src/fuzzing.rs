//! One client session fed to the real server, for the fuzz target
//! `nbd_session` (fuzz/) and for the replay of its corpus in the normal
//! test suite (`tests/fuzz_corpus.rs`). Not part of the server's API.
//!
//! The bytes are what a client sends: the client flags, options, then
//! requests and write payloads. They go into one end of a socket pair
//! whose other end [`NbdServer::serve_connection`] serves, exactly as an
//! accepted connection, against two in-memory exports (`a`: 1 MiB,
//! read-write; `b`: 64 KiB, read-only, with a dirty-bitmap-like context);
//! everything the server answers is read and dropped. The server must
//! neither panic nor hang: the session ends when the input does.

use std::io::{self, Read, Write};
use std::net::Shutdown;
use std::os::unix::net::UnixStream;
use std::sync::Arc;

use parking_lot::Mutex;
use strata_block::{
    check_range, BlockDevice, BlockError, BlockResult, ErrorKind, Extent, Fill, ReadFill,
    ZeroOptions,
};

use crate::{ExportInfo, ExportProvider, MetaContext, NbdServer, ServerOptions};

const GRAIN: u64 = 4096;

/// Bytes in memory; a block is "data" once written.
struct Mem {
    bytes: Mutex<Vec<u8>>,
    read_only: bool,
}

impl Mem {
    fn new(len: usize, read_only: bool) -> Arc<Mem> {
        Arc::new(Mem {
            bytes: Mutex::new(vec![0; len]),
            read_only,
        })
    }
}

impl BlockDevice for Mem {
    fn size_bytes(&self) -> u64 {
        self.bytes.lock().len() as u64
    }
    fn read_only(&self) -> bool {
        self.read_only
    }
    fn read_at(&self, buf: &mut [u8], offset: u64) -> BlockResult<ReadFill> {
        let b = self.bytes.lock();
        check_range(offset, buf.len() as u64, b.len() as u64)?;
        buf.copy_from_slice(&b[offset as usize..offset as usize + buf.len()]);
        // Every other grain is a hole (zeros, whatever was written), so
        // hole chunks get sent too.
        let mut f = ReadFill::default();
        let mut at = offset;
        while at < offset + buf.len() as u64 {
            let end = ((at / GRAIN + 1) * GRAIN).min(offset + buf.len() as u64);
            let fill = if (at / GRAIN).is_multiple_of(2) {
                Fill::Data
            } else {
                buf[(at - offset) as usize..(end - offset) as usize].fill(0);
                Fill::Zeros
            };
            f.push(end - at, fill);
            at = end;
        }
        Ok(f)
    }
    fn write_at(&self, buf: &[u8], offset: u64, _fua: bool) -> BlockResult<()> {
        if self.read_only {
            return Err(BlockError::new(ErrorKind::ReadOnly, "read-only"));
        }
        let mut b = self.bytes.lock();
        check_range(offset, buf.len() as u64, b.len() as u64)?;
        b[offset as usize..offset as usize + buf.len()].copy_from_slice(buf);
        Ok(())
    }
    fn flush(&self) -> BlockResult<()> {
        Ok(())
    }
    fn unmap(&self, offset: u64, len: u64) -> BlockResult<()> {
        self.write_zeroes(offset, len, ZeroOptions::default())
    }
    fn write_zeroes(&self, offset: u64, len: u64, _: ZeroOptions) -> BlockResult<()> {
        if self.read_only {
            return Err(BlockError::new(ErrorKind::ReadOnly, "read-only"));
        }
        let mut b = self.bytes.lock();
        check_range(offset, len, b.len() as u64)?;
        b[offset as usize..(offset + len) as usize].fill(0);
        Ok(())
    }
    fn block_status(&self, offset: u64, len: u64) -> BlockResult<Vec<Extent>> {
        let size = self.size_bytes();
        check_range(offset, len, size)?;
        let mut out = Vec::new();
        let mut at = offset;
        while at < offset + len {
            let end = ((at / GRAIN + 1) * GRAIN).min(offset + len);
            let hole = (at / GRAIN) % 2 == 1;
            out.push(Extent {
                len_bytes: end - at,
                hole,
                zero: hole,
            });
            at = end;
        }
        Ok(out)
    }
}

/// A context that marks every other 64 KiB as "dirty" (flag 1).
struct Stripes;

impl MetaContext for Stripes {
    fn extents(&self, offset: u64, len: u64) -> io::Result<Vec<(u64, u32)>> {
        let mut out = Vec::new();
        let mut at = offset;
        while at < offset.saturating_add(len) && out.len() < 64 {
            let end = ((at >> 16) + 1) << 16;
            out.push((end - at, ((at >> 16) & 1) as u32));
            at = end;
        }
        Ok(out)
    }
    fn read_next_flags(&self) -> Option<u32> {
        Some(1)
    }
}

struct Exports {
    a: Arc<Mem>,
    b: Arc<Mem>,
}

impl ExportProvider for Exports {
    fn list(&self) -> Vec<ExportInfo> {
        ["a", "b"]
            .iter()
            .map(|n| ExportInfo {
                name: n.to_string(),
                description: format!("fuzz export {n}"),
            })
            .collect()
    }
    fn open(&self, name: &str) -> Result<Arc<dyn BlockDevice>, String> {
        match name {
            "a" => Ok(self.a.clone()),
            "b" => Ok(self.b.clone()),
            _ => Err(format!("no export '{name}'")),
        }
    }
    fn contexts(&self, export: &str) -> Vec<String> {
        match export {
            "b" => vec!["qemu:dirty-bitmap:s1".into()],
            _ => Vec::new(),
        }
    }
    fn context(&self, export: &str, name: &str) -> Option<Arc<dyn MetaContext>> {
        (export == "b" && name == "qemu:dirty-bitmap:s1").then(|| Arc::new(Stripes) as _)
    }
}

/// Serve `input` as one client connection, to its end: the number of
/// bytes the server answered.
pub fn session(input: &[u8]) -> usize {
    // A server that hangs up early makes the writer below write to a
    // closed socket: an error to it, not a SIGPIPE (libFuzzer's main does
    // not ignore the signal as a Rust program's does).
    static IGNORE_SIGPIPE: std::sync::Once = std::sync::Once::new();
    // SAFETY: setting a signal's disposition to SIG_IGN.
    IGNORE_SIGPIPE.call_once(|| unsafe {
        libc::signal(libc::SIGPIPE, libc::SIG_IGN);
    });
    let exports = Arc::new(Exports {
        a: Mem::new(1 << 20, false),
        b: Mem::new(64 << 10, true),
    });
    let opts = ServerOptions {
        max_request_bytes: 256 << 10,
        workers_per_connection: 2,
        max_inflight_requests: 8,
        max_inflight_bytes: 1 << 20,
        read_ahead_bytes: 128 << 10,
        ..ServerOptions::default()
    };
    let server = NbdServer::new(exports, opts);
    let (client, theirs) = UnixStream::pair().expect("socketpair");
    let mut writer = client.try_clone().expect("clone");
    let input = input.to_vec();
    std::thread::scope(|s| {
        let sender = s.spawn(|| {
            // The server may hang up early (a protocol error): fine.
            let _ = writer.write_all(&input);
            let _ = writer.shutdown(Shutdown::Write);
        });
        let reader = s.spawn(|| {
            let mut sink = [0u8; 64 << 10];
            let mut c = &client;
            let mut total = 0;
            while let Ok(n @ 1..) = c.read(&mut sink) {
                total += n;
            }
            total
        });
        let _ = server.serve_connection(theirs);
        // The server's side is closed now: the reader sees end of file.
        let answered = reader.join().unwrap_or(0);
        // Joined explicitly: the end of a scope waits for a thread's
        // closure only, not for the thread to exit, and LeakSanitizer
        // took the thread-local destructor list of one still exiting
        // for a leak.
        let _ = sender.join();
        server.shutdown();
        answered
    })
}
