//! The metadata log files (docs/FORMAT.md §5): appending batches, and
//! reading a generation's batches back for replay.
//!
//! Generation `g`'s log lives in `journal.{g%2}` from byte 0. Reading stops
//! at the first batch that is not the expected one (the torn tail of a
//! commit that never returned), then scans on for a valid batch of the same
//! generation further in: finding one means a batch that had been durable
//! was damaged, which is an error, not a shorter log.

use std::sync::Arc;

use strata_format::{
    batch_checksum_ok, batch_span, decode_batch_header, encode_batch, seal_batch, Record,
    BATCH_ALIGN, BATCH_HEADER_BYTES,
};
use strata_storage::Storage;

use crate::error::{Error, ErrorKind, Result};

/// Bytes read at a time while scanning past a log's end for later batches.
const SCAN_CHUNK_BYTES: u64 = 1 << 20;

/// What one generation's log holds.
pub struct GenerationLog {
    pub batches: Vec<Vec<Record>>,
    /// Where the next batch of this generation would go.
    pub end_offset: u64,
    /// The generation named by the last GENERATION_END record, if the log's
    /// last batch carries one.
    pub ended_for: Option<u64>,
}

/// The two log files, for reading at open and for starting a generation.
pub struct LogFiles {
    files: [Arc<dyn Storage>; 2],
}

/// Appends batches to one generation's log.
pub struct LogWriter {
    file: Arc<dyn Storage>,
    pub generation: u64,
    sequence: u64,
    /// Where the next batch goes; also the log's length in this generation.
    pub offset: u64,
}

fn corrupt(msg: String) -> Error {
    Error::new(ErrorKind::Corrupt, msg)
}

impl LogWriter {
    /// Append one batch (not synced).
    pub fn append(&mut self, payload: &[u8]) -> Result<()> {
        let b = encode_batch(self.generation, self.sequence, payload);
        self.file.write_at(&b, self.offset)?;
        self.offset += b.len() as u64;
        self.sequence += 1;
        Ok(())
    }

    /// Append `buf` as one batch (not synced): `buf` holds room for the
    /// header, then the payload; it is sealed in place (see
    /// `strata_format::seal_batch`) and keeps its capacity for the next.
    pub fn append_sealed(&mut self, buf: &mut Vec<u8>) -> Result<()> {
        seal_batch(buf, self.generation, self.sequence);
        self.file.write_at(buf, self.offset)?;
        self.offset += buf.len() as u64;
        self.sequence += 1;
        Ok(())
    }

    /// Make the log durable.
    pub fn sync(&self) -> Result<()> {
        Ok(self.file.sync()?)
    }

    /// Cut the file after this generation's last batch when more than
    /// `slack` bytes of older generations' batches lie beyond it (only for
    /// a log no commit appends to any more). Returns the bytes cut.
    pub fn trim(&self, slack: u64) -> Result<u64> {
        let len = self.file.len()?;
        if len <= self.offset + slack {
            return Ok(0);
        }
        self.file.set_len(self.offset)?;
        self.file.sync()?;
        Ok(len - self.offset)
    }
}

impl LogFiles {
    pub fn new(files: [Arc<dyn Storage>; 2]) -> Self {
        LogFiles { files }
    }

    fn file(&self, generation: u64) -> &Arc<dyn Storage> {
        &self.files[(generation % 2) as usize]
    }

    /// A writer starting `generation`'s log at byte 0 of its file.
    pub fn start(&self, generation: u64) -> LogWriter {
        LogWriter {
            file: self.file(generation).clone(),
            generation,
            sequence: 0,
            offset: 0,
        }
    }

    /// A writer continuing `generation`'s log after what replay read.
    pub fn resume(&self, generation: u64, log: &GenerationLog) -> LogWriter {
        LogWriter {
            file: self.file(generation).clone(),
            generation,
            sequence: log.batches.len() as u64,
            offset: log.end_offset,
        }
    }

    /// The generation of a valid batch at byte 0 of each file, if any.
    pub fn first_generations(&self) -> Result<[Option<u64>; 2]> {
        let mut out = [None, None];
        for (i, f) in self.files.iter().enumerate() {
            if let Some((h, _)) = read_batch(f.as_ref(), 0)? {
                out[i] = Some(h);
            }
        }
        Ok(out)
    }

    /// Read every valid batch of `generation` from the start of its file,
    /// in order. Fails if a valid batch of the generation lies beyond the
    /// point where reading stopped (a damaged batch in the middle).
    pub fn read_generation(&self, generation: u64) -> Result<GenerationLog> {
        let file = self.file(generation).as_ref();
        let name = strata_format::journal_file(generation);
        let len = file.len()?;
        let mut batches = Vec::new();
        let mut ended_for = None;
        let mut offset = 0u64;
        while let Some((gen, b)) = read_batch(file, offset)? {
            let h = decode_batch_header(&b).expect("read_batch checked the header");
            if gen != generation || h.sequence != batches.len() as u64 {
                break;
            }
            let recs = Record::decode_all(&b[BATCH_HEADER_BYTES..]).map_err(|e| {
                corrupt(format!(
                    "{name}: batch {} at byte {offset} has a valid checksum but bad records: {e}",
                    h.sequence
                ))
            })?;
            ended_for = match recs.last() {
                Some(Record::GenerationEnd { next }) => Some(*next),
                _ => None,
            };
            batches.push(recs);
            offset += batch_span(h.payload_bytes);
        }
        // Anything valid of this generation further in?
        let expected = batches.len() as u64;
        let mut pos = offset + BATCH_ALIGN;
        let mut chunk = vec![0u8; SCAN_CHUNK_BYTES as usize];
        while pos < len {
            let n = SCAN_CHUNK_BYTES.min(len - pos);
            file.read_at(&mut chunk[..n as usize], pos)?;
            let mut at = 0u64;
            while at + BATCH_HEADER_BYTES as u64 <= n {
                if let Some(h) = decode_batch_header(&chunk[at as usize..]) {
                    if h.generation == generation && h.sequence > expected {
                        if let Some((_, _)) = read_batch(file, pos + at)? {
                            return Err(corrupt(format!(
                                "{name}: log batch {expected} of generation {generation} at byte \
                                 {offset} is damaged, but batch {} at byte {} is valid: flushed \
                                 writes would be lost",
                                h.sequence,
                                pos + at
                            )));
                        }
                    }
                }
                at += BATCH_ALIGN;
            }
            pos += n;
        }
        Ok(GenerationLog {
            batches,
            end_offset: offset,
            ended_for,
        })
    }
}

/// The valid batch at `offset` (header and payload, checksum verified), with
/// its generation; `None` if there is none.
pub(crate) fn read_batch(file: &dyn Storage, offset: u64) -> Result<Option<(u64, Vec<u8>)>> {
    let len = file.len()?;
    if offset + BATCH_HEADER_BYTES as u64 > len {
        return Ok(None);
    }
    let mut header = vec![0u8; BATCH_HEADER_BYTES];
    file.read_at(&mut header, offset)?;
    let Some(h) = decode_batch_header(&header) else {
        return Ok(None);
    };
    let used = BATCH_HEADER_BYTES as u64 + h.payload_bytes as u64;
    if offset + used > len {
        return Ok(None);
    }
    let mut b = vec![0u8; used as usize];
    file.read_at(&mut b, offset)?;
    if !batch_checksum_ok(&b) {
        return Ok(None);
    }
    Ok(Some((h.generation, b)))
}
