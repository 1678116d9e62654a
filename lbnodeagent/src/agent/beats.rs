//! Sends the owner sessions' beats (see `core::sessions`) on a task of its
//! own, so a loop busy with a large election does not fall silent; and
//! turns received beats into the core's input.
//!
//! Beats prove the loop lives, not only the process: the sender stops once
//! the loop has not turned for [`LOOP_STALL`], and the followers then
//! treat this node as they would a frozen one (its addresses still answer
//! on the wire, so they stay off until those lapse).

use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use tokio::sync::{mpsc, watch};

use super::core::BeatPlan;
use super::core::sessions::{BEAT_INTERVAL, Beat, Lapse, RELAY_EVERY, SPARSE_EVERY, Silent};
use crate::gossip::ProbeSend;
use crate::gossip::beats::{BeatMessage, Subject, send_leaving};

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
    let mut every = tokio::time::interval(BEAT_INTERVAL);
    every.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let relay_every = (RELAY_EVERY.as_millis() / BEAT_INTERVAL.as_millis()).max(1) as u64;
    let mut out = Vec::with_capacity(64);
    let mut stalled = false;
    let mut tick: u64 = 0;
    loop {
        // A new plan goes out at once to the peers it adds and the owners
        // it finds silent: a relay's first word is the one that counts.
        let changed = tokio::select! {
            _ = every.tick() => false,
            r = plan.changed() => {
                if r.is_err() {
                    return;
                }
                true
            }
        };
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
        if !changed {
            tick += 1;
        }
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

/// Every beat waiting, as one input (the first one awaited by the loop's
/// `select!`, the rest taken without waiting). Beats that do not decode
/// are dropped: they passed the signature, so they come from a newer
/// agent.
pub fn drain(
    first: (SocketAddr, Vec<u8>),
    recv: &mut mpsc::Receiver<(SocketAddr, Vec<u8>)>,
) -> Vec<Beat> {
    let mut beats = Vec::new();
    let mut next = Some(first);
    while let Some((_, payload)) = next {
        if let Some(m) = BeatMessage::decode(&payload) {
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
        }
        next = recv.try_recv().ok();
    }
    beats
}
