//! Serve one raw file over NBD, to measure the transport on its own:
//! `cargo run --release -p strata-nbd --example serve_file -- FILE|null:MIB SOCKET`
//! (`NBD_WORKERS=N` sets the worker threads per connection).
#![allow(clippy::too_many_lines, clippy::too_many_arguments)] // test code is outside the ratchet (crates/tidy)

use std::fs::{File, OpenOptions};
use std::os::unix::fs::FileExt;
use std::os::unix::net::UnixListener;
use std::sync::Arc;

use strata_block::{
    check_range, BlockDevice, BlockError, BlockResult, ErrorKind, Extent, ReadFill, ZeroOptions,
};
use strata_nbd::{ExportInfo, ExportProvider, NbdServer, ServerOptions};

struct RawFile {
    /// `None`: a null device (reads zeros, drops writes).
    f: Option<File>,
    size: u64,
}

fn io(e: std::io::Error) -> BlockError {
    BlockError::new(ErrorKind::Io, e.to_string())
}

impl BlockDevice for RawFile {
    fn size_bytes(&self) -> u64 {
        self.size
    }
    fn read_only(&self) -> bool {
        false
    }
    fn read_at(&self, buf: &mut [u8], off: u64) -> BlockResult<ReadFill> {
        check_range(off, buf.len() as u64, self.size)?;
        match &self.f {
            Some(f) => f.read_exact_at(buf, off).map_err(io)?,
            None => buf.fill(0),
        }
        // Whether the file has holes there is not asked: data is always
        // a correct answer.
        Ok(ReadFill::all_data(buf.len() as u64))
    }
    fn write_at(&self, buf: &[u8], off: u64, fua: bool) -> BlockResult<()> {
        check_range(off, buf.len() as u64, self.size)?;
        if let Some(f) = &self.f {
            f.write_all_at(buf, off).map_err(io)?;
            if fua {
                f.sync_data().map_err(io)?;
            }
        }
        Ok(())
    }
    fn flush(&self) -> BlockResult<()> {
        match &self.f {
            Some(f) => f.sync_data().map_err(io),
            None => Ok(()),
        }
    }
    fn unmap(&self, off: u64, len: u64) -> BlockResult<()> {
        self.write_zeroes(off, len, ZeroOptions::default())
    }
    fn write_zeroes(&self, off: u64, len: u64, o: ZeroOptions) -> BlockResult<()> {
        check_range(off, len, self.size)?;
        if o.fast_only {
            return Err(BlockError::new(ErrorKind::Unsupported, "no fast zero"));
        }
        let Some(f) = &self.f else { return Ok(()) };
        let z = vec![0u8; 1 << 20];
        let mut at = off;
        while at < off + len {
            let n = (off + len - at).min(z.len() as u64);
            f.write_all_at(&z[..n as usize], at).map_err(io)?;
            at += n;
        }
        Ok(())
    }
    fn block_status(&self, off: u64, len: u64) -> BlockResult<Vec<Extent>> {
        check_range(off, len, self.size)?;
        Ok(vec![Extent {
            len_bytes: len,
            hole: false,
            zero: false,
        }])
    }
}

struct One(Arc<RawFile>);

impl ExportProvider for One {
    fn list(&self) -> Vec<ExportInfo> {
        vec![ExportInfo {
            name: "d".into(),
            description: String::new(),
        }]
    }
    fn open(&self, name: &str) -> Result<Arc<dyn BlockDevice>, strata_block::Error> {
        if name == "d" || name.is_empty() {
            Ok(self.0.clone())
        } else {
            Err(strata_block::Error::new(
                strata_block::Kind::NotFound,
                "no such export",
            ))
        }
    }
}

fn main() {
    let args: Vec<String> = std::env::args().collect();
    let (f, size) = match args[1].strip_prefix("null:") {
        Some(mib) => (None, mib.parse::<u64>().expect("null:MIB") << 20),
        None => {
            let f = OpenOptions::new()
                .read(true)
                .write(true)
                .open(&args[1])
                .expect("open file");
            let size = f.metadata().unwrap().len();
            (Some(f), size)
        }
    };
    let mut opts = ServerOptions::default();
    if let Some(w) = std::env::var("NBD_WORKERS")
        .ok()
        .and_then(|w| w.parse().ok())
    {
        opts.workers_per_connection = w;
    }
    let server = NbdServer::new(Arc::new(One(Arc::new(RawFile { f, size }))), opts);
    let _ = std::fs::remove_file(&args[2]);
    server
        .serve_unix(UnixListener::bind(&args[2]).unwrap())
        .unwrap();
    loop {
        std::thread::park();
    }
}
