//! This node as its own election sees it: drained or not, the networks
//! its links put it on, and the member the election last had for it.
//! Built from its own state, not from the echo of its gossip, which lags.

use std::sync::Arc;

use crate::election::{Member, OnLink};
use crate::model::UpstreamLost;

use super::links::Links;

pub(super) struct Own {
    /// Its operator drained this node (see
    /// [`Input::Drain`](super::Input::Drain)), in force or not.
    drain: bool,
    /// The interfaces whose gateway stopped answering (see
    /// [`Input::Upstream`](super::Input::Upstream)).
    upstream_lost: UpstreamLost,
    /// `links.on_link(upstream_lost)`, worked out when either changes:
    /// this node's member is handed to the election at every membership
    /// change.
    on_link: Arc<[OnLink]>,
    /// The member the election last had for this node.
    elected: Option<Member>,
}

impl Own {
    pub(super) fn new(links: &Links) -> Own {
        Own {
            drain: false,
            upstream_lost: UpstreamLost::new(),
            on_link: links.on_link(&UpstreamLost::new()).into(),
            elected: None,
        }
    }

    /// Whether its operator drained this node.
    pub(super) fn drain(&self) -> bool {
        self.drain
    }

    /// Its operator's word: true when it changed.
    pub(super) fn set_drain(&mut self, drain: bool) -> bool {
        std::mem::replace(&mut self.drain, drain) != drain
    }

    /// New links: the networks they put this node on.
    pub(super) fn set_links(&mut self, links: &Links) {
        self.on_link = links.on_link(&self.upstream_lost).into();
    }

    /// The interfaces whose gateway is lost now: true when the networks
    /// this node is on changed with them.
    pub(super) fn set_upstream(&mut self, lost: UpstreamLost, links: &Links) -> bool {
        if lost == self.upstream_lost {
            return false;
        }
        self.upstream_lost = lost;
        let on_link: Arc<[OnLink]> = links.on_link(&self.upstream_lost).into();
        let changed = on_link != self.on_link;
        self.on_link = on_link;
        changed
    }

    pub(super) fn upstream_lost(&self) -> &UpstreamLost {
        &self.upstream_lost
    }

    pub(super) fn on_link(&self) -> Arc<[OnLink]> {
        Arc::clone(&self.on_link)
    }

    /// This node's member, while it is a candidate (`running`): drained
    /// only where drains are in force.
    pub(super) fn member(
        &self,
        node: &str,
        running: bool,
        drain_in_force: bool,
        virtual_mode: bool,
    ) -> Option<Member> {
        running.then(|| Member {
            node: node.into(),
            leaving: false,
            drained: self.drain && drain_in_force,
            virtual_mode,
            on_link: self.on_link(),
        })
    }

    /// The member handed to the election now: true when it differs from
    /// the last (its interfaces or its candidacy changed, so any duty may
    /// have).
    pub(super) fn elected(&mut self, member: Option<Member>) -> bool {
        if member == self.elected {
            return false;
        }
        self.elected = member;
        true
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Drained only where drains are in force, and no member at all
    /// while not a candidate; the election hears of a change once.
    #[test]
    fn the_own_member_follows_drain_candidacy_and_changes_once() {
        let mut own = Own::new(&Links::default());
        assert!(own.member("a", false, true, false).is_none());
        assert!(own.set_drain(true) && !own.set_drain(true));
        let m = own.member("a", true, true, false).unwrap();
        assert!(m.drained && m.node == "a");
        assert!(!own.member("a", true, false, false).unwrap().drained);
        assert!(own.elected(Some(m.clone())));
        assert!(!own.elected(Some(m)), "the same member is no change");
        assert!(own.elected(None));
    }
}
