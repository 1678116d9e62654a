//! Which owners this node watches for silence, and when that is worked
//! out again: once the election moved, at most every [`WATCH_EVERY`] (it
//! runs one election per VIP), and the owners anew only when the
//! election's epoch or this node's candidacy changed since.

use std::time::Instant;

use super::WATCH_EVERY;
use super::sessions::Owners;

pub(super) struct Watching {
    /// The owners are worked out again then (the election moved).
    due: Option<Instant>,
    /// When they last were.
    at: Instant,
    /// The election's epoch and this node's candidacy they were worked
    /// out for.
    key: Option<(u64, bool)>,
    owners: Owners,
}

impl Watching {
    pub fn new(now: Instant) -> Watching {
        Watching {
            due: None,
            at: now,
            key: None,
            owners: Owners::new(),
        }
    }

    /// The election moved: the owners are worked out again, now or as
    /// soon as [`WATCH_EVERY`] allows.
    pub fn moved(&mut self, now: Instant) {
        self.due.get_or_insert(now);
    }

    /// When the core must wake for it, if it is due.
    pub fn deadline(&self) -> Option<Instant> {
        self.due.map(|due| due.max(self.at + WATCH_EVERY))
    }

    /// Whether the owners are worked out again now.
    pub fn take_due(&mut self, now: Instant) -> bool {
        let Some(due) = self.due else { return false };
        if now < due || now < self.at + WATCH_EVERY {
            return false;
        }
        self.due = None;
        self.at = now;
        true
    }

    /// The owners for the election's `epoch` and this node's candidacy
    /// (`running`): those last worked out when neither changed, else
    /// `work_out`'s.
    pub fn owners(
        &mut self,
        epoch: u64,
        running: bool,
        work_out: impl FnOnce() -> Owners,
    ) -> &Owners {
        let key = (epoch, running);
        if self.key != Some(key) {
            self.owners = work_out();
            self.key = Some(key);
        }
        &self.owners
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn owners_are_worked_out_at_most_every_period_and_only_when_the_election_moved() {
        let t = Instant::now();
        let mut w = Watching::new(t);
        assert!(!w.take_due(t), "nothing moved");
        assert_eq!(w.deadline(), None);
        w.moved(t);
        assert_eq!(w.deadline(), Some(t + WATCH_EVERY));
        assert!(!w.take_due(t), "within the period since the last");
        assert!(w.take_due(t + WATCH_EVERY));
        assert!(!w.take_due(t + WATCH_EVERY * 3), "done");
        let mut asked = 0;
        w.owners(1, true, || {
            asked += 1;
            Owners::new()
        });
        w.owners(1, true, || {
            asked += 1;
            Owners::new()
        });
        assert_eq!(asked, 1, "the same epoch: worked out once");
        w.owners(1, false, || {
            asked += 1;
            Owners::new()
        });
        assert_eq!(asked, 2, "another candidacy: again");
    }
}
