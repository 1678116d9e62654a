//! Sends the owner sessions' beats (see `core::sessions`) on a task of its
//! own, so a loop busy with a large election does not fall silent; and
//! turns received beats into the core's input.
//!
//! Beats prove the loop lives, not only the process: the sender stops once
//! the loop has not turned for [`LOOP_STALL`], and the followers then
//! treat this node as they would a frozen one (its addresses still answer
//! on the wire, so they stay off until those lapse).

use std::collections::HashMap;
use std::net::{IpAddr, SocketAddr};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use tokio::sync::{mpsc, watch};

use super::core::BeatPlan;
use super::core::sessions::{BEAT_INTERVAL, Beat, Lapse, RELAY_EVERY, SPARSE_EVERY, Silent};
use crate::gossip::Arrived;
use crate::gossip::ProbeSend;
use crate::gossip::beats::{BeatMessage, Counter, Proof, Subject, send_leaving};
use crate::identity::{Identities, Known, NodeKey, PairKey, PublicId};
use crate::model::MembershipView;

/// A loop that has not turned for this long sends no more beats. The loop
/// turns at least once a second (its housekeeping tick).
pub const LOOP_STALL: Duration = Duration::from_millis(1_500);

/// `turned` before the loop's first turn: nothing is sent yet.
const NOT_YET: u64 = u64::MAX;

/// Who proves the beats this node sends (see `gossip::beats`): its key,
/// the peers' identities, and where each peer gossips from.
#[derive(Clone)]
pub struct Prover {
    pub key: Arc<NodeKey>,
    pub identities: Arc<Identities>,
    /// Which node gossips from which address.
    pub views: watch::Receiver<MembershipView>,
    /// The run's counter, shared with the leaving beats.
    pub counter: Arc<Counter>,
}

impl Prover {
    /// The key this node shares with the node gossiping from `peer`.
    fn pair_for(
        &self,
        cache: &mut HashMap<SocketAddr, (PublicId, PairKey)>,
        peer: SocketAddr,
    ) -> Option<PairKey> {
        let view = self.views.borrow();
        let node = view
            .nodes
            .iter()
            .chain(&view.gone)
            .find(|n| n.gossip_addr == peer)?
            .node
            .clone();
        drop(view);
        let Some(Known::Key(public)) = self.identities.of(&node) else {
            return None;
        };
        if let Some((p, k)) = cache.get(&peer)
            && *p == public
        {
            return Some(k.clone());
        }
        let k = self.key.pair_key(&public)?;
        cache.insert(peer, (public, k.clone()));
        Some(k)
    }

    /// Proves the beat in `out` (its length before any proof: `body`) for
    /// `peer` and sends it: the pair tag, or the signature where no pair
    /// key can be had yet (the peer's identity unknown here). The count
    /// is taken and the beat sent in one go ([`Counter::send`]).
    fn prove_and_send(
        &self,
        cache: &mut HashMap<SocketAddr, (PublicId, PairKey)>,
        out: &mut Vec<u8>,
        body: usize,
        peer: SocketAddr,
        send: &dyn ProbeSend,
    ) {
        out.truncate(body);
        let pair = self.pair_for(cache, peer);
        self.counter.send(|counter| {
            match pair {
                Some(k) => Proof::pair(out, counter, &k),
                None => Proof::sign(out, counter, &self.key),
            }
            send.send(peer, out);
        });
    }
}

/// The loop's side: the plan to follow, and proof of life.
pub struct Beats {
    node: String,
    generation: u64,
    send: Arc<dyn ProbeSend>,
    prover: Prover,
    /// Set by [`Beats::leave`]: every beat from then on says so.
    leaving: Arc<AtomicBool>,
    plan: watch::Sender<BeatPlan>,
    turned: Arc<AtomicU64>,
    /// The runtime's clock (paused in tests and benchmarks, as the loop's
    /// turns are).
    base: tokio::time::Instant,
    task: tokio::task::JoinHandle<()>,
}

impl Drop for Beats {
    fn drop(&mut self) {
        self.task.abort();
    }
}

impl Beats {
    pub fn start(node: String, generation: u64, send: Arc<dyn ProbeSend>, prover: Prover) -> Beats {
        let (plan, plan_rx) = watch::channel(BeatPlan::default());
        let turned = Arc::new(AtomicU64::new(NOT_YET));
        let leaving = Arc::new(AtomicBool::new(false));
        let base = tokio::time::Instant::now();
        let task = tokio::spawn(send_beats(
            Sender {
                node: node.clone(),
                generation,
                send: send.clone(),
                prover: prover.clone(),
                leaving: leaving.clone(),
            },
            plan_rx,
            turned.clone(),
            base,
        ));
        Beats {
            node,
            generation,
            send,
            prover,
            leaving,
            plan,
            turned,
            base,
            task,
        }
    }

    pub fn set_plan(&self, plan: BeatPlan) {
        self.plan.send_replace(plan);
    }

    /// Tells `peers` at once that this node leaves (see
    /// `gossip::beats`): they take its VIPs without waiting for gossip.
    pub fn leave(&self, peers: Vec<SocketAddr>) {
        // Every beat from now on says so: a beat of this run that did not
        // would end the leave on its peers (an alive word after it).
        self.leaving.store(true, Ordering::Relaxed);
        let node = self.node.clone();
        let generation = Some(self.generation);
        let send = self.send.clone();
        let key = self.prover.key.clone();
        let counter = self.prover.counter.clone();
        tokio::spawn(async move {
            send_leaving(
                &node,
                generation,
                Some(&key),
                &counter,
                &peers,
                |to, payload| send.send(to, payload),
            )
            .await;
        });
    }

    /// The loop turned.
    pub fn turned(&self) {
        self.turned
            .store(self.base.elapsed().as_millis() as u64, Ordering::Relaxed);
    }
}

/// What the beat task sends with.
struct Sender {
    node: String,
    generation: u64,
    send: Arc<dyn ProbeSend>,
    prover: Prover,
    leaving: Arc<AtomicBool>,
}

async fn send_beats(
    sender: Sender,
    mut plan: watch::Receiver<BeatPlan>,
    turned: Arc<AtomicU64>,
    base: tokio::time::Instant,
) {
    let Sender {
        node,
        generation,
        send,
        prover,
        leaving,
    } = sender;
    let mut pairs = HashMap::new();
    let relay_every = (RELAY_EVERY.as_millis() / BEAT_INTERVAL.as_millis()).max(1) as u64;
    let mut out = Vec::with_capacity(64);
    let mut stalled = false;
    // Ticks are counted from here, BEAT_INTERVAL apart; the task sleeps
    // through those with nothing to send (a node with no watcher beats
    // only the owners it watches, every SPARSE_EVERY ticks), so an agent
    // at rest wakes for what goes on the wire and no more.
    let start = tokio::time::Instant::now();
    let mut tick: u64 = 0;
    loop {
        // After a late wake-up (a busy runtime) or a plan change, the ticks
        // already past are skipped, as an interval that delays would.
        let elapsed = (start.elapsed().as_millis() / BEAT_INTERVAL.as_millis()) as u64;
        tick = tick.max(elapsed);
        let next = next_tick(&plan.borrow(), tick, relay_every);
        let due = next.map(|k| start + Duration::from_millis(k * BEAT_INTERVAL.as_millis() as u64));
        // A new plan goes out at once to the peers it adds and the owners
        // it finds silent: a relay's first word is the one that counts.
        let changed = tokio::select! {
            () = super::sleep_until(due) => false,
            r = plan.changed() => {
                if r.is_err() {
                    return;
                }
                true
            }
        };
        if !changed {
            tick = next.expect("woken by the tick");
        }
        let last = turned.load(Ordering::Relaxed);
        if last == NOT_YET {
            continue;
        }
        let since = (base.elapsed().as_millis() as u64).saturating_sub(last);
        if Duration::from_millis(since) >= LOOP_STALL {
            if !stalled {
                tracing::warn!(
                    stalled_ms = since,
                    "the agent's loop has not turned; sending no beats, so followers treat this node as stopped"
                );
                stalled = true;
            }
            continue;
        }
        stalled = false;
        let plan = plan.borrow_and_update().clone();
        let now = Instant::now();
        let lapse = |l: Option<Lapse>| {
            l.map(|l| {
                (
                    l.first.saturating_duration_since(now),
                    l.last.saturating_duration_since(now),
                )
            })
        };
        // Two beats: the owners watched are told so (to be beaten densely),
        // the watchers are not (an owner's beats are not answered).
        let sparse = changed || tick.is_multiple_of(SPARSE_EVERY.into());
        for watching in [false, true] {
            let to: Vec<&SocketAddr> = if watching {
                let dense = |p: &&SocketAddr| plan.dense.contains(p);
                plan.sparse.iter().filter(|p| sparse || dense(p)).collect()
            } else {
                plan.dense
                    .iter()
                    .filter(|p| !plan.sparse.contains(p))
                    .collect()
            };
            if to.is_empty() {
                continue;
            }
            BeatMessage {
                leaving: leaving.load(Ordering::Relaxed),
                watching,
                node: node.clone(),
                generation: Some(generation),
                lapse: lapse(plan.lapse),
                silent: None,
            }
            .encode(&mut out);
            let body = out.len();
            for peer in to {
                prover.prove_and_send(&mut pairs, &mut out, body, *peer, &*send);
            }
        }
        if changed || tick.is_multiple_of(relay_every) {
            for r in &plan.relays {
                BeatMessage {
                    leaving: leaving.load(Ordering::Relaxed),
                    watching: false,
                    node: node.clone(),
                    generation: Some(generation),
                    lapse: lapse(plan.lapse),
                    silent: Some(Subject {
                        node: r.node.to_string(),
                        generation: Some(r.generation),
                        lapse: lapse(r.lapse),
                    }),
                }
                .encode(&mut out);
                let body = out.len();
                for peer in &r.to {
                    prover.prove_and_send(&mut pairs, &mut out, body, *peer, &*send);
                }
            }
        }
    }
}

/// The first tick after `tick` at which `plan` sends anything: every tick
/// while some peer watches this node, else the next one at which the
/// owners it watches are told so or a relay is due. `None`: nothing to
/// send until the plan changes.
fn next_tick(plan: &BeatPlan, tick: u64, relay_every: u64) -> Option<u64> {
    if !plan.dense.is_empty() {
        return Some(tick + 1);
    }
    let after = |every: u64| (tick / every + 1) * every;
    let sparse = (!plan.sparse.is_empty()).then(|| after(SPARSE_EVERY.into()));
    let relay = (!plan.relays.is_empty()).then(|| after(relay_every));
    sparse.into_iter().chain(relay).min()
}

/// Why a beat was not believed.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Refused {
    /// Its node's identity is not known yet (its record not read): it
    /// waits for the records, which are listed again.
    Unknown,
    /// No proof, or one that is not its node's: a key holder speaking in
    /// another node's name.
    Unproved,
    /// A proof older than the last one from that run, or stamped outside
    /// the replay window: a beat played back.
    Replayed,
    /// From an agent without an identity (an earlier release), and from an
    /// address its node does not have.
    Address,
}

impl Refused {
    pub fn as_str(self) -> &'static str {
        match self {
            Refused::Unknown => "unknown",
            Refused::Unproved => "unproved",
            Refused::Replayed => "replayed",
            Refused::Address => "address",
        }
    }
}

/// Runs remembered for replays, at most: past it, the least recent go.
const RUNS_KEPT: usize = 4096;

/// Checks beats against their senders' identities (see `gossip::beats`):
/// what is believed of a node's beats is what that node proved.
pub struct BeatCheck {
    key: Arc<NodeKey>,
    identities: Arc<Identities>,
    pairs: HashMap<String, (PublicId, PairKey)>,
    /// The last counter believed of each run (node, generation).
    last: HashMap<(String, u64), u64>,
    /// How far a proof's counter may be from this node's clock, in µs.
    window_us: u64,
}

impl BeatCheck {
    pub fn new(key: Arc<NodeKey>, identities: Arc<Identities>, window: Duration) -> BeatCheck {
        BeatCheck {
            key,
            identities,
            pairs: HashMap::new(),
            last: HashMap::new(),
            window_us: window.as_micros() as u64,
        }
    }

    /// Whether `m`, with `proof`, from `source`, is believed, at `now_us`
    /// (the wall clock in µs). `Ok(false)`: the same proof again (a
    /// leaving beat's later rounds), nothing new.
    pub fn admit(
        &mut self,
        m: &BeatMessage,
        proof: Option<&Proof>,
        source: IpAddr,
        now_us: u64,
        from_its_node: impl Fn(&str, IpAddr) -> bool,
    ) -> Result<bool, Refused> {
        let public = match self.identities.of(&m.node) {
            None => return Err(Refused::Unknown),
            Some(Known::NoIdentity) => {
                return if from_its_node(&m.node, source) {
                    Ok(true)
                } else {
                    Err(Refused::Address)
                };
            }
            Some(Known::Key(public)) => public,
        };
        let proof = proof.ok_or(Refused::Unproved)?;
        let (key, pairs) = (&self.key, &mut self.pairs);
        let pair = || {
            if let Some((p, k)) = pairs.get(&m.node)
                && *p == public
            {
                return Some(k.clone());
            }
            let k = key.pair_key(&public)?;
            pairs.insert(m.node.clone(), (public, k.clone()));
            Some(k)
        };
        if !proof.verifies(&public, pair) {
            // Perhaps a new key the records will tell.
            self.identities.want();
            return Err(Refused::Unproved);
        }
        if proof.counter.abs_diff(now_us) > self.window_us {
            return Err(Refused::Replayed);
        }
        let run = (m.node.clone(), m.generation.unwrap_or(0));
        if let Some(last) = self.last.get(&run) {
            if proof.counter == *last {
                return Ok(false);
            }
            if proof.counter < *last {
                return Err(Refused::Replayed);
            }
        } else if self.last.len() >= RUNS_KEPT
            && let Some(oldest) = self
                .last
                .iter()
                .min_by_key(|(_, c)| **c)
                .map(|(r, _)| r.clone())
        {
            self.last.remove(&oldest);
        }
        self.last.insert(run, proof.counter);
        Ok(true)
    }
}

/// Every beat waiting, as one input (the first one awaited by the loop's
/// `select!`, the rest taken without waiting). Beats that do not decode
/// are dropped: they passed the signature, so they come from a newer
/// agent. So are beats their node did not prove ([`BeatCheck`]): the
/// gossip key proves a sender is a member, not which one. The refusals
/// come back too, by why.
pub fn drain(
    first: Arrived,
    recv: &mut mpsc::Receiver<Arrived>,
    check: &mut BeatCheck,
    from_its_node: impl Fn(&str, IpAddr) -> bool,
) -> (Vec<Beat>, Vec<(Refused, String)>) {
    let mut beats = Vec::new();
    let mut refused = Vec::new();
    let now_us = crate::gossip::beats::counter_now();
    let mut next = Some(first);
    while let Some(Arrived {
        from: source,
        payload,
        at,
    }) = next
    {
        if let Some((m, proof)) = BeatMessage::decode_proved(&payload) {
            match check.admit(
                &m,
                proof.as_ref(),
                source.ip().to_canonical(),
                now_us,
                &from_its_node,
            ) {
                Ok(true) => beats.push(Beat {
                    at,
                    node: m.node.into(),
                    generation: m.generation,
                    lapse: m.lapse,
                    leaving: m.leaving,
                    watching: m.watching,
                    silent: m.silent.map(|s| Silent {
                        node: s.node.into(),
                        generation: s.generation,
                        lapse: s.lapse,
                    }),
                }),
                Ok(false) => {}
                Err(why) => refused.push((why, m.node)),
            }
        }
        next = recv.try_recv().ok();
    }
    (beats, refused)
}

/// Whether `source` is an address of `node`, as far as this agent knows:
/// the gossip address it publishes, or an address of its Node object (a
/// host sends from its route's source address, which may not be the one
/// it advertises). A node gossip does not know at all is not refused: its
/// beat cannot be checked, and the core ignores beats of unknown runs.
pub fn from_its_node(
    node: &str,
    source: IpAddr,
    view: &MembershipView,
    node_addresses: impl Fn(&str) -> Vec<IpAddr>,
) -> bool {
    let mut known = false;
    for n in view
        .nodes
        .iter()
        .chain(&view.gone)
        .filter(|n| n.node == node)
    {
        if n.gossip_addr.ip().to_canonical() == source {
            return true;
        }
        known = true;
    }
    !known
        || node_addresses(node)
            .iter()
            .any(|a| a.to_canonical() == source)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::{MemberInfo, Status};

    fn view(nodes: &[(&str, &str)]) -> MembershipView {
        let mut v = MembershipView::empty();
        v.nodes = nodes
            .iter()
            .map(|(n, a)| {
                Arc::new(MemberInfo {
                    node: (*n).into(),
                    gossip_addr: a.parse().unwrap(),
                    status: Status::Alive,
                    ..v.local.clone()
                })
            })
            .collect();
        v
    }

    /// A beat counts from the address its node publishes, or one of its
    /// Node's; from anywhere else it is a forgery. IPv4 seen through a
    /// dual-stack socket counts as IPv4.
    #[test]
    fn a_beat_counts_only_from_its_nodes_addresses() {
        let v = view(&[("a", "10.0.0.1:7934"), ("b", "[fd00::2]:7934")]);
        let none = |_: &str| Vec::new();
        let ip = |s: &str| s.parse::<IpAddr>().unwrap();
        assert!(from_its_node("a", ip("10.0.0.1"), &v, none));
        assert!(from_its_node(
            "a",
            ip("::ffff:10.0.0.1").to_canonical(),
            &v,
            none
        ));
        assert!(
            !from_its_node("a", ip("10.0.0.66"), &v, none),
            "a forged beat"
        );
        assert!(from_its_node("b", ip("fd00::2"), &v, none));
        assert!(
            !from_its_node("b", ip("10.0.0.1"), &v, none),
            "a's address in b's name"
        );
        let node_ips = |n: &str| {
            if n == "a" {
                vec![ip("10.1.0.1")]
            } else {
                Vec::new()
            }
        };
        assert!(
            from_its_node("a", ip("10.1.0.1"), &v, node_ips),
            "its Node's other address"
        );
        assert!(
            from_its_node("c", ip("10.9.9.9"), &v, none),
            "unknown to gossip"
        );
    }

    /// A beat of node `node`, proved by `key` (`None`: no proof) with
    /// `counter`, `pair` with this node's key when given, signed if not.
    fn proved(
        node: &str,
        leaving: bool,
        key: Option<&NodeKey>,
        pair: Option<&PublicId>,
        counter: u64,
    ) -> Vec<u8> {
        let mut p = Vec::new();
        BeatMessage {
            node: node.into(),
            generation: Some(1),
            lapse: None,
            leaving,
            watching: false,
            silent: None,
        }
        .encode(&mut p);
        match (key, pair) {
            (Some(k), Some(me)) => Proof::pair(&mut p, counter, &k.pair_key(me).unwrap()),
            (Some(k), None) => Proof::sign(&mut p, counter, k),
            (None, _) => {}
        }
        p
    }

    /// What a node believes of beats: those its sender proved, by pair
    /// tag or signature, each once and in order; not those a key holder
    /// sends in another node's name (with its own key, or none), nor one
    /// played back; a node whose identity is not known yet waits; an agent
    /// without an identity (an earlier release) is believed from its own
    /// addresses only.
    #[test]
    fn drain_believes_only_what_each_node_proved() {
        let (me, a, forger) = (
            Arc::new(NodeKey::from_seed([9; 32])),
            NodeKey::from_seed([1; 32]),
            NodeKey::from_seed([2; 32]),
        );
        let ids = Identities::new();
        ids.set("a", Known::Key(a.public()));
        ids.set("old", Known::NoIdentity);
        let mut check = BeatCheck::new(me.clone(), ids.clone(), Duration::from_secs(30));
        let now = crate::gossip::beats::counter_now();
        let good: SocketAddr = "10.0.0.1:40000".parse().unwrap();
        let bad: SocketAddr = "10.0.0.66:40000".parse().unwrap();
        let (tx, mut rx) = mpsc::channel(16);
        let mine = me.public();
        // Each as it came: the loop may read them later than that.
        let t0 = Instant::now();
        let arrived = |ms: u64, (from, payload): (SocketAddr, Vec<u8>)| Arrived {
            from,
            payload,
            at: t0 + Duration::from_millis(ms),
        };
        for (i, b) in [
            (bad, proved("a", false, Some(&a), Some(&mine), now + 2)),
            (good, proved("a", true, Some(&forger), None, now + 3)),
            (good, proved("a", true, Some(&forger), Some(&mine), now + 4)),
            (good, proved("a", true, None, None, now + 5)),
            (good, proved("a", false, Some(&a), Some(&mine), now + 1)),
            (good, proved("a", true, Some(&a), None, now + 6)),
            (good, proved("a", true, Some(&a), None, now + 6)),
            (
                good,
                proved("a", false, Some(&a), Some(&mine), now - 60_000_000),
            ),
            (
                good,
                proved("stranger", false, Some(&forger), None, now + 7),
            ),
            (good, proved("old", false, None, None, now)),
            (bad, proved("old", false, None, None, now)),
        ]
        .into_iter()
        .enumerate()
        {
            tx.try_send(arrived(i as u64, b)).unwrap();
        }
        let first = arrived(100, (good, proved("a", false, Some(&a), Some(&mine), now)));
        let v = view(&[("a", "10.0.0.1:7934"), ("old", "10.0.0.1:7934")]);
        let (beats, refused) = drain(first, &mut rx, &mut check, |n, src| {
            from_its_node(n, src, &v, |_| Vec::new())
        });
        let kept: Vec<(&str, bool)> = beats.iter().map(|b| (b.node.as_str(), b.leaving)).collect();
        assert_eq!(
            kept,
            [("a", false), ("a", false), ("a", true), ("old", false)],
            "a's own, from any address, in order; its leaving beat once; the old agent's from its address"
        );
        let at: Vec<u128> = beats.iter().map(|b| (b.at - t0).as_millis()).collect();
        assert_eq!(at, [100, 0, 5, 9], "each beat counts from its arrival");
        let why: Vec<Refused> = refused.iter().map(|(w, _)| *w).collect();
        assert_eq!(
            why,
            [
                Refused::Unproved,
                Refused::Unproved,
                Refused::Unproved,
                Refused::Replayed,
                Refused::Replayed,
                Refused::Unknown,
                Refused::Address
            ]
        );
        assert!(ids.take_wanted(), "the records are asked for again");
    }

    fn plan(dense: &[&str], sparse: &[&str], relays: usize) -> BeatPlan {
        let addrs = |a: &[&str]| a.iter().map(|a| a.parse().unwrap()).collect();
        BeatPlan {
            dense: addrs(dense),
            sparse: addrs(sparse),
            lapse: None,
            relays: (0..relays)
                .map(|_| super::super::core::Relay {
                    node: "gone".into(),
                    generation: 1,
                    lapse: None,
                    to: vec!["10.0.0.9:7934".parse().unwrap()],
                })
                .collect(),
        }
    }

    /// Every tick while watched; only at the ticks that tell a watched
    /// owner or carry a relay otherwise; none with nothing to send.
    #[test]
    fn the_sender_wakes_only_for_ticks_that_send() {
        let relay_every = 2;
        assert_eq!(
            next_tick(&plan(&["10.0.0.2:7934"], &[], 0), 7, relay_every),
            Some(8)
        );
        assert_eq!(
            next_tick(&plan(&[], &["10.0.0.3:7934"], 0), 7, relay_every),
            Some(10)
        );
        assert_eq!(
            next_tick(&plan(&[], &["10.0.0.3:7934"], 0), 10, relay_every),
            Some(20)
        );
        assert_eq!(
            next_tick(&plan(&[], &["10.0.0.3:7934"], 1), 7, relay_every),
            Some(8)
        );
        assert_eq!(next_tick(&plan(&[], &[], 0), 7, relay_every), None);
    }

    struct Count(std::sync::Mutex<Vec<SocketAddr>>);
    impl ProbeSend for Count {
        fn send(&self, to: SocketAddr, _: &[u8]) {
            self.0.lock().unwrap().push(to);
        }
    }

    /// Over one second: a watched owner beats its watcher at every tick,
    /// a watcher tells its owner every tenth, an idle node sends nothing.
    #[tokio::test(start_paused = true)]
    async fn beats_go_out_as_the_plan_says() {
        let sent = Arc::new(Count(Default::default()));
        let (_, views) = watch::channel(MembershipView::empty());
        let beats = Beats::start(
            "me".into(),
            1,
            sent.clone(),
            Prover {
                key: Arc::new(NodeKey::from_seed([9; 32])),
                identities: Identities::new(),
                views,
                counter: Arc::default(),
            },
        );
        let count = |to: &str| {
            let to: SocketAddr = to.parse().unwrap();
            sent.0.lock().unwrap().iter().filter(|a| **a == to).count()
        };
        let second = async |beats: &Beats| {
            for _ in 0..40 {
                tokio::time::advance(BEAT_INTERVAL).await;
                beats.turned();
                tokio::task::yield_now().await;
            }
        };
        second(&beats).await;
        assert!(
            sent.0.lock().unwrap().is_empty(),
            "an idle node sends nothing"
        );
        beats.set_plan(plan(&["10.0.0.2:7934"], &["10.0.0.3:7934"], 0));
        second(&beats).await;
        // The plan's change goes out at once, then one per tick (40) or
        // one per tenth tick (4).
        assert!(
            (40..=41).contains(&count("10.0.0.2:7934")),
            "{}",
            count("10.0.0.2:7934")
        );
        assert!(
            (4..=5).contains(&count("10.0.0.3:7934")),
            "{}",
            count("10.0.0.3:7934")
        );
    }
}
