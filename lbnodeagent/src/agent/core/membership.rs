//! Membership as this node acts on it: gossip's view, the nodes whose
//! leaving beat came, the owners its sessions found silent, and what each
//! live node's published state came to show and when. One part, so that
//! the view the election, the conflict rule and the hand-overs read is
//! made in one place from gossip's and the sessions' word.

use std::collections::{BTreeMap, BTreeSet};
use std::net::IpAddr;
use std::sync::Arc;
use std::time::Instant;

use tracing::{debug, info};

use crate::model::{MemberInfo, MembershipView, Status};

use super::sessions::Sessions;
use super::{HANDOVER_MAX, TAKEOVER_WINDOW};
use crate::election::NodeName;

pub(super) struct Membership {
    /// Membership as gossip reports it.
    gossip: Arc<MembershipView>,
    /// Membership as this node acts on it: gossip's, without the owners
    /// its sessions found silent. Most of the time gossip's own, shared.
    view: Arc<MembershipView>,
    /// Nodes whose leaving beat said they go (their agent on SIGTERM, or
    /// `cleanup` for a dead one), with the gossip generation they had
    /// then: acted on as leaving (as if gossip said so already) until
    /// gossip shows another generation or loses them.
    left: BTreeMap<NodeName, u64>,
    /// Nodes gossip had lost when their leaving beat came, or lost after
    /// it came, when, and the run (gossip generation) that left, where
    /// known: `cleanup` of a killed agent sends the beat and the failure
    /// detector's leave, and the leave can come first. Their host's
    /// answers are the last of a hand-over for a hand-over's time, as a
    /// graceful leaver's are (see `Core::judge`), unless gossip shows
    /// another run of the node by then: a restarted agent's answers are
    /// its own (seed 12100112819).
    left_gone: BTreeMap<NodeName, (Instant, Option<u64>)>,
    /// When each member was last seen live, for the takeover metric.
    lost_at: BTreeMap<NodeName, Instant>,
    /// When each live node's published VIPs came to include each VIP, in
    /// our views: a peer's word that it holds a VIP counts against this
    /// node's fresh take only if it came after (see `Core::holds`). Per
    /// VIP, not per node: a publication about another VIP that arrives
    /// late must not make an old word look new.
    vips_gained: BTreeMap<NodeName, BTreeMap<IpAddr, Instant>>,
}

/// What a new view changed, for the parts that follow it.
#[derive(Debug, Default, PartialEq, Eq)]
pub(super) struct ViewChange {
    /// The members (the election's candidates) changed.
    pub members_changed: bool,
    /// Indices into the new view's `gone` of the nodes whose published
    /// state (MACs, VIPs) is new, then into its `nodes`: what the
    /// conflict rule learns again, the gone first, so that who holds a VIP
    /// now wins over a gone node's last word.
    pub gone_news: Vec<usize>,
    pub live_news: Vec<usize>,
}

impl Membership {
    pub(super) fn new() -> Membership {
        Membership {
            gossip: Arc::new(MembershipView::empty()),
            view: Arc::new(MembershipView::empty()),
            left: BTreeMap::new(),
            left_gone: BTreeMap::new(),
            lost_at: BTreeMap::new(),
            vips_gained: BTreeMap::new(),
        }
    }

    /// The view this node acts on.
    pub(super) fn view(&self) -> &Arc<MembershipView> {
        &self.view
    }

    /// Gossip's own view.
    pub(super) fn gossip(&self) -> &Arc<MembershipView> {
        &self.gossip
    }

    /// Gossip's new word; [`Membership::apply`] makes the view from it.
    pub(super) fn set_gossip(&mut self, view: MembershipView) {
        self.gossip = Arc::new(view);
    }

    /// Whether `generation` of `node` (a beat's, or the run whose leave
    /// was noted) is another run than the one gossip shows. An unknown
    /// generation (an agent of an older release) never is.
    pub(super) fn of_another_run(&self, node: &str, generation: Option<u64>) -> bool {
        generation.is_some_and(|g| self.gossip.node(node).is_some_and(|n| n.generation != g))
    }

    /// `node`'s leaving beat says it goes: its addresses answer until
    /// others do. True when that is news for the view.
    pub(super) fn left_by_beat(
        &mut self,
        me: &str,
        node: NodeName,
        beat_generation: Option<u64>,
        now: Instant,
    ) -> bool {
        if node == me {
            return false;
        }
        let Some(generation) = self.gossip.node(&node).map(|n| n.generation) else {
            if self.lost_at.contains_key(&node) {
                // Lost a moment ago: its `cleanup` removes each address
                // once another node answers for it, so an answer from its
                // host is no owner to stay off for.
                info!(%node, "its leaving beat came after gossip lost it; taking its addresses as from a leaving node");
                // A VIP yielded to it and wanted here is unsettled, so
                // decided again at this very step: the yield ends there.
                self.note_left_gone(node, beat_generation, now);
            } else {
                debug!(%node, "leaving beat from a node gossip does not show live");
            }
            return false;
        };
        if self.left.get(&node) == Some(&generation) {
            return false;
        }
        info!(%node, "its leaving beat says it goes; taking its addresses as from a leaving node");
        self.left.insert(node, generation);
        true
    }

    /// `node` beat as alive under its own key in run `generation`: a
    /// leaving mark on that run was not its own, and ends. True when one
    /// did.
    pub(super) fn alive_by_beat(&mut self, node: &str, generation: Option<u64>) -> bool {
        if generation.is_some() && self.left.get(node) == generation.as_ref() {
            self.left.remove(node);
            return true;
        }
        false
    }

    /// Whether `node`'s leaving beat came (and gossip still shows that run).
    pub(super) fn left(&self, node: &str) -> bool {
        self.left.contains_key(node)
    }

    /// `node`'s leaving beat came after gossip had lost it, within a
    /// hand-over's time, and gossip shows no other run of it since. A run
    /// started after the leave is not leaving: it answers for what it took
    /// itself, and an agent of it that stalls is stayed off for like any
    /// (seed 12100112819: a node restarted 0.2 s after its old run left,
    /// took its VIPs back, and stalled; its peers found it silent and took
    /// them all while its host still answered, 1.6 s after the old run's
    /// leave, its answers heard as the old run's last).
    pub(super) fn left_lately(&self, node: &str, now: Instant) -> bool {
        self.left_gone.get(node).is_some_and(|(t, generation)| {
            now.saturating_duration_since(*t) < HANDOVER_MAX
                && !self.of_another_run(node, *generation)
        })
    }

    /// When `node` was last seen live, if it was lost lately.
    pub(super) fn lost_at(&self, node: &str) -> Option<Instant> {
        self.lost_at.get(node).copied()
    }

    /// Whether `node`'s state, by our views, came to show `ip` after `t`.
    pub(super) fn shown_after(&self, node: &str, ip: IpAddr, t: Instant) -> bool {
        self.vips_gained
            .get(node)
            .and_then(|g| g.get(&ip))
            .is_some_and(|gained| *gained > t)
    }

    /// `node` left gracefully and gossip no longer shows it: its host's
    /// answers for a hand-over's time are the last of its hand-over.
    fn note_left_gone(&mut self, node: NodeName, generation: Option<u64>, now: Instant) {
        self.left_gone
            .retain(|_, (t, _)| now.saturating_duration_since(*t) < HANDOVER_MAX);
        self.left_gone.insert(node, (now, generation));
    }

    /// Makes the view this node acts on: gossip's, without the owners
    /// whose sessions went silent (see [`super::sessions`]), and with the
    /// nodes whose leaving beat came as leaving; and learns who was lost
    /// and what each live node's state came to show.
    pub(super) fn apply(&mut self, sessions: &Sessions, me: &str, now: Instant) -> ViewChange {
        // A node whose leaving beat came and that gossip has since lost
        // left gracefully: its host's answers heard a moment later are
        // the last of its hand-over (it let go once this node answered),
        // not a second owner to let go to (seed 10090839114: the VIP
        // went unanswered).
        let gossip = Arc::clone(&self.gossip);
        let gone_after_leaving: Vec<(NodeName, u64)> = self
            .left
            .iter()
            .filter(|(n, _)| gossip.node(n).is_none())
            .map(|(n, g)| (n.clone(), *g))
            .collect();
        for (n, generation) in gone_after_leaving {
            self.note_left_gone(n, Some(generation), now);
        }
        self.left
            .retain(|n, g| gossip.node(n).is_some_and(|i| i.generation == *g));
        let view = if self.left.is_empty() && !sessions.any_suspect() {
            gossip
        } else {
            let mut view = (*gossip).clone();
            let left = &self.left;
            if !left.is_empty() {
                view.members.retain(|m| !left.contains_key(&m.node));
                for n in &mut view.nodes {
                    if n.status == Status::Alive && left.contains_key(&n.node) {
                        Arc::make_mut(n).status = Status::Leaving;
                    }
                }
            }
            if sessions.any_suspect() {
                // A node whose leaving beat came is leaving, not silent:
                // its host answers until others do, and it is handed over
                // as such.
                let suspect = |n: &str| n != me && sessions.is_suspect(n) && !left.contains_key(n);
                view.members.retain(|m| !suspect(&m.node));
                let (silent, nodes): (Vec<_>, Vec<_>) =
                    view.nodes.into_iter().partition(|n| suspect(&n.node));
                view.nodes = nodes;
                view.gone.extend(silent);
            }
            Arc::new(view)
        };
        // Most views are of a peer's state (its held VIPs), with the same
        // members: the election has them already, and nobody was lost.
        let members_changed = self.view.members != view.members;
        if members_changed {
            let members: BTreeSet<&str> = view.members.iter().map(|m| m.node.as_str()).collect();
            for m in &self.view.members {
                if !members.contains(m.node.as_str()) {
                    self.lost_at.insert(m.node.clone(), now);
                }
            }
        }
        self.lost_at
            .retain(|_, t| now.saturating_duration_since(*t) < TAKEOVER_WINDOW * 3);
        let before = ByName::of(&self.view);
        // Whose published state changed, of the live nodes: what it holds
        // is learnt again below.
        let mut live_news = Vec::with_capacity(view.nodes.len());
        for (i, n) in view.nodes.iter().enumerate() {
            let b = before.get(&n.node, i);
            if b.is_none_or(|(b, _)| b.macs != n.macs || b.vips != n.vips) {
                live_news.push(i);
            }
            let live_before = b.filter(|(b, live)| *live && b.generation == n.generation);
            match live_before {
                Some((b, _)) if b.vips == n.vips => {}
                Some((b, _)) => {
                    let gained = match self.vips_gained.get_mut(&n.node) {
                        Some(gained) => gained,
                        None => self.vips_gained.entry(n.node.clone()).or_default(),
                    };
                    gained.retain(|ip, _| n.vips.contains(ip));
                    for ip in n.vips.difference(&b.vips) {
                        gained.insert(*ip, now);
                    }
                }
                None => {
                    let all = n.vips.iter().map(|ip| (*ip, now)).collect();
                    self.vips_gained.insert(n.node.clone(), all);
                }
            }
        }
        if self.vips_gained.len() > view.nodes.len() {
            let live: BTreeSet<&str> = view.nodes.iter().map(|n| n.node.as_str()).collect();
            self.vips_gained
                .retain(|node, _| live.contains(node.as_str()));
        }
        // Only what changed: a view comes with every gossip update, and
        // most of its nodes are as they were.
        let gone_news = view
            .gone
            .iter()
            .enumerate()
            .filter(|(_, n)| {
                before
                    .get(&n.node, usize::MAX)
                    .is_none_or(|(b, _)| b.macs != n.macs || b.vips != n.vips)
            })
            .map(|(i, _)| i)
            .collect();
        self.view = view;
        ViewChange {
            members_changed,
            gone_news,
            live_news,
        }
    }
}

/// The previous view's node of a name, live over gone (and, of a name
/// listed twice, the later), as a map built from the gone and then the
/// live nodes would give it. Looked up for every node of every view, many
/// views a second: gossip lists each kind sorted by name, once each, so a
/// lookup is a binary search, most often a single comparison at the
/// node's place in the new view. Only a view listed otherwise (the silent
/// owners moved among the gone) has the map built.
enum ByName<'a> {
    Sorted {
        live: &'a [Arc<MemberInfo>],
        gone: &'a [Arc<MemberInfo>],
    },
    Map(BTreeMap<&'a str, (&'a MemberInfo, bool)>),
}

impl<'a> ByName<'a> {
    fn of(view: &'a MembershipView) -> ByName<'a> {
        let sorted = |nodes: &[Arc<MemberInfo>]| nodes.windows(2).all(|w| w[0].node < w[1].node);
        if sorted(&view.nodes) && sorted(&view.gone) {
            return ByName::Sorted {
                live: &view.nodes,
                gone: &view.gone,
            };
        }
        ByName::Map(
            view.gone
                .iter()
                .map(|n| (n.node.as_str(), (&**n, false)))
                .chain(view.nodes.iter().map(|n| (n.node.as_str(), (&**n, true))))
                .collect(),
        )
    }

    /// `at`: where the node is likely listed among the live ones.
    fn get(&self, node: &str, at: usize) -> Option<(&'a MemberInfo, bool)> {
        let (live, gone) = match self {
            ByName::Map(map) => return map.get(node).copied(),
            ByName::Sorted { live, gone } => (*live, *gone),
        };
        if let Some(n) = live.get(at).filter(|n| n.node == node) {
            return Some((n, true));
        }
        let find = |nodes: &'a [Arc<MemberInfo>]| {
            let i = nodes.binary_search_by(|n| n.node.as_str().cmp(node)).ok()?;
            Some(&*nodes[i])
        };
        find(live)
            .map(|n| (n, true))
            .or_else(|| find(gone).map(|n| (n, false)))
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;

    fn info(node: &str, generation: u64) -> MemberInfo {
        let mut n = MembershipView::empty().local;
        n.node = node.into();
        n.generation = generation;
        n
    }

    fn ip(s: &str) -> IpAddr {
        s.parse().unwrap()
    }

    /// A gossip view of live `nodes`, each a member, alive, in the run
    /// paired with it.
    fn gossip_runs(nodes: &[(&str, u64)]) -> MembershipView {
        let mut view = MembershipView::empty();
        view.nodes = nodes
            .iter()
            .map(|(n, g)| {
                let mut n = info(n, *g);
                n.status = Status::Alive;
                Arc::new(n)
            })
            .collect();
        view.members = view.nodes.iter().map(|n| n.to_member()).collect();
        view
    }

    /// A gossip view of live `nodes` (each a member, alive, in run 1),
    /// `vips` published by the first.
    fn gossip(nodes: &[&str], vips: &[&str]) -> MembershipView {
        let runs: Vec<(&str, u64)> = nodes.iter().map(|n| (*n, 1)).collect();
        let mut view = gossip_runs(&runs);
        if let Some(first) = view.nodes.first_mut() {
            Arc::make_mut(first).vips = Arc::new(vips.iter().map(|s| ip(s)).collect());
        }
        view.members = view.nodes.iter().map(|n| n.to_member()).collect();
        view
    }

    /// What a map built from the gone and then the live nodes gives: the
    /// rule `ByName` keeps, sorted or not, at any hint.
    #[test]
    fn by_name_finds_what_a_map_of_the_view_would() {
        let views = [
            // As gossip lists them: each kind sorted, once each.
            (
                vec![info("a", 1), info("c", 1), info("d", 1)],
                vec![info("b", 1), info("e", 1)],
            ),
            // A name both live and gone, and names listed twice.
            (
                vec![info("c", 2), info("a", 1), info("c", 3)],
                vec![info("c", 1), info("b", 1), info("b", 2)],
            ),
            (Vec::new(), vec![info("b", 1)]),
        ];
        for (nodes, gone) in views {
            let view = MembershipView {
                nodes: nodes.into_iter().map(Arc::new).collect(),
                gone: gone.into_iter().map(Arc::new).collect(),
                ..MembershipView::empty()
            };
            let map: BTreeMap<&str, (&MemberInfo, bool)> = view
                .gone
                .iter()
                .map(|n| (n.node.as_str(), (&**n, false)))
                .chain(view.nodes.iter().map(|n| (n.node.as_str(), (&**n, true))))
                .collect();
            let by_name = ByName::of(&view);
            for name in ["a", "b", "c", "d", "e", "f"] {
                let want = map.get(name).map(|(n, live)| (n.generation, *live));
                for at in [0, 1, 2, usize::MAX] {
                    let got = by_name.get(name, at).map(|(n, live)| (n.generation, live));
                    assert_eq!(got, want, "{name} at {at}");
                }
            }
        }
    }

    /// A leaving beat makes its node leaving in the view until gossip
    /// shows another run of it or loses it; lost, its host's answers
    /// count as the last of its hand-over for a hand-over's time.
    #[test]
    fn a_leaving_beat_holds_until_gossip_moves_on() {
        let t0 = Instant::now();
        let sessions = Sessions::default();
        let mut m = Membership::new();
        m.set_gossip(gossip(&["a", "b"], &[]));
        m.apply(&sessions, "a", t0);
        assert!(
            !m.left_by_beat("a", "a".into(), Some(1), t0),
            "never itself"
        );
        assert!(m.left_by_beat("a", "b".into(), Some(1), t0));
        assert!(!m.left_by_beat("a", "b".into(), Some(1), t0), "news once");
        let change = m.apply(&sessions, "a", t0);
        assert!(change.members_changed);
        let b = m.view().node("b").expect("still listed");
        assert_eq!(b.status, Status::Leaving);
        assert!(!m.view().members.iter().any(|n| n.node == "b"));
        assert_eq!(m.lost_at("b"), Some(t0), "lost from the members");
        // Beating alive in the same run: the mark was not its own.
        assert!(!m.alive_by_beat("b", Some(2)), "another run's beat");
        assert!(m.alive_by_beat("b", Some(1)));
        assert!(!m.left("b"));
        // Left again, then lost by gossip: left lately for a hand-over's
        // time, and no longer left.
        assert!(m.left_by_beat("a", "b".into(), Some(1), t0));
        m.apply(&sessions, "a", t0);
        let t1 = t0 + Duration::from_millis(10);
        m.set_gossip(gossip(&["a"], &[]));
        m.apply(&sessions, "a", t1);
        assert!(!m.left("b"));
        assert!(m.left_lately("b", t1 + HANDOVER_MAX - Duration::from_millis(1)));
        assert!(!m.left_lately("b", t1 + HANDOVER_MAX));
        // Gossip shows b's run again: its answers are still the last of
        // that run's hand-over.
        m.set_gossip(gossip(&["a", "b"], &[]));
        assert!(m.left_lately("b", t1 + Duration::from_millis(500)));
        // Another run of b: a restarted agent, not a leaving one.
        m.set_gossip(gossip_runs(&[("a", 1), ("b", 2)]));
        assert!(!m.left_lately("b", t1 + Duration::from_millis(500)));
        // A beat from a run gossip does not show.
        m.set_gossip(gossip(&["a", "b"], &[]));
        assert!(m.of_another_run("b", Some(7)));
        assert!(!m.of_another_run("b", Some(1)));
        assert!(!m.of_another_run("b", None));
    }

    /// What a live node publishes is dated by the view it first came in;
    /// only the nodes whose state moved are news.
    #[test]
    fn each_vip_a_node_publishes_is_dated_by_the_view_it_came_in() {
        let t0 = Instant::now();
        let sessions = Sessions::default();
        let mut m = Membership::new();
        m.set_gossip(gossip(&["a", "b"], &["10.0.0.1"]));
        let change = m.apply(&sessions, "b", t0);
        assert_eq!(change.live_news, [0, 1]);
        let t1 = t0 + Duration::from_secs(1);
        m.set_gossip(gossip(&["a", "b"], &["10.0.0.1", "10.0.0.2"]));
        let change = m.apply(&sessions, "b", t1);
        assert!(!change.members_changed);
        assert_eq!(change.live_news, [0], "only a's state moved");
        let half = t0 + Duration::from_millis(500);
        assert!(m.shown_after("a", ip("10.0.0.1"), t0 - Duration::from_millis(1)));
        assert!(!m.shown_after("a", ip("10.0.0.1"), half), "an old word");
        assert!(m.shown_after("a", ip("10.0.0.2"), half), "a new one");
        assert!(!m.shown_after("b", ip("10.0.0.2"), t0));
        // The same view again is no news, and dates nothing anew.
        let change = m.apply(&sessions, "b", t1 + Duration::from_secs(1));
        assert!(change.live_news.is_empty() && change.gone_news.is_empty());
        assert!(!m.shown_after("a", ip("10.0.0.2"), t1));
    }
}
