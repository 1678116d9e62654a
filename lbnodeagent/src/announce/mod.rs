//! Telling the LAN that a VIP has moved here: gratuitous ARP for IPv4,
//! unsolicited Neighbor Advertisements for IPv6, sent right after the
//! address is added so switches and clients update at once instead of when
//! their caches expire.
//!
//! Flow: the agent's core decides every round ([`Announcer::round`]):
//! `garp_count` of them `garp_interval` apart after it adds a VIP, and one
//! every `refresh_interval` while it holds it when that is set; it stops
//! asking the moment the VIP is no longer its own, so a VIP lost
//! mid-announcement is not advertised again. [`Announcer::announce`] is the
//! same schedule as one task, checking ownership before each round; a
//! round that fails to send (the link flapping down for a moment) is logged
//! and the next one tried. Frames are built in [`packet`]; the raw socket
//! lives in `sys`, the crate's only unsafe code.

pub mod gateway;
pub mod packet;
#[allow(unsafe_code)]
mod sys;

#[cfg(test)]
pub(crate) use sys::in_new_netns;

use std::future::Future;
use std::io;
use std::net::IpAddr;

use tokio::sync::watch;

pub use crate::model::{AnnounceConfig, Target};
use packet::{ArpOp, Frame};

pub type Result<T, E = Error> = std::result::Result<T, E>;

#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("cannot open a raw packet socket: {0}; the agent needs CAP_NET_RAW")]
    Socket(#[source] io::Error),

    #[error(
        "sending a {kind} for {ip} on interface index {ifindex} failed: {source}; check that the interface still exists and is up"
    )]
    Send {
        kind: &'static str,
        ip: IpAddr,
        ifindex: u32,
        #[source]
        source: io::Error,
    },
}

impl Target {
    /// The frames of one round.
    pub fn frames(&self) -> Vec<Frame> {
        match self.ip {
            IpAddr::V4(v4) => vec![
                packet::gratuitous_arp(ArpOp::Request, self.mac, v4),
                packet::gratuitous_arp(ArpOp::Reply, self.mac, v4),
            ],
            IpAddr::V6(v6) => vec![packet::unsolicited_na(self.mac, v6)],
        }
    }
}

/// Asked before every round: does this node still hold the VIP? Announcing a
/// VIP another node has taken would pull its traffic back here.
pub trait Ownership: Send {
    fn still_owned(&mut self) -> bool;
}

impl<F: FnMut() -> bool + Send> Ownership for F {
    fn still_owned(&mut self) -> bool {
        self()
    }
}

/// The reconcile loop's per-VIP ownership flag.
impl Ownership for watch::Receiver<bool> {
    fn still_owned(&mut self) -> bool {
        *self.borrow_and_update()
    }
}

/// How an announcement ended.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Outcome {
    /// Every round was tried; `rounds` of them were sent (fewer than
    /// configured when some failed, each failure logged).
    Sent { rounds: u32 },
    /// Ownership was lost after `rounds` rounds; nothing more was sent.
    Lost { rounds: u32 },
}

/// Sends announcements through one raw socket, shared by every VIP.
pub struct Announcer {
    socket: sys::PacketSocket,
}

impl Announcer {
    /// Opens the packet socket; needs CAP_NET_RAW and a Tokio runtime.
    pub fn new() -> Result<Announcer> {
        Ok(Announcer {
            socket: sys::PacketSocket::open().map_err(Error::Socket)?,
        })
    }

    /// One announcement round about `target`: what the agent's core asks
    /// for, `garp_count` times after it adds a VIP.
    pub async fn round(&self, target: &Target) -> Result<()> {
        self.send_round(target).await
    }

    async fn send_round(&self, target: &Target) -> Result<()> {
        for frame in target.frames() {
            self.send(target, &frame).await?;
        }
        Ok(())
    }

    /// One frame about `target` out of its interface.
    async fn send(&self, target: &Target, frame: &Frame) -> Result<()> {
        self.socket
            .send(target.ifindex, frame)
            .await
            .map_err(|source| Error::Send {
                kind: frame.kind,
                ip: target.ip,
                ifindex: target.ifindex,
                source,
            })
    }

    /// `config.count` rounds, `config.interval` apart, the first at once,
    /// each only while `owned` says the VIP is still ours. A round that fails
    /// is logged and the next one tried; an error only if every round failed.
    pub async fn announce(
        &self,
        target: &Target,
        config: &AnnounceConfig,
        owned: &mut impl Ownership,
    ) -> Result<Outcome> {
        let outcome = rounds(config, owned, || self.send_round(target)).await?;
        tracing::info!(ip = %target.ip, ifindex = target.ifindex, mac = %target.mac,
            ?outcome, "announced");
        Ok(outcome)
    }
}

impl Announcer {
    /// Asks the LAN who holds `target.ip` (an ARP probe or a DAD-style
    /// Neighbor Solicitation from `target.mac`); answers arrive as
    /// [`Claims`]. One frame, so an owner can afford one per held VIP a
    /// second.
    pub async fn probe(&self, target: &Target) -> Result<()> {
        let frame = match target.ip {
            IpAddr::V4(v4) => packet::arp_probe(target.mac, v4),
            IpAddr::V6(v6) => packet::dad_solicitation(target.mac, v6),
        };
        self.send(target, &frame).await
    }
}

/// Every claim on the wire: a host answering an ARP probe, sending
/// gratuitous ARP or ARP from an address, or advertising an IPv6 address
/// with its MAC. The caller keeps the ones for its own VIPs that name a MAC
/// not its own, heard on the interface the VIP is announced on; that is
/// how a second owner is seen.
pub struct Claims {
    socket: sys::ClaimSocket,
}

/// A claim on the wire, and what the kernel would make of it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Heard {
    pub claim: packet::Claim,
    /// The index of the interface it arrived on.
    pub ifindex: u32,
    /// Sent on the link: any ARP frame; a Neighbor Advertisement only with
    /// hop limit 255 (RFC 4861 7.1.2: any other was routed from off the
    /// link, or forged, and a receiver drops it, as the kernel does).
    pub on_link: bool,
}

impl Claims {
    /// Needs CAP_NET_RAW and a Tokio runtime.
    pub fn open() -> Result<Claims> {
        Ok(Claims {
            socket: sys::ClaimSocket::open().map_err(Error::Socket)?,
        })
    }

    /// Lets the kernel drop ARP that claims none of `watched` (see
    /// `ClaimSocket::watch`).
    pub fn watch(&self, watched: &std::collections::BTreeSet<std::net::IpAddr>) -> io::Result<()> {
        self.socket.watch(watched)
    }

    /// The next frame that says something of an address.
    pub async fn next(&self) -> io::Result<Heard> {
        loop {
            if let Some(received) = self.socket.recv().await?
                && let Some(h) = heard_in(received)
            {
                return Ok(h);
            }
        }
    }

    /// The next of the frames the host has already received that says
    /// something of an address, or `None` once none is left; never waits.
    pub fn try_next(&self) -> io::Result<Option<Heard>> {
        while let Some(received) = self.socket.try_recv()? {
            if let Some(h) = heard_in(received) {
                return Ok(Some(h));
            }
        }
        Ok(None)
    }
}

fn heard_in(received: sys::Received) -> Option<Heard> {
    match received {
        sys::Received::Arp { frame, ifindex } => Some(Heard {
            claim: packet::arp_claim(&frame)?,
            ifindex,
            on_link: true,
        }),
        sys::Received::Icmp6 {
            message,
            ifindex,
            hop_limit,
        } => Some(Heard {
            claim: packet::na_claim(&message)?,
            ifindex,
            on_link: hop_limit == Some(255),
        }),
    }
}

/// The schedule of [`Announcer::announce`], apart from the socket. (A plain
/// closure returning a future rather than an async closure: the latter's
/// future is not `Send` for every lifetime, which spawning needs.)
async fn rounds<F: Future<Output = Result<()>>>(
    config: &AnnounceConfig,
    owned: &mut impl Ownership,
    mut send: impl FnMut() -> F,
) -> Result<Outcome> {
    let mut sent = 0;
    let mut last_error = None;
    for round in 0..config.count {
        if round > 0 {
            tokio::time::sleep(config.interval).await;
        }
        if !owned.still_owned() {
            return Ok(Outcome::Lost { rounds: sent });
        }
        match send().await {
            Ok(()) => sent += 1,
            Err(e) => {
                tracing::warn!(round, error = %e, "announcement round failed; trying the next");
                last_error = Some(e);
            }
        }
    }
    match last_error {
        Some(e) if sent == 0 => Err(e),
        _ => Ok(Outcome::Sent { rounds: sent }),
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;
    use std::time::Duration;

    use crate::model::{Interface, MacAddr};
    use std::sync::atomic::{AtomicU32, Ordering};

    use std::future::ready;

    use tokio::time::Instant;

    use super::*;

    fn config(count: u32, ms: u64) -> AnnounceConfig {
        AnnounceConfig {
            count,
            interval: Duration::from_millis(ms),
            refresh: None,
        }
    }

    #[tokio::test(start_paused = true)]
    async fn rounds_are_spaced_by_the_interval_first_at_once() {
        let start = Instant::now();
        let mut times = Vec::new();
        let outcome = rounds(&config(3, 500), &mut || true, || {
            times.push(start.elapsed());
            ready(Ok(()))
        })
        .await
        .unwrap();
        assert_eq!(outcome, Outcome::Sent { rounds: 3 });
        assert_eq!(times, [0, 500, 1000].map(Duration::from_millis).to_vec());
    }

    #[tokio::test(start_paused = true)]
    async fn ownership_is_checked_before_every_round() {
        let checks = Arc::new(AtomicU32::new(0));
        let c = Arc::clone(&checks);
        // owned for the first two checks only
        let mut owned = move || c.fetch_add(1, Ordering::SeqCst) < 2;
        let mut sent = 0;
        let outcome = rounds(&config(5, 100), &mut owned, || {
            sent += 1;
            ready(Ok(()))
        })
        .await
        .unwrap();
        assert_eq!(outcome, Outcome::Lost { rounds: 2 });
        assert_eq!(sent, 2);
        assert_eq!(checks.load(Ordering::SeqCst), 3);
    }

    #[tokio::test(start_paused = true)]
    async fn a_watch_channel_is_an_ownership_check() {
        let (tx, mut rx) = watch::channel(true);
        let mut sent = 0;
        let outcome = rounds(&config(3, 100), &mut rx, || {
            sent += 1;
            if sent == 1 {
                tx.send(false).unwrap();
            }
            ready(Ok(()))
        })
        .await
        .unwrap();
        assert_eq!(outcome, Outcome::Lost { rounds: 1 });
    }

    fn down() -> Error {
        Error::Socket(io::Error::from_raw_os_error(libc::ENETDOWN))
    }

    #[tokio::test(start_paused = true)]
    async fn a_failed_round_does_not_end_the_announcement() {
        let start = Instant::now();
        let mut tried = Vec::new();
        // The link is down for the first round only.
        let outcome = rounds(&config(3, 100), &mut || true, || {
            tried.push(start.elapsed());
            ready(if tried.len() == 1 {
                Err(down())
            } else {
                Ok(())
            })
        })
        .await
        .unwrap();
        assert_eq!(outcome, Outcome::Sent { rounds: 2 });
        assert_eq!(tried, [0, 100, 200].map(Duration::from_millis).to_vec());
    }

    #[tokio::test(start_paused = true)]
    async fn only_every_round_failing_is_an_error() {
        let mut tried = 0;
        let err = rounds(&config(3, 100), &mut || true, || {
            tried += 1;
            ready(Err(down()))
        })
        .await
        .unwrap_err();
        assert!(matches!(err, Error::Socket(_)));
        assert_eq!(tried, 3, "every round was tried");
        // Ownership lost after failures: nothing sent, nothing to report.
        let mut checks = 0;
        let mut owned = move || {
            checks += 1;
            checks < 2
        };
        let outcome = rounds(&config(3, 100), &mut owned, || ready(Err(down())))
            .await
            .unwrap();
        assert_eq!(outcome, Outcome::Lost { rounds: 0 });
    }

    /// The reconcile loop spawns announcements on a multi-threaded runtime.
    #[allow(dead_code)]
    fn announcements_can_move_between_threads(a: &Announcer, t: &Target, c: &AnnounceConfig) {
        fn send<T: Send>(_: T) {}
        send(a.announce(t, c, &mut || true));
    }

    #[test]
    fn a_round_is_request_and_reply_for_ipv4_and_one_na_for_ipv6() {
        let mac = MacAddr([2, 0, 0, 0, 0, 1]);
        let v4 = Target {
            ifindex: 2,
            mac,
            ip: "10.0.0.1".parse().unwrap(),
        };
        let kinds: Vec<_> = v4.frames().iter().map(|f| f.kind).collect();
        assert_eq!(kinds, ["arp request", "arp reply"]);
        let v6 = Target {
            ip: "fd00::1".parse().unwrap(),
            ..v4
        };
        let kinds: Vec<_> = v6.frames().iter().map(|f| f.kind).collect();
        assert_eq!(kinds, ["neighbor advertisement"]);
    }

    #[test]
    fn no_mac_no_target() {
        let iface = Interface {
            name: "wg0".into(),
            index: 4,
            mac: None,
            carrier: true,
            prefixes: vec![],
        };
        assert_eq!(Target::on(&iface, "10.0.0.1".parse().unwrap()), None);
    }
}
