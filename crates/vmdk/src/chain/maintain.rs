//! Maintenance of an open chain: shrinking its SEsparse top link, offline
//! or while it serves, and checking every link.

use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use super::{ExtentImpl, VmdkImage, SHRINK_PAUSE_FACTOR};
use crate::error::{Result, VmdkErrorKind};
use crate::sparse::{ExtentCheck, ShrinkReport, SparseExtent, SparseFormat, SECTOR};

impl VmdkImage {
    /// Shrink every SEsparse extent of the top link (see [`SparseExtent::shrink`]).
    pub fn shrink(&self, progress: &mut dyn FnMut(u64, u64)) -> Result<Vec<ShrinkReport>> {
        if !self.writable {
            return Err(crate::error::new(
                VmdkErrorKind::ReadOnly,
                &self.links[0].name,
                "open read-only",
            ));
        }
        let _g = self.io.write();
        let mut out = Vec::new();
        for s in self.links[0].sparse() {
            if s.format() == SparseFormat::SeSparse {
                out.push(s.shrink(progress)?);
            }
        }
        if out.is_empty() {
            return Err(crate::error::unsupported(
                &self.links[0].name,
                format!(
                    "shrink needs an SEsparse link; this one is {}",
                    self.links[0].create_type()
                ),
            ));
        }
        Ok(out)
    }

    /// Shrink every SEsparse extent of the top link while the image stays
    /// in use (docs/FORMAT.md §9.3, Online shrink): bounded steps, each
    /// under the I/O lock held exclusively, with a pause after each (while
    /// clients send requests, eight times the step's duration; longer if
    /// `rate_bytes_per_sec` asks for it) so clients keep most of the time.
    pub fn shrink_online(
        &self,
        rate_bytes_per_sec: Option<u64>,
        progress: &mut dyn FnMut(u64, u64),
    ) -> Result<Vec<ShrinkReport>> {
        let name = &self.links[0].name;
        if !self.writable || !self.links[0].writable {
            return Err(crate::error::new(
                VmdkErrorKind::ReadOnly,
                name,
                "served read-only; only a writable server can shrink it",
            ));
        }
        if rate_bytes_per_sec == Some(0) {
            return Err(crate::error::new(
                VmdkErrorKind::InvalidArgument,
                name,
                "a rate of 0 bytes/s would never finish",
            ));
        }
        if self.shrinking.swap(true, Ordering::AcqRel) {
            return Err(crate::error::new(
                VmdkErrorKind::Locked,
                name,
                "a shrink of this image is already running",
            ));
        }
        struct Running<'a>(&'a AtomicBool);
        impl Drop for Running<'_> {
            fn drop(&mut self) {
                self.0.store(false, Ordering::Release);
            }
        }
        let _running = Running(&self.shrinking);
        let mut out = Vec::new();
        for s in self.links[0].sparse() {
            if s.format() != SparseFormat::SeSparse {
                continue;
            }
            out.push(self.shrink_extent_online(s, rate_bytes_per_sec, progress)?);
        }
        if out.is_empty() {
            return Err(crate::error::unsupported(
                name,
                format!(
                    "shrink needs an SEsparse link; this one is {}",
                    self.links[0].create_type()
                ),
            ));
        }
        Ok(out)
    }

    /// Check every sparse extent of every link, plus the chain's sizes.
    pub fn check(&self, repair: bool) -> Result<Vec<(String, ExtentCheck)>> {
        let _g = self.io.write();
        let mut out = Vec::new();
        for (i, link) in self.links.iter().enumerate() {
            let mut lc = ExtentCheck::default();
            if i > 0 && link.sectors < self.links[i - 1].sectors {
                lc.warnings.push(format!(
                    "parent is {} sectors, smaller than its child's {}; the rest reads as zeros",
                    link.sectors,
                    self.links[i - 1].sectors
                ));
            }
            for e in &link.extents {
                if let ExtentImpl::Flat { file, name, offset } = &e.imp {
                    let flen = file.len().map_err(|x| crate::error::io(name, x))?;
                    if flen < offset + e.sectors * SECTOR {
                        lc.warnings.push(format!(
                            "flat extent {name} is {flen} bytes, shorter than the {} its extent line declares; the rest reads as zeros",
                            offset + e.sectors * SECTOR
                        ));
                    }
                }
            }
            out.push((link.name.clone(), lc));
            for s in link.sparse() {
                out.push((s.name().to_string(), s.check(repair && i == 0)?));
            }
        }
        Ok(out)
    }

    /// One SEsparse extent shrunk online: bounded steps under the I/O lock,
    /// each followed by a pause (see [`VmdkImage::shrink_online`]).
    fn shrink_extent_online(
        &self,
        s: &SparseExtent,
        rate_bytes_per_sec: Option<u64>,
        progress: &mut dyn FnMut(u64, u64),
    ) -> Result<ShrinkReport> {
        let mut sh = {
            let _g = self.io.write();
            s.online_shrink_begin()?
        };
        let started = Instant::now();
        let mut bytes = 0u64;
        let mut seen = self.requests.load(Ordering::Relaxed);
        loop {
            let t0 = Instant::now();
            let r = {
                let _g = self.io.write();
                s.online_shrink_step(&mut sh, progress)
            };
            match r {
                Err(e) => {
                    s.online_shrink_abort();
                    return Err(e);
                }
                Ok(None) => break,
                Ok(Some(b)) => bytes += b,
            }
            let now = self.requests.load(Ordering::Relaxed);
            let busy = now != seen;
            seen = now;
            let mut pause = if busy {
                t0.elapsed() * SHRINK_PAUSE_FACTOR
            } else {
                Duration::ZERO
            };
            if let Some(rate) = rate_bytes_per_sec {
                let due = Duration::from_secs_f64(bytes as f64 / rate as f64);
                pause = pause.max(due.saturating_sub(started.elapsed()));
            }
            std::thread::sleep(pause.max(Duration::from_micros(100)));
        }
        Ok(sh.report())
    }
}
