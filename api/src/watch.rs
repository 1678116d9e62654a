//! How both binaries' watches wait before listing again after a failure.

use std::time::Duration;

/// From 250 ms, doubling, to at most [`MAX`](WatchBackoff::MAX), each wait
/// drawn between half and all of its step so that a fleet of agents does
/// not come back in step.
///
/// client-go's reflector (and kube's default) backs off to 30 s, so a
/// binary could stay blind for half a minute after the API server returned.
/// A cap of 2 s bounds catch-up to a few seconds (a watch that reconnected
/// quietly is known to be back only once no error came for longer than the
/// cap); the price is at most one connection attempt a second per watch
/// while the server is away, 1.5 s apart on average (an agent's 5 watches:
/// ~3,300 a second from 1,000 agents, each refused in the kernel when
/// nothing listens).
pub struct WatchBackoff {
    step: Duration,
    rng: u64,
}

impl WatchBackoff {
    pub const MIN: Duration = Duration::from_millis(250);
    pub const MAX: Duration = Duration::from_secs(2);

    /// `seed` only spreads the jitter; any value works.
    pub fn new(seed: u64) -> WatchBackoff {
        WatchBackoff {
            step: Self::MIN,
            rng: seed | 1,
        }
    }

    /// Seeded from the clock and a counter: distinct across watches and
    /// processes.
    pub fn spread() -> WatchBackoff {
        use std::sync::atomic::{AtomicU64, Ordering};
        static COUNTER: AtomicU64 = AtomicU64::new(0);
        let nanos = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_nanos() as u64)
            .unwrap_or(0);
        let n = COUNTER.fetch_add(1, Ordering::Relaxed);
        Self::new(
            nanos ^ (u64::from(std::process::id()) << 32) ^ n.wrapping_mul(0x9E37_79B9_7F4A_7C15),
        )
    }
}

impl Iterator for WatchBackoff {
    type Item = Duration;

    fn next(&mut self) -> Option<Duration> {
        // xorshift64: a jitter needs no better randomness.
        self.rng ^= self.rng << 13;
        self.rng ^= self.rng >> 7;
        self.rng ^= self.rng << 17;
        let half = self.step / 2;
        let wait = half + half.mul_f64((self.rng >> 11) as f64 / (1u64 << 53) as f64);
        self.step = (self.step * 2).min(Self::MAX);
        Some(wait)
    }
}

impl kube::runtime::utils::Backoff for WatchBackoff {
    fn reset(&mut self) {
        self.step = Self::MIN;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Waits grow to the cap and stay within it, with jitter, and a reset
    /// starts again from the bottom.
    #[test]
    fn watch_backoff_is_capped_and_jittered() {
        use kube::runtime::utils::Backoff;
        let mut b = WatchBackoff::new(7);
        let waits: Vec<Duration> = b.by_ref().take(12).collect();
        assert!(waits[0] >= WatchBackoff::MIN / 2 && waits[0] <= WatchBackoff::MIN);
        assert!(waits.iter().all(|w| *w <= WatchBackoff::MAX));
        assert!(waits[8..].iter().all(|w| *w >= WatchBackoff::MAX / 2));
        let mut distinct = waits[8..].to_vec();
        distinct.dedup();
        assert!(distinct.len() > 1, "no jitter: {waits:?}");
        b.reset();
        assert!(b.next().unwrap() <= WatchBackoff::MIN);
    }
}
