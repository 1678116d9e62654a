//! The wire's own clock: when held addresses are renewed and refreshed,
//! and when the LAN is asked who answers for the VIPs held here and those
//! yielded to another node. Each timer runs from its last firing, so one
//! step that fires several keeps them apart, and the core wakes for the
//! earliest that matters.

use std::net::IpAddr;
use std::time::{Duration, Instant};

use super::conflict::{LAPSE_PROBE, OWNER_PROBE, YIELD_PROBE};

pub(super) struct Cadence {
    /// The next renewal of every held address (while they have a
    /// lifetime).
    renew: Option<Instant>,
    /// The next refresh round of every held VIP, while
    /// `announce.refresh_interval` is set.
    refresh: Option<Instant>,
    owner_probe: Instant,
    /// Where the owner probes at rest go on from: the last VIP asked
    /// about.
    owner_probe_after: Option<IpAddr>,
    yield_probe: Instant,
    lapse_probe: Instant,
}

/// Which yielded VIPs to ask about now.
#[derive(Debug, PartialEq, Eq)]
pub(super) enum YieldProbe {
    /// Every one.
    All,
    /// Those whose owner's addresses are about to lapse.
    Lapsing,
}

impl Cadence {
    pub fn new(now: Instant) -> Cadence {
        Cadence {
            renew: None,
            refresh: None,
            owner_probe: now + OWNER_PROBE,
            owner_probe_after: None,
            yield_probe: now + YIELD_PROBE,
            lapse_probe: now,
        }
    }

    /// The next renewal, if one is set.
    pub fn renew_at(&self) -> Option<Instant> {
        self.renew
    }

    /// Whether the renewal is due now (`every`: the renewal period, none
    /// for addresses that do not lapse); the next is set from now.
    pub fn renew_due(&mut self, every: Option<Duration>, now: Instant) -> bool {
        let Some(every) = every else {
            self.renew = None;
            return false;
        };
        let due = *self.renew.get_or_insert(now + every);
        if now < due {
            return false;
        }
        self.renew = Some(now + every);
        true
    }

    pub fn refresh_at(&self) -> Option<Instant> {
        self.refresh
    }

    /// Whether a refresh round is due now; the next is set from now.
    pub fn refresh_due(&mut self, every: Duration, now: Instant) -> bool {
        let due = *self.refresh.get_or_insert(now + every);
        if now < due {
            return false;
        }
        self.refresh = Some(now + every);
        true
    }

    /// The refresh period changed: the next round counts from the next
    /// step.
    pub fn restart_refresh(&mut self) {
        self.refresh = None;
    }

    /// Which yielded VIPs are asked about now, if any: all of them every
    /// [`YIELD_PROBE`], and in between, every [`LAPSE_PROBE`], those whose
    /// owner is about to lapse.
    pub fn yield_probe_due(&mut self, now: Instant) -> Option<YieldProbe> {
        if now >= self.yield_probe {
            self.yield_probe = now + YIELD_PROBE;
            self.lapse_probe = now + LAPSE_PROBE;
            Some(YieldProbe::All)
        } else if now >= self.lapse_probe {
            self.lapse_probe = now + LAPSE_PROBE;
            Some(YieldProbe::Lapsing)
        } else {
            None
        }
    }

    pub fn yield_probe_at(&self) -> Instant {
        self.yield_probe
    }

    pub fn lapse_probe_at(&self) -> Instant {
        self.lapse_probe
    }

    /// Whether the VIPs held here are asked about now; the next time is
    /// set from now.
    pub fn owner_probe_due(&mut self, now: Instant) -> bool {
        if now < self.owner_probe {
            return false;
        }
        self.owner_probe = now + OWNER_PROBE;
        true
    }

    pub fn owner_probe_at(&self) -> Instant {
        self.owner_probe
    }

    /// The last VIP asked about at rest, where the next turn goes on from.
    pub fn owner_probe_after(&self) -> Option<IpAddr> {
        self.owner_probe_after
    }

    pub fn owner_probed(&mut self, ip: IpAddr) {
        self.owner_probe_after = Some(ip);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_timer_runs_from_its_last_firing() {
        let t = Instant::now();
        let mut c = Cadence::new(t);
        let every = Duration::from_secs(5);
        // The first renewal comes a period after the first ask.
        assert!(!c.renew_due(Some(every), t));
        assert_eq!(c.renew_at(), Some(t + every));
        assert!(c.renew_due(Some(every), t + every + Duration::from_secs(1)));
        assert_eq!(c.renew_at(), Some(t + every * 2 + Duration::from_secs(1)));
        // Addresses that do not lapse are never renewed.
        assert!(!c.renew_due(None, t + every * 9));
        assert_eq!(c.renew_at(), None);
        // Refresh: the same, and a new period starts afresh.
        assert!(!c.refresh_due(every, t));
        assert!(c.refresh_due(every, t + every));
        c.restart_refresh();
        assert_eq!(c.refresh_at(), None);
    }

    #[test]
    fn yielded_vips_are_all_asked_about_in_turn_and_the_lapsing_ones_between() {
        let t = Instant::now();
        let mut c = Cadence::new(t);
        assert_eq!(c.yield_probe_due(t), Some(YieldProbe::Lapsing));
        assert_eq!(c.yield_probe_due(t), None);
        assert_eq!(
            c.yield_probe_due(t + LAPSE_PROBE),
            Some(YieldProbe::Lapsing)
        );
        assert_eq!(c.yield_probe_due(t + YIELD_PROBE), Some(YieldProbe::All));
        assert_eq!(c.lapse_probe_at(), t + YIELD_PROBE + LAPSE_PROBE);
        assert!(!c.owner_probe_due(t));
        assert!(c.owner_probe_due(t + OWNER_PROBE));
        assert_eq!(c.owner_probe_at(), t + OWNER_PROBE * 2);
    }
}
