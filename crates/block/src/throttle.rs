//! Per-disk I/O limits (`strata limit`): a rate of operations and a rate of
//! bytes, each a token bucket that holds up to `burst_seconds` of its rate.
//!
//! Every read and write of the disk's handles (whatever transport they
//! came through) takes one operation and its length in bytes; unmap and
//! write-zeroes take one operation. A request that finds a bucket short
//! takes its tokens anyway, leaving the bucket in debt, and sleeps until
//! the debt is paid at the bucket's rate: requests are never refused or
//! split, and concurrent requests queue up behind each other's debt, the
//! way QEMU's block throttling delays rather than fails. With no limit set
//! the check is one atomic load.

use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use parking_lot::Mutex;
use serde::{Deserialize, Serialize};

/// What `strata limit` sets on a disk (kept with the disk: a local
/// datastore's catalog, an object-store disk's manifest).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct IoLimits {
    /// Operations per second (reads, writes, unmaps), None: unlimited.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub iops: Option<u64>,
    /// Bytes per second read plus written, None: unlimited.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub bps: Option<u64>,
    /// How many seconds of the rate an idle disk may spend at once
    /// (None: 1).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub burst_seconds: Option<u32>,
}

impl IoLimits {
    pub fn is_none(&self) -> bool {
        self.iops.is_none() && self.bps.is_none()
    }

    /// Refuse a limit that would stop the disk (a rate of 0).
    pub fn check(&self) -> Result<(), &'static str> {
        if self.iops == Some(0) || self.bps == Some(0) || self.burst_seconds == Some(0) {
            return Err(
                "a limit of 0 would stop the disk; give a positive rate or clear the limit",
            );
        }
        Ok(())
    }

    fn burst(&self) -> f64 {
        f64::from(self.burst_seconds.unwrap_or(1).max(1))
    }
}

#[derive(Debug)]
struct Bucket {
    rate: f64,
    cap: f64,
    tokens: f64,
}

impl Bucket {
    fn new(rate: u64, burst: f64) -> Self {
        let rate = rate as f64;
        Bucket {
            rate,
            cap: rate * burst,
            tokens: rate * burst,
        }
    }

    fn refill(&mut self, dt: f64) {
        self.tokens = (self.tokens + dt * self.rate).min(self.cap);
    }

    /// Take `n`; how long the caller must wait for its debt to be paid.
    fn take(&mut self, n: f64) -> f64 {
        self.tokens -= n;
        if self.tokens >= 0.0 {
            0.0
        } else {
            -self.tokens / self.rate
        }
    }
}

#[derive(Debug)]
struct State {
    limits: IoLimits,
    last: Instant,
    ops: Option<Bucket>,
    bytes: Option<Bucket>,
}

/// One disk's limits, shared by all its handles.
#[derive(Debug)]
pub struct Throttle {
    active: AtomicBool,
    state: Mutex<State>,
}

impl Throttle {
    pub fn new(limits: IoLimits) -> Self {
        let t = Throttle {
            active: AtomicBool::new(false),
            state: Mutex::new(State {
                limits: IoLimits::default(),
                last: Instant::now(),
                ops: None,
                bytes: None,
            }),
        };
        t.set(limits);
        t
    }

    /// Change the limits; the buckets start full.
    pub fn set(&self, limits: IoLimits) {
        let mut s = self.state.lock();
        let burst = limits.burst();
        s.limits = limits;
        s.last = Instant::now();
        s.ops = limits
            .iops
            .filter(|&r| r > 0)
            .map(|r| Bucket::new(r, burst));
        s.bytes = limits.bps.filter(|&r| r > 0).map(|r| Bucket::new(r, burst));
        self.active
            .store(s.ops.is_some() || s.bytes.is_some(), Ordering::Release);
    }

    pub fn limits(&self) -> IoLimits {
        self.state.lock().limits
    }

    /// How long a request of `bytes` must wait, its tokens taken.
    fn charge_at(&self, bytes: u64, now: Instant) -> Duration {
        let mut s = self.state.lock();
        let dt = now.saturating_duration_since(s.last).as_secs_f64();
        s.last = now.max(s.last);
        let mut wait: f64 = 0.0;
        if let Some(b) = s.ops.as_mut() {
            b.refill(dt);
            wait = wait.max(b.take(1.0));
        }
        if let Some(b) = s.bytes.as_mut() {
            b.refill(dt);
            wait = wait.max(b.take(bytes as f64));
        }
        Duration::from_secs_f64(wait)
    }

    /// Whether limits are set (requests may have to wait in `admit`).
    pub fn is_active(&self) -> bool {
        self.active.load(Ordering::Acquire)
    }

    /// Admit one request of `bytes`, sleeping as long as the limits say.
    pub fn admit(&self, bytes: u64) {
        if !self.active.load(Ordering::Acquire) {
            return;
        }
        let wait = self.charge_at(bytes, Instant::now());
        if !wait.is_zero() {
            std::thread::sleep(wait);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_burst_is_free_then_requests_wait_at_the_rate() {
        let t = Throttle::new(IoLimits {
            iops: Some(100),
            bps: None,
            burst_seconds: Some(2),
        });
        let t0 = Instant::now();
        // 200 operations of burst go at once.
        for _ in 0..200 {
            assert_eq!(t.charge_at(4096, t0), Duration::ZERO);
        }
        // The next ones queue up 10 ms apart.
        assert_eq!(t.charge_at(4096, t0), Duration::from_millis(10));
        assert_eq!(t.charge_at(4096, t0), Duration::from_millis(20));
        // A second later the debt of 2 is paid and 98 tokens are back.
        let t1 = t0 + Duration::from_secs(1);
        for _ in 0..98 {
            assert_eq!(t.charge_at(0, t1), Duration::ZERO);
        }
        assert!(t.charge_at(0, t1) > Duration::ZERO);
    }

    #[test]
    fn bytes_and_operations_both_hold_and_the_larger_wait_wins() {
        let t = Throttle::new(IoLimits {
            iops: Some(1000),
            bps: Some(1 << 20),
            burst_seconds: None,
        });
        let t0 = Instant::now();
        // 1 MiB of burst, then a 512 KiB request waits half a second.
        assert_eq!(t.charge_at(1 << 20, t0), Duration::ZERO);
        let w = t.charge_at(512 << 10, t0);
        assert!((w.as_secs_f64() - 0.5).abs() < 1e-6, "{w:?}");
        // Without limits nothing waits (and nothing is counted).
        t.set(IoLimits::default());
        assert!(!t.active.load(Ordering::Acquire));
        let t2 = Instant::now();
        t.admit(u64::MAX);
        assert!(t2.elapsed() < Duration::from_secs(1));
    }
}
