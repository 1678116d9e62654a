//! Never two owners: what the loop does when another MAC answers for a VIP
//! this node holds (SPEC's promise, against the failure every L2 balancer
//! accepts: a firewall drops gossip while ARP still flows, each side thinks
//! the other dead, and both add the VIP).
//!
//! An owner asks the LAN about each VIP it holds once a second (an ARP
//! probe or a DAD-style solicitation, which no cache learns from) and hears
//! every gratuitous ARP and advertisement. A claim from a MAC that a hostlb
//! node published in gossip (ever, so also a member now considered dead) is
//! settled by one rule both sides apply alike: the election's order with
//! liveness ignored ([`Election::outranks`]). The lower-ranked node removes
//! the VIP and stays off while it still hears the other answer (probing
//! every [`YIELD_PROBE`]); once the answers stop for [`YIELD_HOLD`] it may
//! take it again. A claim from a MAC no hostlb node published (a host
//! configured by hand) is reported (a bounded record of the last few MACs
//! per VIP, a line a minute at most) and not fought over. Nor is a claim
//! in the name of a node whose agent is known gone: no answer of its host
//! can be its own.
//!
//! When the outranking owner's agent is gone (killed or frozen, its host
//! still up), its addresses answer until they lapse. Its last beat (see
//! `sessions`) said when; from [`LAPSE_EARLY`] before that the yielded VIP
//! is asked about every [`LAPSE_PROBE`] and taken once [`LAPSE_HOLD`] passes
//! without an answer: the takeover follows the lapse by tens of
//! milliseconds, not by a silence of [`YIELD_HOLD`].
//!
//! A node about to take a VIP that no live node is handing over asks first
//! and listens for [`PRECHECK`], so a crashed or frozen agent's address that
//! still answers, or the far side of a gossip partition, does not get a
//! second owner even briefly.
//!
//! Pure: the core ([`super::Core`]) feeds claims, gossip and the clock in,
//! and acts on the verdicts.

use std::collections::{BTreeMap, BTreeSet, VecDeque};
use std::net::IpAddr;
use std::time::{Duration, Instant};

use foldhash::HashMap;

use super::api::{AgentRecord, ConflictSeen};
use super::links::Want;
use super::sessions::Lapse;
use crate::election::Election;
use crate::election::NodeName;
use crate::model::Claim;
use crate::model::MacAddr;
use crate::model::MemberInfo;

/// How long a yielded VIP stays off after the winner was last heard.
pub const YIELD_HOLD: Duration = Duration::from_millis(1500);
/// How long before a gone owner's addresses lapse, by its last word, the
/// yielded VIP is asked about densely: the kernel may drop a lapsed address
/// a little early, and the expiry told is the sender's, a few ms stale.
pub const LAPSE_EARLY: Duration = Duration::from_millis(100);
/// How often a yielded VIP is asked about while its owner's addresses lapse.
pub const LAPSE_PROBE: Duration = Duration::from_millis(20);
/// Silence that ends a yield while its owner's addresses lapse: two
/// questions unanswered, which also stands for the pre-check.
pub const LAPSE_HOLD: Duration = Duration::from_millis(50);
/// How long after the last lapse told a lapse watch lasts: the kernel drops
/// an expired address at its next lifetime check, up to about a second late.
pub const LAPSE_LATE: Duration = Duration::from_millis(1500);
/// How often a yielded VIP is asked about, so its return is not late.
pub const YIELD_PROBE: Duration = Duration::from_millis(250);
/// How often a held VIP is asked about.
pub const OWNER_PROBE: Duration = Duration::from_secs(1);
/// Held VIPs asked about per [`OWNER_PROBE`] while no node is lost (every
/// node gossip carries is live, or left saying so): the questions then
/// look only for a host outside hostlb that took the address, and a node
/// holding a thousand VIPs would otherwise broadcast a thousand ARP or
/// NDP questions a second to every host on the LAN, at rest. Taken in
/// turn, so each VIP is still asked about. Once a node is lost (crashed,
/// or cut off by a partition that may leave a second owner), every held
/// VIP is asked about each time again.
pub const OWNER_PROBE_AT_REST: usize = 16;
/// How long a node about to take a VIP nobody hands over listens first for
/// an owner that still answers (a crashed agent's address, a frozen one, a
/// gossip partition). Added to every such takeover.
pub const PRECHECK: std::time::Duration = Duration::from_millis(30);
/// How long a node listens instead before taking an address that a host
/// outside hostlb answered for at its last question (an address set by
/// hand, a DHCP lease). No owner is being replaced there, so no client
/// waits on the window; but an answer read late, on a busy host, must not
/// let this node take another host's address. Answers to the pre-check
/// were read 1-24 ms after the question on a loaded test bed, close to
/// [`PRECHECK`].
pub const PRECHECK_IN_USE: std::time::Duration = Duration::from_millis(500);
/// Questions a pre-check asks, [`PRECHECK_EVERY`] apart, the last with
/// time left for its answer. A live owner is taken only if every question
/// or its answer is lost: at 5% loss each way one exchange in ten fails,
/// so one in a thousand pre-checks of a live owner; two questions made it
/// one in a hundred. Spread, not sent at once, so that a burst of loss
/// does not take them all.
pub const PRECHECK_PROBES: u32 = 3;
pub const PRECHECK_EVERY: Duration = Duration::from_millis(10);
/// The time the last question has for its answer: the rest of
/// [`PRECHECK`]. A host that asks late, its timers behind, still waits this
/// long after its last question.
pub const PRECHECK_ANSWER: Duration = Duration::from_millis(10);
const _: () = assert!(
    PRECHECK.as_millis()
        == PRECHECK_EVERY.as_millis() * (PRECHECK_PROBES as u128 - 1) + PRECHECK_ANSWER.as_millis()
);

#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Verdict {
    /// Not about a VIP this node holds or yielded, or our own frame.
    Ignore,
    /// Another hostlb node answers too, and this one outranks it: keep the
    /// VIP and announce again, so clients come back here. Or (`gone`) the
    /// other outranks this one but its agent is known gone (out of gossip,
    /// its record stale or missing, no word of its addresses still
    /// lapsing): no answer of its host can be its own, so this node keeps
    /// the address all the same. A claim in a dead node's name, forged by
    /// anyone who knows its MAC, must not leave a VIP dark.
    Keep { other: NodeName, gone: bool },
    /// Another hostlb node answers too and outranks this one: remove it.
    Yield { to: NodeName },
    /// A MAC no hostlb node published answers; `first` the first time for
    /// this address and MAC among the last [`REPORTED_PER_VIP`] (report
    /// it then, as [`Conflicts::say`] allows).
    Foreign { first: bool },
}

/// [`Conflicts::holding_off`]'s answer.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Hold {
    /// Not yielded.
    Free,
    /// Yielded, and the owner still answers: stay off.
    Off,
    /// The yield just ended. `checked`: it ended by questions on the wire
    /// going unanswered while the owner's addresses lapse, which stands
    /// for the pre-check.
    Released { checked: bool },
}

/// When a yield whose owner was last heard at `seen` ends, if it is not
/// heard again. While the owner's addresses lapse, the silence counts only
/// from the start of the dense questions: the answers before were asked
/// for seldom.
pub fn yield_ends(seen: Instant, lapse: Option<Lapse>, now: Instant) -> Instant {
    match lapse {
        Some(l) if lapsing(Some(l), now) => {
            let start = l.first.checked_sub(LAPSE_EARLY).unwrap_or(l.first);
            seen.max(start) + LAPSE_HOLD
        }
        _ => seen + YIELD_HOLD,
    }
}

/// Whether a gone owner's addresses are lapsing now, by its last word:
/// from [`LAPSE_EARLY`] before the first until [`LAPSE_LATE`] after the
/// last.
pub fn lapsing(lapse: Option<Lapse>, now: Instant) -> bool {
    lapse.is_some_and(|l| now + LAPSE_EARLY >= l.first && now < l.last + LAPSE_LATE)
}

#[derive(Clone, Debug)]
pub struct Yielded {
    pub to: NodeName,
    pub mac: MacAddr,
    pub seen: Instant,
    /// Where the VIP would be held, to keep asking about it there.
    pub want: Want,
}

/// MACs a record may name, at most: a host has a few interfaces that
/// answer for VIPs. A record naming more is ignored whole, so that one
/// written by a compromised host cannot claim every MAC on the LAN.
pub const RECORD_MACS_MAX: usize = 16;

/// Strangers' MACs remembered per VIP, the most recent: a flood of
/// forged MACs costs this much per VIP, and a real stranger answering now
/// and then stays known (not reported again) while fewer than this many
/// others interleave.
pub const REPORTED_PER_VIP: usize = 4;
/// VIPs with strangers remembered, at most; past it the one heard of
/// longest ago is forgotten. Claims reach the core only for addresses it
/// holds or asks about, so this bounds a flood that cycles through them.
pub const REPORTED_VIPS: usize = 4_096;
/// Least time between two lines (and Events) about strangers answering
/// for one VIP: what a flood of forged answers costs the log.
pub const REPORT_EVERY: Duration = Duration::from_secs(60);

/// What is remembered of strangers answering for one VIP.
#[derive(Clone, Debug, Default)]
struct Reports {
    /// Their MACs, newest last, at most [`REPORTED_PER_VIP`].
    macs: VecDeque<MacAddr>,
    /// When a line was last said of this VIP.
    said: Option<Instant>,
    /// Reports not said since, for the next line.
    left_out: u64,
    /// Last heard of, for forgetting the oldest VIP.
    touched: Option<Instant>,
}

#[derive(Default)]
pub struct Conflicts {
    /// From gossip, which only a holder of the key can sign.
    mac_owner: HashMap<MacAddr, NodeName>,
    /// From the records in the API, as last listed: each names a Node's
    /// MACs, and a MAC two records name, or that a record names against
    /// gossip, is nobody's (see [`Conflicts::owner`]).
    recorded: HashMap<MacAddr, NodeName>,
    disputed: BTreeSet<MacAddr>,
    /// Who last published each VIP as held: only a VIP somebody held can
    /// have an owner still answering, so only those are asked about before
    /// a takeover (a new Service's address is taken at once).
    last_holder: HashMap<IpAddr, NodeName>,
    yielded: BTreeMap<IpAddr, Yielded>,
    reported: HashMap<IpAddr, Reports>,
    /// The agents' records as last listed: the MACs they name (see
    /// [`Conflicts::learn_records`]) and which agents run.
    records: Vec<AgentRecord>,
    /// When they were listed.
    records_at: Option<Instant>,
    /// Addresses someone else holds on this host: reported once each.
    foreign: BTreeSet<IpAddr>,
    /// The last conflict seen on the wire, for the status.
    last: Option<ConflictSeen>,
}

/// No fresh record of `node` among records listed: its agent does not
/// run, as far as the API knows (nothing is known before a first list).
fn unrecorded(records: &[AgentRecord], node: &str) -> bool {
    !records.is_empty() && !records.iter().any(|r| r.node == node && r.fresh)
}

impl Conflicts {
    /// Remembers which node published which MACs. Never forgets: a member
    /// gossip considers dead may be exactly the one still answering. This
    /// node's own state (`me`) names no holder: its echo in gossip lags
    /// what it holds, and would hide the last other holder.
    pub fn learn<'a>(&mut self, nodes: impl IntoIterator<Item = &'a MemberInfo>, me: &str) {
        // A name is shared, not copied: views come many times a second,
        // and each entry is a count whether it changed or not.
        for n in nodes {
            for mac in n.macs.iter() {
                self.mac_owner.insert(*mac, n.node.clone());
            }
            if n.node == me {
                continue;
            }
            for ip in n.vips.iter() {
                self.last_holder.insert(*ip, n.node.clone());
            }
        }
    }

    /// The agents' records as listed now; [`Conflicts::learn_records`]
    /// reads them.
    pub fn set_records(&mut self, records: Vec<AgentRecord>, now: Instant) {
        self.records = records;
        self.records_at = Some(now);
    }

    /// When the records were last listed.
    pub fn records_at(&self) -> Option<Instant> {
        self.records_at
    }

    pub fn records(&self) -> &[AgentRecord] {
        &self.records
    }

    /// An add found the address held on this host by someone else: true
    /// the first time, to be reported.
    pub(super) fn foreign_found(&mut self, ip: IpAddr) -> bool {
        self.foreign.insert(ip)
    }

    /// The address is this node's now.
    pub(super) fn foreign_gone(&mut self, ip: IpAddr) {
        self.foreign.remove(&ip);
    }

    pub fn seen(&mut self, seen: ConflictSeen) {
        self.last = Some(seen);
    }

    pub fn last_seen(&self) -> Option<&ConflictSeen> {
        self.last.as_ref()
    }

    /// The records' MACs (of the records last set), for nodes gossip never showed: evidence, not
    /// orders. Each call replaces what the last one learnt. A record
    /// whose name is no Node (`is_node`), or that names more than
    /// [`RECORD_MACS_MAX`] MACs, is ignored, and a MAC that two records
    /// name is disputed: a claim from it is a stranger's. What was ignored
    /// is returned, one line each, for the log.
    pub fn learn_records(&mut self, me: &str, is_node: impl Fn(&str) -> bool) -> Vec<String> {
        let mut ignored = Vec::new();
        self.recorded.clear();
        self.disputed.clear();
        for r in &self.records {
            if r.node == me {
                continue;
            }
            if !is_node(&r.node) {
                ignored.push(format!(
                    "the NodeAgent record {:?} names no Node; ignored",
                    r.node
                ));
                continue;
            }
            if r.macs.len() > RECORD_MACS_MAX {
                ignored.push(format!(
                    "the NodeAgent record {:?} names {} MACs, more than {RECORD_MACS_MAX}; ignored",
                    r.node,
                    r.macs.len()
                ));
                continue;
            }
            for mac in &r.macs {
                if let Some(g) = self.mac_owner.get(mac)
                    && *g != r.node
                {
                    ignored.push(format!(
                        "the NodeAgent record {:?} names MAC {mac}, which gossip gives {g}; gossip's word stands",
                        r.node
                    ));
                    continue;
                }
                match self.recorded.get(mac) {
                    Some(other) if *other != r.node => {
                        ignored.push(format!(
                            "MAC {mac} is named by the records of both {other} and {}; treated as a stranger's",
                            r.node
                        ));
                        self.disputed.insert(*mac);
                    }
                    _ => {
                        self.recorded.insert(*mac, r.node.as_str().into());
                    }
                }
            }
        }
        ignored
    }

    /// The node a MAC is known to answer for: gossip's word (signed, and
    /// published by the node itself), whatever a record says; otherwise a
    /// record's that no other record contradicts. A record that claims a
    /// MAC gossip gives another node is only reported: were the MAC then
    /// nobody's, one host's record could make an honest node's answers a
    /// stranger's, and two honest owners across a gossip partition would
    /// never settle.
    fn owner(&self, mac: &MacAddr) -> Option<&NodeName> {
        if let Some(g) = self.mac_owner.get(mac) {
            return Some(g);
        }
        if self.disputed.contains(mac) {
            return None;
        }
        self.recorded.get(mac)
    }

    /// The node that last published `ip` as held, as far as gossip told.
    pub fn last_holder(&self, ip: IpAddr) -> Option<&str> {
        self.last_holder.get(&ip).map(NodeName::as_str)
    }

    /// The node other than `me` that last published `ip` as held: whom a
    /// VIP taken now is taken from.
    pub fn previous_holder(&self, ip: IpAddr, me: &str) -> Option<&str> {
        self.last_holder(ip).filter(|n| *n != me)
    }

    pub fn owner_of(&self, mac: MacAddr) -> Option<&str> {
        self.owner(&mac).map(NodeName::as_str)
    }

    /// The verdict on one claim. `held` is where this node holds `claim.ip`
    /// in local mode, if it does. A claim from a node gossip shows live
    /// (`live`) is a planned move in progress (make before break: both
    /// answer until the old owner sees the new one), which gossip settles;
    /// only a node this one cannot talk to is a second owner. Of those,
    /// one gossip still carries (`heard`: its owner beats stopped, its
    /// state did not) is ranked with the drains both know.
    ///
    /// `gone`: the node's agent is known gone by gossip and its last word
    /// (see [`Verdict::Keep`]), and no fresh record of it is listed; never
    /// yielded to.
    #[allow(clippy::too_many_arguments)]
    pub fn judge(
        &mut self,
        claim: Claim,
        me: &str,
        own_macs: &BTreeSet<MacAddr>,
        held: Option<&Want>,
        asking: bool,
        election: &Election,
        live: impl Fn(&str) -> bool,
        heard: impl Fn(&str) -> bool,
        gone: impl Fn(&str) -> bool,
        now: Instant,
    ) -> Verdict {
        if own_macs.contains(&claim.mac) {
            return Verdict::Ignore;
        }
        let owner = self.owner(&claim.mac).cloned();
        // A yield lasts while its winner answers; not once its agent is
        // known gone, whose host cannot be answering for itself.
        if let Some(y) = self.yielded.get_mut(&claim.ip)
            && (y.mac == claim.mac || owner.as_ref() == Some(&y.to))
            && !(gone(&y.to) && unrecorded(&self.records, &y.to))
        {
            y.seen = now;
            return Verdict::Ignore;
        }
        let Some(want) = held else {
            return Verdict::Ignore;
        };
        match owner.filter(|n| n.as_str() != me) {
            Some(other) if live(&other) => Verdict::Ignore,
            Some(other) => {
                // Unknown address (just deleted): keep, nothing to settle.
                // Asking before taking it, this node holds nothing: of a
                // sticky VIP, the node that answers is the holder.
                let first = if asking {
                    election
                        .outranks_holding(claim.ip, &other, me, heard(&other))
                        .map(|b| !b)
                } else {
                    election.outranks(claim.ip, me, &other, heard(&other))
                };
                if first.unwrap_or(true) {
                    Verdict::Keep { other, gone: false }
                } else if gone(&other) && unrecorded(&self.records, &other) {
                    Verdict::Keep { other, gone: true }
                } else {
                    self.yielded.insert(
                        claim.ip,
                        Yielded {
                            to: other.clone(),
                            mac: claim.mac,
                            seen: now,
                            want: want.clone(),
                        },
                    );
                    Verdict::Yield { to: other }
                }
            }
            None => Verdict::Foreign {
                first: self.remember_stranger(claim, now),
            },
        }
    }

    /// Notes a stranger's MAC answering for `claim.ip`; true if it is not
    /// among the last few noted for it. Bounded per VIP and in all.
    fn remember_stranger(&mut self, claim: Claim, now: Instant) -> bool {
        if !self.reported.contains_key(&claim.ip) && self.reported.len() >= REPORTED_VIPS {
            let oldest = self
                .reported
                .iter()
                .min_by_key(|(_, r)| r.touched)
                .map(|(ip, _)| *ip);
            if let Some(ip) = oldest {
                self.reported.remove(&ip);
            }
        }
        let r = self.reported.entry(claim.ip).or_default();
        r.touched = Some(now);
        if let Some(at) = r.macs.iter().position(|m| *m == claim.mac) {
            // Heard again: the newest now.
            r.macs.remove(at);
            r.macs.push_back(claim.mac);
            return false;
        }
        if r.macs.len() >= REPORTED_PER_VIP {
            r.macs.pop_front();
        }
        r.macs.push_back(claim.mac);
        true
    }

    /// Whether a line (and an Event) about strangers answering for `ip`
    /// may be said now: at most one per [`REPORT_EVERY`] per VIP. `Some`
    /// with how many were left out since the last one said; `None` when
    /// this one is left out (and counted for the next).
    pub fn say(&mut self, ip: IpAddr, now: Instant) -> Option<u64> {
        let r = self.reported.entry(ip).or_default();
        r.touched = Some(now);
        if r.said
            .is_some_and(|t| now.saturating_duration_since(t) < REPORT_EVERY)
        {
            r.left_out += 1;
            return None;
        }
        r.said = Some(now);
        Some(std::mem::take(&mut r.left_out))
    }

    /// Strangers' MACs remembered, in all (for tests of the bound).
    #[cfg(test)]
    pub fn strangers_remembered(&self) -> usize {
        self.reported.values().map(|r| r.macs.len()).sum()
    }

    /// Whether `ip` must stay off here now: yielded, and its winner heard
    /// within [`YIELD_HOLD`] (within [`LAPSE_HOLD`] while its addresses
    /// lapse, see [`lapsing`]) and still out of gossip's reach (once gossip
    /// shows it live again, the election decides: it may be leaving). An
    /// expired yield is forgotten.
    pub fn holding_off(
        &mut self,
        ip: IpAddr,
        now: Instant,
        live: impl Fn(&str) -> bool,
        lapse: impl Fn(&str) -> Option<Lapse>,
    ) -> Hold {
        let Some(y) = self.yielded.get(&ip) else {
            return Hold::Free;
        };
        let lapse = lapse(&y.to);
        let lapsing = lapsing(lapse, now);
        let live = live(&y.to);
        if now < yield_ends(y.seen, lapse, now) && !live {
            return Hold::Off;
        }
        self.yielded.remove(&ip);
        Hold::Released {
            checked: lapsing && !live,
        }
    }

    /// Stays off `ip` while `to` answers for it, as after a lost conflict:
    /// this node let it go to `to` by another rule (a live peer with a
    /// newer view of the cluster holds it), and must not take it back when
    /// that peer drops out of gossip but still answers (a partition).
    pub fn yield_to(&mut self, ip: IpAddr, to: &str, want: Want, now: Instant) {
        let found = self
            .mac_owner
            .iter()
            .chain(&self.recorded)
            .find(|(m, n)| n.as_str() == to && self.owner(m) == Some(n))
            .map(|(m, n)| (*m, n.clone()));
        if let Some((mac, to)) = found {
            self.yielded.insert(
                ip,
                Yielded {
                    to,
                    mac,
                    seen: now,
                    want,
                },
            );
        }
    }

    /// Lets the next claim of `mac` on `ip` be reported as the first.
    pub fn forget_report(&mut self, ip: IpAddr, mac: MacAddr) {
        if let Some(r) = self.reported.get_mut(&ip) {
            r.macs.retain(|m| *m != mac);
        }
    }

    /// Forgets the yield of an address this node no longer wants.
    pub fn forget(&mut self, ip: IpAddr) {
        self.yielded.remove(&ip);
    }

    pub fn yield_of(&self, ip: IpAddr) -> Option<&Yielded> {
        self.yielded.get(&ip)
    }

    pub fn yielded(&self) -> impl Iterator<Item = (&IpAddr, &Yielded)> {
        self.yielded.iter()
    }

    /// The node this node yields `ip` to, if any.
    pub fn yielded_to(&self, ip: IpAddr) -> Option<&str> {
        self.yielded.get(&ip).map(|y| y.to.as_str())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::agent::links::Mode;
    use crate::election::{Advertisement, Cluster, Member, NodeInfo, Pool, ServiceInfo};
    use crate::model::Status;
    use crate::model::{Lifetime, VipAddress};

    const VIP: &str = "10.0.0.1";

    fn election(live: &[&str]) -> Election {
        let node = |n: &str| NodeInfo {
            name: n.into(),
            ..Default::default()
        };
        let c = Cluster {
            nodes: vec![node("a"), node("b")],
            pools: vec![Pool {
                name: "p".into(),
                ranges: vec!["10.0.0.0/24".parse().unwrap()],
                ..Default::default()
            }],
            advertisements: vec![Advertisement {
                name: "ad".into(),
                ..Default::default()
            }],
            services: vec![ServiceInfo {
                key: "d/s".into(),
                addresses: vec![VIP.parse().unwrap()],
                endpoints: crate::election::Endpoints::on(["a", "b"]),
                ..Default::default()
            }],
        };
        Election::new(
            &c,
            live.iter()
                .map(|n| Member::alive(n, ["0.0.0.0/0".parse().unwrap()])),
        )
    }

    fn info(node: &str, mac: MacAddr) -> MemberInfo {
        MemberInfo {
            node: node.into(),
            generation: 1,
            gossip_addr: "192.0.2.1:7934".parse().unwrap(),
            agent_version: String::new(),
            protocol: crate::model::PROTOCOL,
            status: Status::Alive,
            virtual_mode: false,
            on_link: Default::default(),
            vips: Default::default(),
            macs: BTreeSet::from([mac]).into(),
            revision: 0,
            digest: None,
            drained: false,
            behind: Default::default(),
        }
    }

    fn want() -> Want {
        Want {
            vip: VipAddress {
                interface: "eth0".into(),
                ifindex: 2,
                ip: VIP.parse().unwrap(),
                prefix_len: 24,
                lifetime: Lifetime::FOREVER,
            },
            mode: Mode::Local,
            target: None,
        }
    }

    fn none(_: &str) -> Option<Lapse> {
        None
    }

    const MAC_A: MacAddr = MacAddr([2, 0, 0, 0, 0, 0xa]);
    const MAC_B: MacAddr = MacAddr([2, 0, 0, 0, 0, 0xb]);

    /// A partition: each side sees only itself live, holds the VIP, and
    /// hears the other's MAC. Exactly one yields, the same one from both
    /// sides, and it stays off while the other is heard.
    #[test]
    fn both_sides_of_a_partition_agree_on_who_keeps() {
        let ip: IpAddr = VIP.parse().unwrap();
        let t0 = Instant::now();
        let judge = |me: &str, mine: MacAddr, theirs: MacAddr| {
            let mut c = Conflicts::default();
            c.learn([&info("a", MAC_A), &info("b", MAC_B)], "");
            let e = election(&[me]);
            assert_eq!(e.winner(ip), Some(me), "each side elects itself");
            let v = c.judge(
                Claim { ip, mac: theirs },
                me,
                &[mine].into(),
                Some(&want()),
                false,
                &e,
                |_| false,
                |_| false,
                |_| false,
                t0,
            );
            (v, c)
        };
        let (va, _) = judge("a", MAC_A, MAC_B);
        let (vb, _) = judge("b", MAC_B, MAC_A);
        let loser = match (&va, &vb) {
            (Verdict::Keep { other, .. }, Verdict::Yield { to }) => {
                assert_eq!((other.as_str(), to.as_str()), ("b", "a"));
                "b"
            }
            (Verdict::Yield { to }, Verdict::Keep { other, .. }) => {
                assert_eq!((to.as_str(), other.as_str()), ("b", "a"));
                "a"
            }
            other => panic!("exactly one side must yield: {other:?}"),
        };
        let (mine, theirs) = if loser == "a" {
            (MAC_A, MAC_B)
        } else {
            (MAC_B, MAC_A)
        };
        let (_, mut c) = judge(loser, mine, theirs);
        // Stays off while the keeper answers; a heard answer refreshes the
        // yield; once the answers stop, it may take the VIP back.
        assert_eq!(
            c.holding_off(ip, t0 + Duration::from_secs(1), |_| false, none),
            Hold::Off
        );
        let later = t0 + Duration::from_secs(1);
        let e = election(&[loser]);
        let v = c.judge(
            Claim { ip, mac: theirs },
            loser,
            &[mine].into(),
            None,
            false,
            &e,
            |_| false,
            |_| false,
            |_| false,
            later,
        );
        assert_eq!(v, Verdict::Ignore);
        assert_eq!(
            c.holding_off(
                ip,
                later + YIELD_HOLD - Duration::from_millis(1),
                |_| false,
                none
            ),
            Hold::Off
        );
        assert_eq!(
            c.holding_off(ip, later + YIELD_HOLD, |_| false, none),
            Hold::Released { checked: false }
        );
        assert_eq!(
            c.holding_off(ip, later, |_| false, none),
            Hold::Free,
            "an expired yield is forgotten"
        );
        // A winner gossip reaches again ends the yield at once.
        let (_, mut c) = judge(loser, mine, theirs);
        assert_eq!(
            c.holding_off(ip, t0, |_| true, none),
            Hold::Released { checked: false }
        );
    }

    /// A record that claims a MAC gossip gives another node changes
    /// nothing: the MAC stays that node's, so its answers still settle a
    /// second owner on the wire.
    #[test]
    fn gossip_names_a_macs_node_whatever_a_record_says() {
        let ip: IpAddr = VIP.parse().unwrap();
        let mut c = Conflicts::default();
        c.learn([&info("a", MAC_A), &info("b", MAC_B)], "");
        let forged = AgentRecord {
            node: "c".into(),
            macs: [MAC_B].into(),
            fresh: true,
        };
        c.set_records(vec![forged], Instant::now());
        let ignored = c.learn_records("a", |_| true);
        assert_eq!(ignored.len(), 1, "reported: {ignored:?}");
        assert_eq!(c.owner_of(MAC_B), Some("b"));
        let e = election(&["a", "b"]);
        let v = c.judge(
            Claim { ip, mac: MAC_B },
            "a",
            &[MAC_A].into(),
            Some(&want()),
            false,
            &e,
            |_| false,
            |_| false,
            |_| false,
            Instant::now(),
        );
        assert!(
            matches!(v, Verdict::Keep { .. } | Verdict::Yield { .. }),
            "b's answer is b's, not a stranger's: {v:?}"
        );
    }

    #[test]
    fn an_unknown_mac_is_reported_once_and_not_fought() {
        let ip: IpAddr = VIP.parse().unwrap();
        let mut c = Conflicts::default();
        c.learn([&info("a", MAC_A)], "");
        let e = election(&["a"]);
        let stranger = MacAddr([2, 9, 9, 9, 9, 9]);
        let claim = Claim { ip, mac: stranger };
        let now = Instant::now();
        let v = c.judge(
            claim,
            "a",
            &[MAC_A].into(),
            Some(&want()),
            false,
            &e,
            |_| false,
            |_| false,
            |_| false,
            now,
        );
        assert_eq!(v, Verdict::Foreign { first: true });
        let v = c.judge(
            claim,
            "a",
            &[MAC_A].into(),
            Some(&want()),
            false,
            &e,
            |_| false,
            |_| false,
            |_| false,
            now,
        );
        assert_eq!(v, Verdict::Foreign { first: false });
        assert_ne!(c.holding_off(ip, now, |_| false, none), Hold::Off);
        // Our own frames and addresses we do not hold are not conflicts.
        let own = Claim { ip, mac: MAC_A };
        assert_eq!(
            c.judge(
                own,
                "a",
                &[MAC_A].into(),
                Some(&want()),
                false,
                &e,
                |_| false,
                |_| false,
                |_| false,
                now
            ),
            Verdict::Ignore
        );
        assert_eq!(
            c.judge(
                claim,
                "a",
                &[MAC_A].into(),
                None,
                false,
                &e,
                |_| false,
                |_| false,
                |_| false,
                now
            ),
            Verdict::Ignore
        );
    }

    #[test]
    fn the_last_holder_of_a_vip_is_remembered_after_it_is_gone() {
        let ip: IpAddr = VIP.parse().unwrap();
        let mut c = Conflicts::default();
        assert_eq!(c.last_holder(ip), None);
        let mut a = info("a", MAC_A);
        a.vips = BTreeSet::from([ip]).into();
        c.learn([&a], "");
        c.learn(std::iter::empty::<&MemberInfo>(), "");
        assert_eq!(c.last_holder(ip), Some("a"));
    }

    /// Both answer while a live node takes over (SIGTERM, a preferred node
    /// returning): gossip settles that, nobody yields.
    #[test]
    fn a_live_node_answering_too_is_a_handover_not_a_conflict() {
        let ip: IpAddr = VIP.parse().unwrap();
        let mut c = Conflicts::default();
        c.learn([&info("a", MAC_A), &info("b", MAC_B)], "");
        let e = election(&["b"]);
        let v = c.judge(
            Claim { ip, mac: MAC_A },
            "b",
            &[MAC_B].into(),
            Some(&want()),
            false,
            &e,
            |n| n == "a",
            |_| false,
            |_| false,
            Instant::now(),
        );
        assert_eq!(v, Verdict::Ignore);
        assert_eq!(c.yielded().count(), 0);
    }

    /// A dead owner whose host still answers: before its addresses lapse
    /// the yield holds through a silence shorter than YIELD_HOLD; from just
    /// before the lapse it ends after LAPSE_HOLD of silence, as a check.
    #[test]
    fn a_yield_to_an_owner_whose_addresses_lapse_ends_right_after_the_lapse() {
        let ip: IpAddr = VIP.parse().unwrap();
        let t0 = Instant::now();
        let lapse = Lapse {
            first: t0 + Duration::from_secs(5),
            last: t0 + Duration::from_secs(5),
        };
        let told = |_: &str| Some(lapse);
        let mut c = Conflicts::default();
        c.learn([&info("a", MAC_A), &info("b", MAC_B)], "");
        c.yield_to(ip, "a", want(), t0);
        let heard = |c: &mut Conflicts, at: Instant| {
            c.judge(
                Claim { ip, mac: MAC_A },
                "b",
                &[MAC_B].into(),
                None,
                false,
                &election(&["b"]),
                |_| false,
                |_| false,
                |_| false,
                at,
            )
        };
        let early = t0 + Duration::from_secs(2);
        heard(&mut c, early);
        assert_eq!(
            c.holding_off(ip, early + LAPSE_HOLD * 2, |_| false, told),
            Hold::Off
        );
        let near = lapse.first - LAPSE_EARLY;
        assert_eq!(
            c.holding_off(
                ip,
                near + LAPSE_HOLD - Duration::from_millis(1),
                |_| false,
                told
            ),
            Hold::Off,
            "silence before the dense questions does not count"
        );
        heard(&mut c, near);
        assert_eq!(
            c.holding_off(
                ip,
                near + LAPSE_HOLD - Duration::from_millis(1),
                |_| false,
                told
            ),
            Hold::Off
        );
        assert_eq!(
            c.holding_off(ip, near + LAPSE_HOLD, |_| false, told),
            Hold::Released { checked: true }
        );
        assert!(!lapsing(Some(lapse), lapse.last + LAPSE_LATE));
        assert!(lapsing(
            Some(lapse),
            lapse.last + LAPSE_LATE - Duration::from_millis(1)
        ));
    }

    /// A record may name up to [`RECORD_MACS_MAX`] MACs; one more and it
    /// is ignored.
    #[test]
    fn a_record_naming_as_many_macs_as_allowed_is_learnt() {
        let mut c = Conflicts::default();
        let mut macs: BTreeSet<MacAddr> = (0..RECORD_MACS_MAX as u8)
            .map(|i| MacAddr([2, 1, 0, 0, 0, i]))
            .collect();
        let first = *macs.first().unwrap();
        let record = |macs: &BTreeSet<MacAddr>| AgentRecord {
            node: "c".into(),
            macs: macs.clone(),
            fresh: true,
        };
        c.set_records(vec![record(&macs)], Instant::now());
        let ignored = c.learn_records("a", |_| true);
        assert!(ignored.is_empty(), "{ignored:?}");
        assert_eq!(c.owner_of(first), Some("c"));
        macs.insert(MacAddr([2, 1, 0, 0, 1, 0]));
        c.set_records(vec![record(&macs)], Instant::now());
        let ignored = c.learn_records("a", |_| true);
        assert_eq!(ignored.len(), 1, "{ignored:?}");
        assert_eq!(c.owner_of(first), None);
    }

    /// A yield to a node is kept by one of that node's MACs, whichever
    /// node it is.
    #[test]
    fn a_yield_is_to_a_mac_of_the_node_yielded_to() {
        let t0 = Instant::now();
        let mut c = Conflicts::default();
        c.learn([&info("a", MAC_A), &info("b", MAC_B)], "");
        for (n, node) in ["a", "b"].into_iter().enumerate() {
            let ip = IpAddr::from([10, 0, 0, 100 + n as u8]);
            c.yield_to(ip, node, want(), t0);
            let y = c.yield_of(ip).expect("yielded");
            assert_eq!(y.to, node);
            assert_eq!(c.owner_of(y.mac), Some(node), "{y:?}");
        }
    }

    /// A yield lasts while its winner is heard, from any MAC gossip gives
    /// it; a stranger's answer does not make it last, and forgetting the
    /// VIP ends it.
    #[test]
    fn a_yield_is_kept_only_by_its_winners_answers() {
        let ip: IpAddr = VIP.parse().unwrap();
        let t0 = Instant::now();
        let judge = |c: &mut Conflicts, mac: MacAddr, at: Instant| {
            c.judge(
                Claim { ip, mac },
                "b",
                &[MAC_B].into(),
                None,
                false,
                &election(&["a", "b"]),
                |_| false,
                |_| false,
                |_| false,
                at,
            )
        };
        let t1 = t0 + Duration::from_secs(1);
        let after = t0 + YIELD_HOLD + Duration::from_millis(1);
        // The winner's other MAC, learnt after the yield.
        let mut c = Conflicts::default();
        c.learn([&info("a", MAC_A)], "");
        c.yield_to(ip, "a", want(), t0);
        let second = MacAddr([2, 0, 0, 0, 0, 0xa2]);
        let mut a = info("a", MAC_A);
        a.macs = BTreeSet::from([MAC_A, second]).into();
        c.learn([&a], "");
        assert_eq!(judge(&mut c, second, t1), Verdict::Ignore);
        assert_eq!(c.holding_off(ip, after, |_| false, none), Hold::Off);
        // A stranger.
        let mut c = Conflicts::default();
        c.learn([&info("a", MAC_A)], "");
        c.yield_to(ip, "a", want(), t0);
        judge(&mut c, MacAddr([2, 9, 9, 9, 9, 9]), t1);
        assert_ne!(c.holding_off(ip, after, |_| false, none), Hold::Off);
        // Forgotten.
        let mut c = Conflicts::default();
        c.learn([&info("a", MAC_A)], "");
        c.yield_to(ip, "a", want(), t0);
        c.forget(ip);
        assert_eq!(c.holding_off(ip, t0, |_| false, none), Hold::Free);
    }

    /// A stranger's answer is reported once, and again once its report was
    /// forgotten (the VIP was let go and taken again).
    #[test]
    fn a_forgotten_report_is_made_again() {
        let ip: IpAddr = VIP.parse().unwrap();
        let mut c = Conflicts::default();
        c.learn([&info("a", MAC_A)], "");
        let stranger = MacAddr([2, 9, 9, 9, 9, 9]);
        let judge = |c: &mut Conflicts| {
            c.judge(
                Claim { ip, mac: stranger },
                "a",
                &[MAC_A].into(),
                Some(&want()),
                false,
                &election(&["a"]),
                |_| false,
                |_| false,
                |_| false,
                Instant::now(),
            )
        };
        assert_eq!(judge(&mut c), Verdict::Foreign { first: true });
        assert_eq!(judge(&mut c), Verdict::Foreign { first: false });
        c.forget_report(ip, stranger);
        assert_eq!(judge(&mut c), Verdict::Foreign { first: true });
    }
}
