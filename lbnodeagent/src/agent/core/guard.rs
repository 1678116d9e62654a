//! The VIP guard's ledger: the firewall the cluster calls for, whether it
//! must be planned again, and the plan last given out, so that the shell
//! hears of a plan only when it changed.
//!
//! What the host calls its own (and the guard must leave open) is the
//! core's to say: it knows which addresses this run held.

use std::collections::BTreeSet;
use std::net::IpAddr;

use crate::model::{Firewall, FirewallPlan};

#[derive(Default)]
pub(super) struct Guard {
    /// What the cluster's Services call for; none before a first view,
    /// when a table a previous run left stays as it is.
    rules: Option<Firewall>,
    /// The plan last given out.
    sent: Option<FirewallPlan>,
    /// The rules, the settings or the host's own addresses moved.
    dirty: bool,
}

impl Guard {
    /// What a new view of the cluster calls for.
    pub fn set_rules(&mut self, rules: Firewall) {
        self.rules = Some(rules);
        self.dirty = true;
    }

    /// Something the plan depends on moved: it is made again.
    pub fn touch(&mut self) {
        self.dirty = true;
    }

    /// The plan, when it must be made again (`unable`: a node that cannot
    /// change the firewall makes none) and differs from the last given
    /// out. `on` is the setting; `own` the host's own addresses, asked for
    /// only when a plan is made.
    pub fn plan(
        &mut self,
        unable: bool,
        on: bool,
        own: impl FnOnce() -> BTreeSet<IpAddr>,
    ) -> Option<FirewallPlan> {
        if !std::mem::take(&mut self.dirty) || unable {
            return None;
        }
        let plan = match (&self.rules, on) {
            (None, _) => return None,
            (Some(f), true) => FirewallPlan::On(f.without(&own())),
            (Some(_), false) => FirewallPlan::Off,
        };
        if self.sent.as_ref() == Some(&plan) {
            return None;
        }
        self.sent = Some(plan.clone());
        Some(plan)
    }

    /// The plan last given out, if any yet.
    pub fn sent(&self) -> Option<&FirewallPlan> {
        self.sent.as_ref()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rules(ips: &[&str]) -> Firewall {
        Firewall {
            vips: ips.iter().map(|s| s.parse().unwrap()).collect(),
            open: BTreeSet::new(),
        }
    }

    #[test]
    fn a_plan_is_given_once_per_change_and_never_before_a_view() {
        let mut g = Guard::default();
        g.touch();
        assert!(g.plan(false, true, BTreeSet::new).is_none(), "no view yet");
        g.set_rules(rules(&["10.0.0.1", "10.0.0.2"]));
        assert_eq!(
            g.plan(false, true, BTreeSet::new),
            Some(FirewallPlan::On(rules(&["10.0.0.1", "10.0.0.2"])))
        );
        // Nothing moved: nothing given, and the host's addresses not asked.
        assert!(g.plan(false, true, || unreachable!()).is_none());
        // Moved, but the same plan comes out: nothing given.
        g.touch();
        assert!(g.plan(false, true, BTreeSet::new).is_none());
        // The host's own address is left out.
        g.touch();
        let own: BTreeSet<IpAddr> = ["10.0.0.2".parse().unwrap()].into();
        assert_eq!(
            g.plan(false, true, || own),
            Some(FirewallPlan::On(rules(&["10.0.0.1"])))
        );
        g.touch();
        assert_eq!(g.plan(false, false, BTreeSet::new), Some(FirewallPlan::Off));
        assert_eq!(g.sent(), Some(&FirewallPlan::Off));
        // A node that cannot change the firewall plans nothing.
        g.set_rules(rules(&["10.0.0.3"]));
        assert!(g.plan(true, true, BTreeSet::new).is_none());
    }
}
