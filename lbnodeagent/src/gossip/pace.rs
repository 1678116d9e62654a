//! Pacing: a byte budget on the gossip a node sends.
//!
//! Every SYN and SYN-ACK carries a digest naming every member, and a
//! chitchat round sends three SYNs, so a node's traffic grows with the
//! cluster: about 1 kB/s per member at 100 ms rounds, 1 MB/s at 1,000
//! members (figures in `docs/agent-network.md`). The pacer keeps a token
//! bucket filled at the budget; everything the node sends drains it by its
//! size on the wire, and a SYN to a live peer is held back (dropped before
//! it is encoded) while the bucket is empty. Replies always go: refusing a
//! SYN-ACK or an ACK would break an exchange another node started, and those
//! come at the rate the other nodes' own pacers allow. Small clusters never
//! reach the budget and keep the 100 ms behaviour.
//!
//! Under pressure (less than half a second of budget left) a node starts at
//! most one exchange per half interval, so a round sends one SYN instead of
//! three, and rounds are skipped while the bucket is empty. The spacing
//! matters as much as the volume: the failure detector times a peer out at
//! phi × the mean gap between news of its heartbeat, and three SYN-ACKs
//! landing together after a skipped round shrink that mean without
//! shortening the gaps, which is how an unspaced bucket made the detector
//! flap. Either way news spreads more slowly, so crashes are detected later.
//!
//! Never held back: SYNs to nodes that are not live (chitchat's dead-node
//! and seed probes, run-time seeds: they merge partitions and are at most
//! two a round) and everything while the node leaves (the pushes that tell
//! peers at once).

use std::collections::HashSet;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use async_trait::async_trait;
use chitchat::transport::{RecvOutcome, SendOutcome, Socket, Transport};
use chitchat::{ChitchatEnvelope, ChitchatMessage};
use tokio::time::Instant;

/// IPv4 and UDP headers, charged per message on top of what the transport
/// reports (the signed frame, with the authenticated transport).
const IP_UDP_HEADERS: u64 = 28;
/// How much unused budget may pile up: one second of it, so a node that was
/// quiet can still send a whole round at once.
const BURST: Duration = Duration::from_secs(1);

/// State shared by the socket (which spends) and the membership (which says
/// who is live and when the node leaves).
#[derive(Debug)]
pub struct Pace {
    /// Bytes per second; `None`: no budget.
    budget: Option<u64>,
    bucket: Mutex<Bucket>,
    live: Mutex<HashSet<SocketAddr>>,
    unpaced: AtomicBool,
    held: Arc<AtomicU64>,
    /// Least time between two exchanges started under pressure.
    spacing: Duration,
}

#[derive(Debug)]
struct Bucket {
    tokens: f64,
    at: Instant,
    last_syn: Option<Instant>,
}

impl Pace {
    /// `interval`: the gossip round period.
    pub fn new(budget: Option<u64>, interval: Duration) -> Arc<Pace> {
        Arc::new(Pace {
            budget,
            spacing: interval / 2,
            bucket: Mutex::new(Bucket {
                tokens: budget.map_or(0.0, capacity),
                at: Instant::now(),
                last_syn: None,
            }),
            live: Mutex::default(),
            unpaced: AtomicBool::new(false),
            held: Arc::default(),
        })
    }

    /// The gossip addresses of live peers: only SYNs to these are paced.
    pub fn set_live(&self, live: impl IntoIterator<Item = SocketAddr>) {
        if self.budget.is_none() {
            return;
        }
        *self.live.lock().expect("pace lock") = live.into_iter().collect();
    }

    /// From now on nothing is held back (the node is leaving).
    pub fn unpace(&self) {
        self.unpaced.store(true, Ordering::Relaxed);
    }

    /// SYNs held back so far (a metric: non-zero means the budget, not the
    /// interval, sets the pace of gossip).
    pub fn held(&self) -> u64 {
        self.held.load(Ordering::Relaxed)
    }

    /// The same count, shared, for the metrics endpoint.
    pub fn held_counter(&self) -> Arc<AtomicU64> {
        self.held.clone()
    }

    fn refill(&self, bucket: &mut Bucket, budget: u64) {
        let now = Instant::now();
        let elapsed = now.duration_since(bucket.at).as_secs_f64();
        bucket.at = now;
        bucket.tokens = (bucket.tokens + elapsed * budget as f64).min(capacity(budget));
    }

    /// Whether a message may be sent now.
    fn admit(&self, to: SocketAddr, message: &ChitchatMessage) -> bool {
        let Some(budget) = self.budget else {
            return true;
        };
        if !matches!(message, ChitchatMessage::Syn { .. })
            || self.unpaced.load(Ordering::Relaxed)
            || !self.live.lock().expect("pace lock").contains(&to)
        {
            return true;
        }
        let mut bucket = self.bucket.lock().expect("pace lock");
        self.refill(&mut bucket, budget);
        let now = bucket.at;
        let relaxed = bucket.tokens >= capacity(budget) / 2.0;
        let spaced = bucket
            .last_syn
            .is_none_or(|last| now.duration_since(last) >= self.spacing);
        if relaxed || (bucket.tokens > 0.0 && spaced) {
            bucket.last_syn = Some(now);
            true
        } else {
            self.held.fetch_add(1, Ordering::Relaxed);
            false
        }
    }

    fn spend(&self, bytes: usize) {
        let Some(budget) = self.budget else {
            return;
        };
        let mut bucket = self.bucket.lock().expect("pace lock");
        self.refill(&mut bucket, budget);
        bucket.tokens -= (bytes as u64 + IP_UDP_HEADERS) as f64;
    }
}

/// The most unused budget the bucket keeps, in bytes.
fn capacity(budget: u64) -> f64 {
    budget as f64 * BURST.as_secs_f64()
}

/// Hands chitchat one socket, opened beforehand on the caller's transport
/// and wrapped in the pacer. chitchat wants a `'static` transport and opens
/// exactly one socket; the membership only borrows the caller's transport.
pub(super) struct PacedTransport {
    socket: Mutex<Option<Box<dyn Socket>>>,
    pace: Arc<Pace>,
}

impl PacedTransport {
    pub(super) async fn open(
        inner: &dyn Transport,
        listen: SocketAddr,
        pace: Arc<Pace>,
    ) -> anyhow::Result<PacedTransport> {
        Ok(PacedTransport {
            socket: Mutex::new(Some(inner.open(listen).await?)),
            pace,
        })
    }
}

#[async_trait]
impl Transport for PacedTransport {
    async fn open(&self, _listen: SocketAddr) -> anyhow::Result<Box<dyn Socket>> {
        let inner = self
            .socket
            .lock()
            .expect("transport lock")
            .take()
            .ok_or_else(|| anyhow::anyhow!("the gossip socket was already opened"))?;
        Ok(Box::new(PacedSocket {
            inner,
            pace: self.pace.clone(),
        }))
    }
}

struct PacedSocket {
    inner: Box<dyn Socket>,
    pace: Arc<Pace>,
}

#[async_trait]
impl Socket for PacedSocket {
    fn local_addr(&self) -> anyhow::Result<SocketAddr> {
        self.inner.local_addr()
    }

    async fn send(
        &mut self,
        to: SocketAddr,
        envelope: ChitchatEnvelope,
    ) -> anyhow::Result<SendOutcome> {
        if !self.pace.admit(to, &envelope.message) {
            return Ok(SendOutcome { num_bytes_sent: 0 });
        }
        let outcome = self.inner.send(to, envelope).await?;
        self.pace.spend(outcome.num_bytes_sent);
        Ok(outcome)
    }

    async fn recv(&mut self) -> anyhow::Result<RecvOutcome> {
        self.inner.recv().await
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn syn() -> ChitchatMessage {
        ChitchatMessage::Syn {
            cluster_id: "test".into(),
            digest: Default::default(),
        }
    }

    fn ack() -> ChitchatMessage {
        ChitchatMessage::Ack {
            delta: Default::default(),
        }
    }

    const INTERVAL: Duration = Duration::from_millis(100);

    const PEER: SocketAddr = SocketAddr::new(
        std::net::IpAddr::V4(std::net::Ipv4Addr::new(10, 0, 0, 2)),
        7934,
    );
    const STRANGER: SocketAddr = SocketAddr::new(
        std::net::IpAddr::V4(std::net::Ipv4Addr::new(10, 0, 0, 3)),
        7934,
    );

    #[tokio::test(start_paused = true)]
    async fn syns_to_live_peers_wait_for_the_budget() {
        let pace = Pace::new(Some(10_000), INTERVAL);
        pace.set_live([PEER]);
        // One second of budget to start with.
        assert!(pace.admit(PEER, &syn()));
        pace.spend(10_000);
        assert!(!pace.admit(PEER, &syn()), "bucket empty");
        assert_eq!(pace.held(), 1);
        // Replies, and SYNs to nodes that are not live, always go.
        assert!(pace.admit(PEER, &ack()));
        assert!(pace.admit(STRANGER, &syn()));
        // The bucket refills at the budget: 28 header bytes owed, then 100 ms
        // bring 1,000 bytes.
        tokio::time::advance(Duration::from_millis(100)).await;
        assert!(pace.admit(PEER, &syn()));
        pace.spend(2_000);
        assert!(!pace.admit(PEER, &syn()));
        tokio::time::advance(Duration::from_millis(110)).await;
        assert!(pace.admit(PEER, &syn()));
    }

    #[tokio::test(start_paused = true)]
    async fn under_pressure_a_round_starts_one_exchange() {
        let pace = Pace::new(Some(10_000), INTERVAL);
        pace.set_live([PEER, STRANGER]);
        // Plenty left: a whole round of three SYNs goes.
        for _ in 0..3 {
            assert!(pace.admit(PEER, &syn()));
            pace.spend(1_000);
        }
        // Under half a second of budget left: one SYN per half interval.
        pace.spend(3_000);
        tokio::time::advance(INTERVAL).await;
        assert!(pace.admit(PEER, &syn()));
        pace.spend(100);
        assert!(!pace.admit(PEER, &syn()), "second SYN of the round");
        assert!(!pace.admit(PEER, &syn()), "third SYN of the round");
        tokio::time::advance(INTERVAL).await;
        assert!(pace.admit(PEER, &syn()), "next round");
    }

    #[tokio::test(start_paused = true)]
    async fn unused_budget_piles_up_to_one_second() {
        let pace = Pace::new(Some(1_000), INTERVAL);
        pace.set_live([PEER]);
        tokio::time::advance(Duration::from_secs(60)).await;
        pace.spend(1_000);
        assert!(!pace.admit(PEER, &syn()), "at most one second was saved");
    }

    #[tokio::test(start_paused = true)]
    async fn a_leaving_node_and_an_unlimited_one_are_never_held() {
        let pace = Pace::new(Some(1_000), INTERVAL);
        pace.set_live([PEER]);
        pace.spend(100_000);
        assert!(!pace.admit(PEER, &syn()));
        pace.unpace();
        assert!(pace.admit(PEER, &syn()));

        let unlimited = Pace::new(None, INTERVAL);
        unlimited.set_live([PEER]);
        unlimited.spend(100_000_000);
        assert!(unlimited.admit(PEER, &syn()));
        assert_eq!(unlimited.held(), 0);
    }
}
