//! The metadata log file: appending batches and reading them back for replay.

use std::sync::Arc;

use strata_format::{
    batch_checksum_ok, batch_span, decode_batch_header, encode_batch, Record, BATCH_HEADER_BYTES,
};
use strata_storage::Storage;

use crate::error::{Error, ErrorKind, Result};

pub struct Journal {
    file: Arc<dyn Storage>,
    pub generation: u64,
    sequence: u64,
    /// Where the next batch goes; also the log's length in this generation.
    pub offset: u64,
}

impl Journal {
    pub fn new(file: Arc<dyn Storage>, generation: u64) -> Self {
        Journal {
            file,
            generation,
            sequence: 0,
            offset: 0,
        }
    }

    pub fn append(&mut self, payload: &[u8]) -> Result<()> {
        let b = encode_batch(self.generation, self.sequence, payload);
        self.file.write_at(&b, self.offset)?;
        self.offset += b.len() as u64;
        self.sequence += 1;
        Ok(())
    }

    pub fn sync(&self) -> Result<()> {
        Ok(self.file.sync()?)
    }

    /// Start the log over for a new generation (after a checkpoint).
    pub fn reset(&mut self, generation: u64) {
        self.generation = generation;
        self.sequence = 0;
        self.offset = 0;
    }

    /// Read every valid batch of `generation` from the start of the log, in
    /// order, and position the journal after the last one.
    pub fn read_all(&mut self) -> Result<Vec<Vec<Record>>> {
        let mut out = Vec::new();
        let len = self.file.len()?;
        let mut offset = 0u64;
        let mut header = vec![0u8; BATCH_HEADER_BYTES];
        loop {
            if offset + BATCH_HEADER_BYTES as u64 > len {
                break;
            }
            self.file.read_at(&mut header, offset)?;
            let Some(h) = decode_batch_header(&header) else {
                break;
            };
            if h.generation != self.generation || h.sequence != out.len() as u64 {
                break;
            }
            let used = BATCH_HEADER_BYTES as u64 + h.payload_bytes as u64;
            if offset + used > len {
                break; // torn at the end
            }
            let mut b = vec![0u8; used as usize];
            self.file.read_at(&mut b, offset)?;
            if !batch_checksum_ok(&b) {
                break;
            }
            let recs = Record::decode_all(&b[BATCH_HEADER_BYTES..]).map_err(|e| {
                Error::new(
                    ErrorKind::Corrupt,
                    format!(
                        "log batch {} at byte {offset} has a valid checksum but bad records: {e}",
                        h.sequence
                    ),
                )
            })?;
            out.push(recs);
            offset += batch_span(h.payload_bytes);
        }
        self.sequence = out.len() as u64;
        self.offset = offset;
        Ok(out)
    }
}
