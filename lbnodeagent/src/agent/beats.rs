//! Sends the owner sessions' beats (see `core::sessions`) on a task of its
//! own, so a loop busy with a large election does not fall silent; and
//! turns received beats into the core's input.
//!
//! Beats prove the loop lives, not only the process: the sender stops once
//! the loop has not turned for [`LOOP_STALL`], and the followers then
//! treat this node as they would a frozen one (its addresses still answer
//! on the wire, so they stay off until those lapse).

use std::net::{IpAddr, SocketAddr};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use tokio::sync::{mpsc, watch};
use tracing::warn;

use super::core::BeatPlan;
use super::core::sessions::{BEAT_INTERVAL, Beat, Lapse, RELAY_EVERY, SPARSE_EVERY, Silent};
use crate::gossip::ProbeSend;
use crate::gossip::beats::{BeatMessage, Subject, send_leaving};
use crate::model::MembershipView;

/// A loop that has not turned for this long sends no more beats. The loop
/// turns at least once a second (links are re-read then).
pub const LOOP_STALL: Duration = Duration::from_millis(1_500);

/// `turned` before the loop's first turn: nothing is sent yet.
const NOT_YET: u64 = u64::MAX;

/// The loop's side: the plan to follow, and proof of life.
pub struct Beats {
    node: String,
    generation: u64,
    send: Arc<dyn ProbeSend>,
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
    pub fn start(node: String, generation: u64, send: Arc<dyn ProbeSend>) -> Beats {
        let (plan, plan_rx) = watch::channel(BeatPlan::default());
        let turned = Arc::new(AtomicU64::new(NOT_YET));
        let base = tokio::time::Instant::now();
        let task = tokio::spawn(send_beats(
            node.clone(),
            generation,
            send.clone(),
            plan_rx,
            turned.clone(),
            base,
        ));
        Beats {
            node,
            generation,
            send,
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
        let node = self.node.clone();
        let generation = Some(self.generation);
        let send = self.send.clone();
        tokio::spawn(async move {
            send_leaving(&node, generation, &peers, |to, payload| {
                send.send(to, payload)
            })
            .await;
        });
    }

    /// The loop turned.
    pub fn turned(&self) {
        self.turned
            .store(self.base.elapsed().as_millis() as u64, Ordering::Relaxed);
    }
}

async fn send_beats(
    node: String,
    generation: u64,
    send: Arc<dyn ProbeSend>,
    mut plan: watch::Receiver<BeatPlan>,
    turned: Arc<AtomicU64>,
    base: tokio::time::Instant,
) {
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
            () = sleep_until(due) => false,
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
                leaving: false,
                watching,
                node: node.clone(),
                generation: Some(generation),
                lapse: lapse(plan.lapse),
                silent: None,
            }
            .encode(&mut out);
            for peer in to {
                send.send(*peer, &out);
            }
        }
        if changed || tick.is_multiple_of(relay_every) {
            for r in &plan.relays {
                BeatMessage {
                    leaving: false,
                    watching: false,
                    node: node.clone(),
                    generation: Some(generation),
                    lapse: lapse(plan.lapse),
                    silent: Some(Subject {
                        node: r.node.clone(),
                        generation: Some(r.generation),
                        lapse: lapse(r.lapse),
                    }),
                }
                .encode(&mut out);
                for peer in &r.to {
                    send.send(*peer, &out);
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

async fn sleep_until(due: Option<tokio::time::Instant>) {
    match due {
        Some(at) => tokio::time::sleep_until(at).await,
        None => std::future::pending().await,
    }
}

/// Every beat waiting, as one input (the first one awaited by the loop's
/// `select!`, the rest taken without waiting). Beats that do not decode
/// are dropped: they passed the signature, so they come from a newer
/// agent. So are beats from an address their named node does not have
/// (`from_its_node`): the gossip key proves a sender is a member, not
/// which one, so a beat in another node's name from elsewhere is a
/// forgery. How many were refused comes back too.
pub fn drain(
    first: (SocketAddr, Vec<u8>),
    recv: &mut mpsc::Receiver<(SocketAddr, Vec<u8>)>,
    from_its_node: impl Fn(&str, IpAddr) -> bool,
) -> (Vec<Beat>, usize) {
    let mut beats = Vec::new();
    let mut refused = 0;
    let mut next = Some(first);
    while let Some((source, payload)) = next {
        if let Some(m) = BeatMessage::decode(&payload) {
            if from_its_node(&m.node, source.ip().to_canonical()) {
                beats.push(Beat {
                    node: m.node,
                    generation: m.generation,
                    lapse: m.lapse,
                    leaving: m.leaving,
                    watching: m.watching,
                    silent: m.silent.map(|s| Silent {
                        node: s.node,
                        generation: s.generation,
                        lapse: s.lapse,
                    }),
                });
            } else {
                if refused == 0 {
                    warn!(node = %m.node, from = %source, "a beat in a node's name from an address that node does not have; dropped");
                }
                refused += 1;
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
            .map(|(n, a)| MemberInfo {
                node: n.to_string(),
                gossip_addr: a.parse().unwrap(),
                status: Status::Alive,
                ..v.local.clone()
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

    /// `drain` drops and counts what the check refuses, and keeps the rest
    /// in order.
    #[test]
    fn drain_drops_and_counts_beats_from_elsewhere() {
        let beat = |node: &str| {
            let mut p = Vec::new();
            BeatMessage {
                node: node.into(),
                generation: Some(1),
                lapse: None,
                leaving: true,
                watching: false,
                silent: None,
            }
            .encode(&mut p);
            p
        };
        let (tx, mut rx) = mpsc::channel(8);
        let good: SocketAddr = "10.0.0.1:40000".parse().unwrap();
        let bad: SocketAddr = "10.0.0.66:40000".parse().unwrap();
        tx.try_send((bad, beat("a"))).unwrap();
        tx.try_send((good, beat("a"))).unwrap();
        let v = view(&[("a", "10.0.0.1:7934")]);
        let (beats, refused) = drain((good, beat("a")), &mut rx, |n, src| {
            from_its_node(n, src, &v, |_| Vec::new())
        });
        assert_eq!(beats.len(), 2);
        assert_eq!(refused, 1);
        assert!(beats.iter().all(|b| b.node == "a" && b.leaving));
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
        let beats = Beats::start("me".into(), 1, sent.clone());
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
