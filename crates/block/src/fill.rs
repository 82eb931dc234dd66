//! What a read tells its caller about the buffer it filled.

use std::ops::Range;

/// How one run of a read's buffer was filled.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Fill {
    /// Read from storage, or not known to be a hole. Always a correct
    /// answer, only less precise than `Zeros` where that holds.
    Data,
    /// Nothing is allocated there (a hole, an unmapped or zero grain, the
    /// part of a chain no link stores): the run reads as zeros, and the
    /// buffer holds zeros.
    Zeros,
}

/// How a read filled its buffer: runs in order, covering the whole buffer,
/// neighbours of the same [`Fill`] merged (so two `ReadFill`s describing
/// the same buffer compare equal).
///
/// The first run is kept inline: a read filled one way allocates nothing.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ReadFill {
    /// `(len_bytes, fill)`; a length of 0 while the fill is empty.
    first: (u64, Fill),
    /// Every run after the first, each longer than 0 and of a different
    /// fill than the one before it.
    rest: Vec<(u64, Fill)>,
}

impl Default for ReadFill {
    fn default() -> Self {
        Self::new()
    }
}

impl ReadFill {
    /// No runs yet (describes an empty buffer).
    pub const fn new() -> Self {
        Self {
            first: (0, Fill::Data),
            rest: Vec::new(),
        }
    }

    /// One run of data over `len_bytes`.
    pub fn all_data(len_bytes: u64) -> Self {
        let mut f = Self::new();
        f.push(len_bytes, Fill::Data);
        f
    }

    /// One run of zeros over `len_bytes`.
    pub fn all_zeros(len_bytes: u64) -> Self {
        let mut f = Self::new();
        f.push(len_bytes, Fill::Zeros);
        f
    }

    /// Append a run of `len_bytes`; it merges into the last run when that
    /// has the same fill. A zero-length run is ignored.
    pub fn push(&mut self, len_bytes: u64, fill: Fill) {
        if len_bytes == 0 {
            return;
        }
        if self.first.0 == 0 {
            self.first = (len_bytes, fill);
            return;
        }
        let last = self.rest.last_mut().unwrap_or(&mut self.first);
        if last.1 == fill {
            last.0 += len_bytes;
        } else {
            self.rest.push((len_bytes, fill));
        }
    }

    /// Total length of the runs.
    pub fn len_bytes(&self) -> u64 {
        self.first.0 + self.rest.iter().map(|r| r.0).sum::<u64>()
    }

    /// Whether every byte (and at least one) is of `fill`.
    pub fn is_all(&self, fill: Fill) -> bool {
        self.first.0 > 0 && self.first.1 == fill && self.rest.is_empty()
    }

    /// The runs in order, as byte ranges relative to the start of the
    /// buffer.
    pub fn runs(&self) -> FillRuns<'_> {
        let first = (self.first.0 > 0).then_some(self.first);
        FillRuns {
            first,
            rest: self.rest.iter(),
            at: 0,
        }
    }
}

/// Iterator over a [`ReadFill`]'s runs: `(range in the buffer, fill)`.
#[derive(Debug, Clone)]
pub struct FillRuns<'a> {
    first: Option<(u64, Fill)>,
    rest: std::slice::Iter<'a, (u64, Fill)>,
    at: u64,
}

impl Iterator for FillRuns<'_> {
    type Item = (Range<u64>, Fill);

    fn next(&mut self) -> Option<Self::Item> {
        let (len, fill) = self.first.take().or_else(|| self.rest.next().copied())?;
        let start = self.at;
        self.at += len;
        Some((start..self.at, fill))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn runs(f: &ReadFill) -> Vec<(Range<u64>, Fill)> {
        f.runs().collect()
    }

    #[test]
    fn neighbours_of_one_fill_merge_and_empty_runs_vanish() {
        let mut f = ReadFill::new();
        assert_eq!(runs(&f), vec![]);
        f.push(0, Fill::Zeros);
        f.push(4096, Fill::Data);
        f.push(512, Fill::Data);
        f.push(0, Fill::Zeros);
        f.push(8192, Fill::Zeros);
        f.push(4096, Fill::Zeros);
        f.push(512, Fill::Data);
        assert_eq!(
            runs(&f),
            vec![
                (0..4608, Fill::Data),
                (4608..16896, Fill::Zeros),
                (16896..17408, Fill::Data)
            ]
        );
        assert_eq!(f.len_bytes(), 17408);
        assert!(!f.is_all(Fill::Data));
    }

    #[test]
    fn the_same_buffer_described_in_pieces_compares_equal() {
        let mut pieces = ReadFill::new();
        for _ in 0..16 {
            pieces.push(4096, Fill::Zeros);
        }
        assert_eq!(pieces, ReadFill::all_zeros(65536));
        assert!(pieces.is_all(Fill::Zeros));
        assert!(ReadFill::all_data(512).is_all(Fill::Data));
        assert!(!ReadFill::new().is_all(Fill::Data));
        assert_eq!(ReadFill::all_data(0), ReadFill::new());
    }
}
