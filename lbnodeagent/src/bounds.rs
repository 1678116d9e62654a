//! What a client may see, at most: the bounds both checkers hold the
//! agent to (the simulation's, `sim/check/`, and the fault campaign's on
//! the real binaries), each derived from the core's constants it follows
//! (docs/agent.md, "The simulation", has the table). Widening one needs
//! the derivation changed here, not a number. Plain constants, built with
//! the agent, so neither checker has to build the other's code.

use std::time::Duration;

use crate::agent::core::conflict::{
    LAPSE_HOLD, LAPSE_PROBE, OWNER_PROBE, PRECHECK, YIELD_HOLD, YIELD_PROBE,
};
use crate::agent::core::upstream::SETTLE_ROUNDS;
use crate::agent::core::{HANDOVER_MAX, LEAVE_MAX, STARTUP_GRACE, UNCONFIRMED_GRACE};

/// The settled end of a run in which nothing may change.
pub const STEADY_WINDOW: Duration = Duration::from_secs(6);
/// The simulated gossip's interval and the detector's period (ms).
pub const GOSSIP_PERIOD_MS: u64 = 100;
/// Slowest failure detection of the simulated gossip while the detector
/// is busy, at small sizes: a probe period or two until some node probes
/// the dead one, a period for the probe to fail, the suspicion timeout.
pub const DETECTION_BUSY: Duration = Duration::from_millis(650);
/// What rest adds to it: each node starts a probe only every
/// [`REST_PERIODS`](crate::gossip::REST_PERIODS) periods, and in
/// a cluster of three a node probes each peer at least once in three
/// cycles (its two peers in a fresh order each round), so the wait for
/// the probe that finds the dead node grows by up to three times the
/// cycle's extra. A VIP that only SWIM can move (its owner watched by no
/// session, or a new VIP whose winner died unseen) is dark that much
/// longer; an owner that a session watches is taken over in its beats'
/// time, at rest or not.
pub const REST_WAIT: Duration =
    Duration::from_millis(3 * (crate::gossip::REST_PERIODS as u64 - 1) * GOSSIP_PERIOD_MS);
/// Slowest failure detection of the simulated gossip, from rest.
pub const DETECTION: Duration = DETECTION_BUSY.saturating_add(REST_WAIT);
/// Two owners after a make-before-break move started, at most: the hand-over
/// time, and a gossip round or two (with loss) for the word to spread.
pub const HANDOVER_BOUND: Duration = HANDOVER_MAX.saturating_add(Duration::from_secs(1));
/// Two owners while one of them is leaving (SIGTERM), at most: it waits
/// for its successors up to [`LEAVE_MAX`]. Counted from its SIGTERM: a
/// pair that began before (two views that differ, say) was within its own
/// bound until then, and the leave gives the leaving node its whole wait.
pub const LEAVING_BOUND: Duration = LEAVE_MAX.saturating_add(Duration::from_millis(500));
/// Two hosts answer while `cleanup` hands a killed agent's address over
/// (SPEC: two MACs at most 50 ms).
pub const CLEANUP_BOUND: Duration = Duration::from_millis(50);
/// Two owners while one of them is still starting, at most: the time for
/// its peer's state to reach it.
pub const STARTING_BOUND: Duration = Duration::from_secs(1);
/// Two owners across a gossip-only partition, at most: the owner probes
/// each held VIP every [`OWNER_PROBE`] and the lower-ranked one lets go on
/// the first answer it hears; a node that was handing the VIP over when
/// the partition began may not hear from its winner (which yielded to the
/// far side) and keeps answering its hand-over time.
pub const PARTITION_BOUND: Duration = OWNER_PROBE
    .saturating_add(OWNER_PROBE)
    .saturating_add(HANDOVER_MAX)
    .saturating_add(Duration::from_millis(500));
/// From the end of a pre-check's window to its address in the kernel: a
/// kernel batch (`BATCH_MS` and a little per address), with a margin.
pub const PRECHECK_SLACK: Duration = Duration::from_millis(20);
/// From an agent finding its gateways lost or back to the last of its
/// peers counting it in their elections: its own wait of
/// [`SETTLE_ROUNDS`] gossip rounds (300 ms at the simulation's 100 ms),
/// the slowest spread of its word (150 ms) and a round lost, a peer's
/// same wait, and a pre-check and batch for a move decided meanwhile; with
/// a margin. Until then a holder whose gateway came back is still last
/// resort by some peer's word.
pub const UPSTREAM_COUNTED: Duration =
    Duration::from_millis(2 * SETTLE_ROUNDS as u64 * GOSSIP_PERIOD_MS + 150 + 100 + 50 + 100);
/// Since the last unplanned fault, for a stall to be judged on its own:
/// detection and a rejoin, with a margin.
pub const CALM: Duration = Duration::from_secs(3);
/// No owner while a candidate lives, at most: detection, the probe window,
/// and a yield to a dead owner whose address just lapsed ([`YIELD_HOLD`]
/// after it was last heard, asked every [`YIELD_PROBE`]), with a margin
/// for a refused add's retry: while the winner's kernel refuses, it is no
/// candidate, and once it takes operations again the retry comes within
/// [`ADD_RETRY_MAX`](crate::agent::core::ADD_RETRY_MAX) and its pre-check (450 ms with the batch).
pub const NO_OWNER_BOUND: Duration = DETECTION
    .saturating_add(YIELD_HOLD)
    .saturating_add(YIELD_PROBE)
    .saturating_add(PRECHECK)
    .saturating_add(Duration::from_millis(800));

/// Two live, ready agents that gossip connects and that have the same
/// view of the cluster hold one VIP together at most this long: a
/// make-before-break move waits [`HANDOVER_MAX`] for the winner to show the
/// VIP held, a contest of equal views lets the lower-ranked go after as
/// long, and gossip carries either word in a round or two (with loss).
pub const AGREED_BOUND: Duration = HANDOVER_MAX.saturating_add(Duration::from_secs(1));
/// From a dead owner's lapse to its successor's answer, when the successor
/// knew when it would lapse: it asks every [`LAPSE_PROBE`] from before,
/// takes the VIP once [`LAPSE_HOLD`] passes unanswered, and the kernel
/// batch adds it ([`PRECHECK_SLACK`]).
pub const LAPSE_BOUND: Duration = LAPSE_HOLD
    .saturating_add(LAPSE_PROBE)
    .saturating_add(PRECHECK_SLACK);

/// Two hosts that answer together again this soon after one of them let
/// go, with nothing carried out and no change of the cluster between, are
/// the same episode, judged from its first start: a node made to let go
/// by the contest that takes the VIP again a few milliseconds later would
/// otherwise restart the bound's clock at every take and flap under it
/// for ever (each take a gratuitous ARP that turns the clients). An owner
/// probe's period: the contest settles on the first answer to one, and
/// with nothing new, nothing a node learns in less time tells it the VIP
/// is its own again. A fault, a planned change, a new view or an agent
/// finding its gateways lost or back between the two begins an episode of
/// its own, under its own bound.
pub const REJOIN_GAP: Duration = OWNER_PROBE;

/// From the moment nothing keeps an agent from it (started, thawed, its
/// API server or kernel back) to ready, at most: the start's grace for
/// its peers ([`STARTUP_GRACE`]); a peer seen within it that the failure
/// detector has not confirmed is waited for [`UNCONFIRMED_GRACE`] more;
/// then a hand-over's time for the gossip rounds that settle membership,
/// the pre-check of an address another host answers for and the kernel's
/// batch.
pub const READY_BOUND: Duration = STARTUP_GRACE
    .saturating_add(UNCONFIRMED_GRACE)
    .saturating_add(HANDOVER_MAX);

/// After a bound is broken, the run goes on this long to see how long the
/// broken situation lasts: by how much the bound was missed, which tells a
/// bound a little too tight from a rule that never settles.
pub const FOLLOW: Duration = Duration::from_secs(10);
