//! The set of addresses in use, per family, as coalesced intervals, so that
//! "the lowest free address in this range" costs O(log n) however many
//! addresses are taken: a `/64` with 100,000 Services in it is ordinary.
//!
//! Pools with `avoidBuggyIPs` never hand out IPv4 addresses ending in `.0` or
//! `.255`. Seen through such a pool, a run of used addresses continues across
//! a gap made only of such addresses, so a densely used pool would split into
//! one interval per `/24` and the search would walk them all. A second map
//! keeps the intervals joined across those gaps; the search uses it for
//! those pools and stays O(log n).

use std::collections::BTreeMap;

use hostlb_api::Family;

#[derive(Clone, Debug)]
pub struct UsedSet {
    family: Family,
    /// start → end (inclusive), disjoint and never adjacent.
    plain: BTreeMap<u128, u128>,
    /// IPv4 only: `plain` joined across gaps of `.0`/`.255` addresses only.
    /// Endpoints are always used addresses; the gap between two entries
    /// always holds an address that is neither used nor buggy.
    joined: BTreeMap<u128, u128>,
    len: u128,
}

/// An IPv4 address ending in `.0` or `.255`, which some old clients drop.
pub fn is_buggy(family: Family, x: u128) -> bool {
    family == Family::V4 && matches!(x & 0xff, 0 | 0xff)
}

/// How many addresses of `[lo, hi]` end in `.0` or `.255` (IPv4).
pub fn buggy_in(family: Family, lo: u128, hi: u128) -> u128 {
    if family != Family::V4 || lo > hi {
        return 0;
    }
    // Addresses in [0, n] congruent to r modulo 256.
    let upto = |n: u128, r: u128| if n < r { 0 } else { (n - r) / 256 + 1 };
    let count = |r: u128| upto(hi, r) - if lo == 0 { 0 } else { upto(lo - 1, r) };
    count(0) + count(255)
}

impl UsedSet {
    pub fn new(family: Family) -> Self {
        UsedSet {
            family,
            plain: BTreeMap::new(),
            joined: BTreeMap::new(),
            len: 0,
        }
    }

    pub fn len(&self) -> u128 {
        self.len
    }

    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    fn containing(map: &BTreeMap<u128, u128>, x: u128) -> Option<(u128, u128)> {
        map.range(..=x)
            .next_back()
            .filter(|(_, e)| **e >= x)
            .map(|(s, e)| (*s, *e))
    }

    pub fn contains(&self, x: u128) -> bool {
        Self::containing(&self.plain, x).is_some()
    }

    /// Every address strictly between `a` and `b` is buggy (or there is none).
    fn buggy_gap(&self, a: u128, b: u128) -> bool {
        b > a && {
            let gap = b - a - 1;
            gap == 0 || (gap <= 2 && buggy_in(self.family, a + 1, b - 1) == gap)
        }
    }

    pub fn insert(&mut self, x: u128) -> bool {
        if self.contains(x) {
            return false;
        }
        self.len += 1;
        // plain: join with an interval ending at x-1 and one starting at x+1.
        let mut start = x;
        let mut end = x;
        if x > 0
            && let Some((s, e)) = Self::containing(&self.plain, x - 1)
        {
            self.plain.remove(&s);
            start = s;
            debug_assert_eq!(e, x - 1);
        }
        if x < u128::MAX
            && let Some(e) = self.plain.remove(&(x + 1))
        {
            end = e;
        }
        self.plain.insert(start, end);
        if self.family == Family::V4 {
            self.join(x);
        }
        true
    }

    /// Fold `x` (just inserted) into `joined`, joining its neighbours when
    /// only buggy addresses separate them.
    fn join(&mut self, x: u128) {
        let (mut start, mut end) = (x, x);
        if let Some((s, e)) = Self::containing(&self.joined, x) {
            // Inside a joined run already (x was one of its buggy holes).
            let _ = (s, e);
            return;
        }
        if let Some((&s, &e)) = self.joined.range(..x).next_back()
            && self.buggy_gap(e, x)
        {
            self.joined.remove(&s);
            start = s;
        }
        if let Some((&s, &e)) = self.joined.range(x + 1..).next()
            && self.buggy_gap(x, s)
        {
            self.joined.remove(&s);
            end = e;
        }
        self.joined.insert(start, end);
    }

    pub fn remove(&mut self, x: u128) -> bool {
        let Some((s, e)) = Self::containing(&self.plain, x) else {
            return false;
        };
        self.len -= 1;
        self.plain.remove(&s);
        if s < x {
            self.plain.insert(s, x - 1);
        }
        if x < e {
            self.plain.insert(x + 1, e);
        }
        if self.family == Family::V4 {
            self.unjoin(x);
        }
        true
    }

    /// Take `x` (just removed) out of its joined run, splitting it when the
    /// used neighbours on either side are no longer separated by buggy
    /// addresses only.
    fn unjoin(&mut self, x: u128) {
        let Some((js, je)) = Self::containing(&self.joined, x) else {
            return;
        };
        // The nearest used addresses inside the run, on each side.
        let left = self
            .plain
            .range(..x)
            .next_back()
            .map(|(_, e)| *e)
            .filter(|e| *e >= js);
        let right = self
            .plain
            .range(x + 1..)
            .next()
            .map(|(s, _)| *s)
            .filter(|s| *s <= je);
        self.joined.remove(&js);
        match (left, right) {
            (Some(l), Some(r)) if self.buggy_gap(l, r) => {
                self.joined.insert(js, je);
            }
            (l, r) => {
                if let Some(l) = l {
                    self.joined.insert(js, l);
                }
                if let Some(r) = r {
                    self.joined.insert(r, je);
                }
            }
        }
    }

    /// The lowest address of `[lo, hi]` that is not used (and, with
    /// `skip_buggy`, not buggy).
    pub fn first_free(&self, lo: u128, hi: u128, skip_buggy: bool) -> Option<u128> {
        let skip_buggy = skip_buggy && self.family == Family::V4;
        let map = if skip_buggy {
            &self.joined
        } else {
            &self.plain
        };
        let mut x = lo;
        loop {
            if x > hi {
                return None;
            }
            if skip_buggy && is_buggy(self.family, x) {
                x = x.checked_add(1)?;
                continue;
            }
            match Self::containing(map, x) {
                Some((_, e)) => x = e.checked_add(1)?,
                None => return Some(x),
            }
        }
    }

    /// Used addresses within `[lo, hi]`.
    pub fn count_in(&self, lo: u128, hi: u128) -> u128 {
        self.runs_in(lo, hi).map(|(a, b)| b - a + 1).sum()
    }

    /// Used addresses within `[lo, hi]` that are not buggy: what counts
    /// against the capacity of an `avoidBuggyIPs` pool.
    pub fn count_in_skipping_buggy(&self, lo: u128, hi: u128) -> u128 {
        self.runs_in(lo, hi)
            .map(|(a, b)| b - a + 1 - buggy_in(self.family, a, b))
            .sum()
    }

    /// The used runs clipped to `[lo, hi]`.
    fn runs_in(&self, lo: u128, hi: u128) -> impl Iterator<Item = (u128, u128)> + '_ {
        let first = Self::containing(&self.plain, lo)
            .map(|(s, _)| s)
            .unwrap_or(lo);
        self.plain
            .range(first..=hi)
            .map(move |(s, e)| ((*s).max(lo), (*e).min(hi)))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;
    use std::collections::BTreeSet;

    fn naive_first_free(
        used: &BTreeSet<u128>,
        family: Family,
        lo: u128,
        hi: u128,
        skip: bool,
    ) -> Option<u128> {
        (lo..=hi).find(|x| !(used.contains(x) || (skip && is_buggy(family, *x))))
    }

    #[test]
    fn buggy_counting() {
        let base = 10u128 << 24;
        assert_eq!(buggy_in(Family::V4, base, base + 255), 2);
        assert_eq!(buggy_in(Family::V4, base + 1, base + 254), 0);
        assert_eq!(buggy_in(Family::V4, base + 255, base + 256), 2);
        assert_eq!(buggy_in(Family::V4, 0, (1 << 16) - 1), 512);
        assert_eq!(buggy_in(Family::V6, 0, 1000), 0);
        assert_eq!(buggy_in(Family::V4, 0, 0), 1);
    }

    #[test]
    fn dense_avoid_buggy_pool_is_found_in_few_steps() {
        let mut s = UsedSet::new(Family::V4);
        let base = 10u128 << 24;
        // Fill 100 /24s with every non-buggy address.
        for x in base..base + 256 * 100 {
            if !is_buggy(Family::V4, x) {
                s.insert(x);
            }
        }
        assert_eq!(s.joined.len(), 1, "one run across the /24 boundaries");
        assert_eq!(
            s.first_free(base, base + (1 << 20), true),
            Some(base + 256 * 100 + 1)
        );
        assert_eq!(s.first_free(base, base + (1 << 20), false), Some(base));
        s.remove(base + 256 * 50 + 7);
        assert_eq!(s.joined.len(), 2);
        assert_eq!(
            s.first_free(base, base + (1 << 20), true),
            Some(base + 256 * 50 + 7)
        );
        assert_eq!(s.count_in(base, base + 255), 254);
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(300))]
        /// Any sequence of inserts and removes answers like a plain set.
        #[test]
        fn agrees_with_a_naive_set(ops in proptest::collection::vec((any::<bool>(), 0u128..1200), 1..300),
                                   queries in proptest::collection::vec((0u128..1200, 0u128..400, any::<bool>()), 1..30),
                                   v4 in any::<bool>()) {
            let family = if v4 { Family::V4 } else { Family::V6 };
            let base = 10u128 << 24 | 200; // starts near a /24 boundary
            let mut s = UsedSet::new(family);
            let mut naive = BTreeSet::new();
            for (add, off) in ops {
                let x = base + off;
                if add {
                    prop_assert_eq!(s.insert(x), naive.insert(x));
                } else {
                    prop_assert_eq!(s.remove(x), naive.remove(&x));
                }
                prop_assert_eq!(s.len(), naive.len() as u128);
            }
            for (lo, span, skip) in queries {
                let (lo, hi) = (base + lo, base + lo + span);
                prop_assert_eq!(s.first_free(lo, hi, skip), naive_first_free(&naive, family, lo, hi, skip), "[{}, {}] skip={}", lo, hi, skip);
                prop_assert_eq!(s.count_in(lo, hi), naive.range(lo..=hi).count() as u128);
            }
        }
    }
}
