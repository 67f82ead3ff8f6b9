//! Bounds on what one binding may store and how fast it may write
//! (`spec/000_fa938a4e6ac75730.txt`, "State size, entry count, and write rate are bounded").
//! Every backend enforces the same numbers, so a limit is a property of the product,
//! not of the store a team happens to run.

use std::{
    collections::HashMap,
    sync::Mutex,
    time::{Duration, Instant},
};

use super::ids::BindingId;

/// Per-binding bounds. Defaults suit a chat conversation; operators raise them with
/// configuration, never per request.
#[derive(Clone, Debug, PartialEq)]
pub struct Limits {
    /// Largest native state payload (a checkpoint or snapshot), bytes.
    pub max_state_bytes: usize,
    /// Most uncommitted pending entries one binding epoch may hold.
    pub max_pending_entries: u64,
    /// Largest native object, bytes.
    pub max_object_bytes: usize,
    /// Most native objects per binding epoch.
    pub max_objects: u64,
    /// Largest stream entry body, bytes.
    pub max_entry_bytes: usize,
    /// Most entries one append may carry.
    pub max_entries_per_append: usize,
    /// Most entries per stream.
    pub max_stream_entries: u64,
    /// Most streams per binding epoch.
    pub max_streams: u64,
    /// Longest object key, stream name or entry id, bytes.
    pub max_key_bytes: usize,
    /// Largest run terminal metadata or interrupt document, bytes (JSON).
    pub max_metadata_bytes: usize,
    /// Sustained writes per second per binding, and the burst above it.
    pub writes_per_second: u32,
    pub write_burst: u32,
    /// Largest page a list or load returns.
    pub max_page: usize,
}

impl Default for Limits {
    fn default() -> Self {
        Limits {
            max_state_bytes: 4 << 20,
            max_pending_entries: 256,
            max_object_bytes: 4 << 20,
            max_objects: 100_000,
            max_entry_bytes: 1 << 20,
            max_entries_per_append: 1_000,
            max_stream_entries: 1_000_000,
            max_streams: 10_000,
            max_key_bytes: 512,
            max_metadata_bytes: 64 << 10,
            writes_per_second: 500,
            write_burst: 1_000,
            max_page: 1_000,
        }
    }
}

/// A token bucket per binding. In-process: with several replicas each enforces its own
/// share, which bounds the store's load per replica; the hard bounds (sizes, counts) are
/// enforced by the store itself.
pub struct WriteRateLimiter {
    rate: f64,
    burst: f64,
    buckets: Mutex<HashMap<BindingId, (f64, Instant)>>,
}

/// Buckets kept before idle ones are dropped; bounds the limiter's memory.
const MAX_BUCKETS: usize = 100_000;

impl WriteRateLimiter {
    pub fn new(limits: &Limits) -> Self {
        WriteRateLimiter {
            rate: f64::from(limits.writes_per_second.max(1)),
            burst: f64::from(limits.write_burst.max(1)),
            buckets: Mutex::new(HashMap::new()),
        }
    }

    /// Takes one token for `binding`. `Err` carries how long until a token is free.
    pub fn acquire(&self, binding: &BindingId) -> Result<(), Duration> {
        self.acquire_at(binding, Instant::now())
    }

    fn acquire_at(&self, binding: &BindingId, now: Instant) -> Result<(), Duration> {
        let mut buckets = self
            .buckets
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner());
        if buckets.len() >= MAX_BUCKETS && !buckets.contains_key(binding) {
            let full_after = Duration::from_secs_f64(self.burst / self.rate);
            buckets.retain(|_, (_, last)| now.duration_since(*last) < full_after);
        }
        let (tokens, last) = buckets.entry(binding.clone()).or_insert((self.burst, now));
        let refilled =
            (*tokens + now.duration_since(*last).as_secs_f64() * self.rate).min(self.burst);
        *last = now;
        if refilled >= 1.0 {
            *tokens = refilled - 1.0;
            Ok(())
        } else {
            *tokens = refilled;
            Err(Duration::from_secs_f64((1.0 - refilled) / self.rate))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn burst_then_refill() {
        let limits = Limits {
            writes_per_second: 10,
            write_burst: 3,
            ..Limits::default()
        };
        let limiter = WriteRateLimiter::new(&limits);
        let b =
            BindingId::parse("hb_0123456789abcdef0123456789abcdef").unwrap_or_else(|| panic!("id"));
        let other =
            BindingId::parse("hb_fedcba9876543210fedcba9876543210").unwrap_or_else(|| panic!("id"));
        let t0 = Instant::now();
        for i in 0..3 {
            assert!(limiter.acquire_at(&b, t0).is_ok(), "burst token {i}");
        }
        let wait = limiter.acquire_at(&b, t0).expect_err("burst exhausted");
        assert!(
            wait <= Duration::from_millis(100) && wait > Duration::ZERO,
            "{wait:?}"
        );
        assert!(
            limiter.acquire_at(&other, t0).is_ok(),
            "another binding has its own bucket"
        );
        assert!(
            limiter
                .acquire_at(&b, t0 + Duration::from_millis(150))
                .is_ok(),
            "refilled after 1/rate"
        );
    }
}
