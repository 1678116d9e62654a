//! What a binary meant to tell the API server and could not yet: a bounded,
//! coalescing queue, oldest first. Both binaries keep their Events in one
//! while the server is away (or refuses them for a moment after a restart)
//! and write them when it answers again.
//!
//! Bounded, because an outage can last longer than memory is worth;
//! coalescing, because only the newest of two items with the same key still
//! says what is true (a Service's `Withdrawn` after a second change, say);
//! aged, because Kubernetes expires Events after an hour, so writing one
//! older than that only adds noise.

use std::collections::VecDeque;
use std::time::{Duration, Instant};

/// Items waiting, each with its key and when it first failed.
#[derive(Debug)]
pub struct Backlog<K, V> {
    waiting: VecDeque<(K, V, Instant)>,
    capacity: usize,
    max_age: Duration,
}

impl<K: PartialEq, V> Backlog<K, V> {
    pub fn new(capacity: usize, max_age: Duration) -> Self {
        Backlog {
            waiting: VecDeque::new(),
            capacity: capacity.max(1),
            max_age,
        }
    }

    /// Queues `value` (first failed at `since`) behind the others, or in
    /// place of one with the same key (keeping that one's place and age);
    /// how many had to be dropped, oldest first, to make room.
    pub fn push(&mut self, key: K, value: V, since: Instant) -> usize {
        if let Some(w) = self.waiting.iter_mut().find(|w| w.0 == key) {
            w.1 = value;
            return 0;
        }
        let mut dropped = 0;
        while self.waiting.len() >= self.capacity {
            self.waiting.pop_front();
            dropped += 1;
        }
        self.waiting.push_back((key, value, since));
        dropped
    }

    /// Puts back in front an item that failed again, unless a newer one
    /// with its key came meanwhile; how many were dropped (from the back,
    /// the newest) to keep the bound.
    pub fn put_back(&mut self, key: K, value: V, since: Instant) -> usize {
        if self.waiting.iter().any(|w| w.0 == key) {
            return 0;
        }
        self.waiting.push_front((key, value, since));
        let mut dropped = 0;
        while self.waiting.len() > self.capacity {
            self.waiting.pop_back();
            dropped += 1;
        }
        dropped
    }

    /// The oldest item still worth writing at `now` (with its key and age
    /// stamp), and how many expired on the way.
    pub fn pop(&mut self, now: Instant) -> (Option<(K, V, Instant)>, usize) {
        let mut expired = 0;
        let mut next = None;
        while let Some(front) = self.waiting.pop_front() {
            if now.saturating_duration_since(front.2) < self.max_age {
                next = Some(front);
                break;
            }
            expired += 1;
        }
        if self.waiting.is_empty() {
            // A burst (a node taking a thousand VIPs queues an Event for
            // each) grows the queue far beyond what it holds at rest, and a
            // deque never shrinks by itself: a megabyte kept for nothing.
            self.waiting.shrink_to_fit();
        }
        (next, expired)
    }

    pub fn len(&self) -> usize {
        self.waiting.len()
    }

    pub fn is_empty(&self) -> bool {
        self.waiting.is_empty()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const HOUR: Duration = Duration::from_secs(3600);

    #[test]
    fn newer_items_replace_older_ones_of_their_key_in_place() {
        let t0 = Instant::now();
        let mut b = Backlog::new(8, HOUR);
        b.push("web", "old", t0);
        b.push("db", "db", t0);
        b.push("web", "new", t0 + Duration::from_secs(1));
        assert_eq!(b.len(), 2);
        let (first, _) = b.pop(t0);
        assert_eq!(first, Some(("web", "new", t0)));
    }

    #[test]
    fn a_drained_backlog_gives_its_memory_back() {
        let t0 = Instant::now();
        let mut b = Backlog::new(4096, HOUR);
        for k in 0..1000 {
            b.push(k, [0u8; 64], t0);
        }
        assert!(b.waiting.capacity() >= 1000);
        while b.pop(t0).0.is_some() {}
        assert_eq!(b.waiting.capacity(), 0);
        b.push(1, [0u8; 64], t0);
        assert_eq!(b.pop(t0).0.map(|w| w.0), Some(1));
    }

    #[test]
    fn a_full_backlog_drops_the_oldest_and_says_how_many() {
        let t0 = Instant::now();
        let mut b = Backlog::new(3, HOUR);
        for k in 0..3 {
            assert_eq!(b.push(k, (), t0), 0);
        }
        assert_eq!(b.push(3, (), t0), 1);
        assert_eq!(b.pop(t0).0.map(|w| w.0), Some(1));
        // Put back in front; the bound drops the newest.
        b.push(4, (), t0);
        assert_eq!(b.put_back(1, (), t0), 1);
        let order: Vec<i32> = std::iter::from_fn(|| b.pop(t0).0.map(|w| w.0)).collect();
        assert_eq!(order, vec![1, 2, 3]);
    }

    #[test]
    fn a_put_back_item_yields_to_a_newer_one_of_its_key() {
        let t0 = Instant::now();
        let mut b = Backlog::new(3, HOUR);
        b.push("web", "newer", t0);
        assert_eq!(b.put_back("web", "older", t0), 0);
        assert_eq!(b.len(), 1);
        assert_eq!(b.pop(t0).0.map(|w| w.1), Some("newer"));
    }

    #[test]
    fn items_older_than_the_max_age_expire() {
        let t0 = Instant::now();
        let mut b = Backlog::new(3, HOUR);
        b.push("old", (), t0);
        b.push("new", (), t0 + HOUR);
        let (next, expired) = b.pop(t0 + HOUR + Duration::from_secs(1));
        assert_eq!(expired, 1);
        assert_eq!(next.map(|w| w.0), Some("new"));
        assert_eq!(b.pop(t0 + 3 * HOUR), (None, 0));
    }
}
