//! Whether this node still reaches its default gateways: upstream health.
//!
//! A node whose uplink or router is gone while its carrier stays up (a
//! switch port in the wrong VLAN, a router's interface down, an ACL) would
//! keep its VIPs, and their clients beyond the router would be black-holed.
//! So every second the agent asks each default gateway for its link-layer
//! address, as the kernel's neighbour table would (an ARP request from the
//! host's own address; a Neighbor Solicitation from its link-local one),
//! and listens for the answer. A gateway that answered and then stays
//! silent for `upstream.lost_after` is lost: the core marks the node's
//! prefixes of that interface and family (`OnLink::upstream_lost`), which
//! its gossip carries, and every agent's election ranks the node last for
//! the VIPs it would hold there, as if drained. So its VIPs move, make
//! before break, to a node that reaches its gateway; and when no candidate
//! does (the router itself is down), the order among them is the usual
//! one and nothing moves.
//!
//! A gateway that never answered since the agent started (or since the
//! default route named it) is not lost: a network whose router does not
//! answer this host's ARP (or a test bed with no router at all) must not
//! rank every node last one by one as each agent starts. A lost gateway
//! is back once it has answered for [`BACK_AFTER`], so a router that drops
//! a probe now and then does not move VIPs to and fro.
//!
//! [`Checks`] decides (pure, with the clock passed in); [`GatewayProbe`]
//! sends, listens and reports to the loop.

use std::collections::BTreeMap;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr, SocketAddrV6, UdpSocket};
use std::time::{Duration, Instant};

use tokio::sync::{mpsc, watch};
use tracing::{debug, warn};

use crate::model::{Gateway, MacAddr, UpstreamLost};

use super::packet;
use super::sys::{ClaimSocket, PacketSocket, Received};

/// How often each gateway is asked: at each whole second of the wall
/// clock (see [`until_next_round`]).
pub const PROBE_EVERY: Duration = Duration::from_secs(1);
/// How long a lost gateway must answer again before it counts as back.
pub const BACK_AFTER: Duration = Duration::from_secs(2);

/// One gateway as checked: what it last did.
#[derive(Clone, Debug)]
struct Check {
    gateway: Gateway,
    /// When it last answered; `None` while it never has.
    answered: Option<Instant>,
    /// Judged lost; with, once it answers again, since when it does.
    lost: Option<Option<Instant>>,
}

/// The gateways of this node and what each last did: the decisions of
/// upstream health, without a socket or a clock.
#[derive(Debug)]
pub struct Checks {
    lost_after: Duration,
    /// By gateway address and interface index.
    checks: BTreeMap<(IpAddr, u32), Check>,
}

impl Checks {
    pub fn new(lost_after: Duration) -> Checks {
        Checks {
            lost_after,
            checks: BTreeMap::new(),
        }
    }

    /// The gateways the routes name now. A gateway still named keeps what
    /// it did; a new one starts as never answered.
    pub fn set(&mut self, gateways: &[Gateway]) {
        self.checks.retain(|_, c| gateways.contains(&c.gateway));
        for g in gateways {
            self.checks
                .entry((g.addr, g.ifindex))
                .or_insert_with(|| Check {
                    gateway: g.clone(),
                    answered: None,
                    lost: None,
                });
        }
    }

    pub fn gateways(&self) -> impl Iterator<Item = &Gateway> {
        self.checks.values().map(|c| &c.gateway)
    }

    /// `addr` answered on interface `ifindex` (0: unknown, any).
    pub fn answered(&mut self, addr: IpAddr, ifindex: u32, now: Instant) {
        for ((a, i), c) in self.checks.iter_mut() {
            if *a == addr && (ifindex == 0 || *i == ifindex) {
                c.answered = Some(now);
                if let Some(back @ None) = &mut c.lost {
                    *back = Some(now);
                }
            }
        }
    }

    /// Judges every gateway at `now`: the interfaces and families whose
    /// gateway is lost.
    pub fn judge(&mut self, now: Instant) -> UpstreamLost {
        let lost_after = self.lost_after;
        let mut out = UpstreamLost::new();
        for c in self.checks.values_mut() {
            let silent = c
                .answered
                .is_some_and(|t| now.saturating_duration_since(t) >= lost_after);
            c.lost = match c.lost {
                None if silent => Some(None),
                None => None,
                // Silent again before it was back: the wait starts over.
                Some(_) if silent => Some(None),
                Some(Some(back)) if now.saturating_duration_since(back) >= BACK_AFTER => None,
                still => still,
            };
            if c.lost.is_some() {
                out.insert((c.gateway.interface.clone(), c.gateway.family()));
            }
        }
        out
    }
}

/// What the probe sends from: the gateway, and the MAC of the interface
/// it is reached through.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Probe {
    pub gateway: Gateway,
    pub mac: MacAddr,
}

/// The task that asks the gateways and listens for them. Dropped, it stops.
pub struct GatewayProbe {
    probes: watch::Sender<Vec<Probe>>,
    /// Every change of the lost set.
    pub lost: mpsc::Receiver<UpstreamLost>,
    _task: crate::addrs::AbortOnDrop,
}

impl GatewayProbe {
    /// Starts the task; inside a Tokio runtime. A node that cannot open
    /// the sockets (no CAP_NET_RAW) says so once and reports nothing: no
    /// gateway is then ever lost.
    pub fn start(lost_after: Duration) -> GatewayProbe {
        let (probes, probes_rx) = watch::channel(Vec::new());
        let (tx, lost) = mpsc::channel(8);
        let task = tokio::spawn(run(probes_rx, tx, lost_after));
        GatewayProbe {
            probes,
            lost,
            _task: crate::addrs::AbortOnDrop(task),
        }
    }

    /// The gateways to check from now on.
    pub fn set(&self, probes: Vec<Probe>) {
        self.probes.send_if_modified(|p| {
            let changed = *p != probes;
            *p = probes;
            changed
        });
    }
}

async fn run(
    mut probes: watch::Receiver<Vec<Probe>>,
    tx: mpsc::Sender<UpstreamLost>,
    lost_after: Duration,
) {
    let sockets = PacketSocket::open().and_then(|out| Ok((out, ClaimSocket::open()?)));
    let (out, answers) = match sockets {
        Ok(s) => s,
        Err(e) => {
            warn!(error = %e, "cannot open raw sockets to check the default gateways; upstream health is off");
            return;
        }
    };
    let mut checks = Checks::new(lost_after);
    let mut current: Vec<Probe> = Vec::new();
    let mut sources: Vec<Option<IpAddr>> = Vec::new();
    let mut reported = UpstreamLost::new();
    let round = tokio::time::sleep(until_next_round());
    tokio::pin!(round);
    loop {
        tokio::select! {
            changed = probes.changed() => {
                if changed.is_err() {
                    return;
                }
                current = probes.borrow_and_update().clone();
                let gateways: Vec<Gateway> = current.iter().map(|p| p.gateway.clone()).collect();
                checks.set(&gateways);
                sources = current.iter().map(|p| source_for(&p.gateway)).collect();
                let v4: std::collections::BTreeSet<IpAddr> =
                    gateways.iter().map(|g| g.addr).filter(IpAddr::is_ipv4).collect();
                if let Err(e) = answers.watch(&v4) {
                    warn!(error = %e, "cannot filter ARP for the default gateways");
                }
            }
            () = &mut round => {
                round.as_mut().reset(tokio::time::Instant::now() + until_next_round());
                // Judged before asking again: the last round's answers
                // came within milliseconds of it.
                let lost = checks.judge(Instant::now());
                if lost != reported {
                    reported = lost.clone();
                    if tx.send(lost).await.is_err() {
                        return;
                    }
                }
                for (p, source) in current.iter().zip(sources.iter_mut()) {
                    if source.is_none() {
                        *source = source_for(&p.gateway);
                    }
                    let frame = match (p.gateway.addr, *source) {
                        (IpAddr::V4(gw), Some(IpAddr::V4(from))) => packet::arp_request(p.mac, from, gw),
                        // No address of its own toward the gateway yet: a
                        // probe, which a router answers as any host does.
                        (IpAddr::V4(gw), _) => packet::arp_probe(p.mac, gw),
                        (IpAddr::V6(gw), Some(IpAddr::V6(from))) => packet::solicitation(p.mac, from, gw),
                        (IpAddr::V6(gw), _) => packet::dad_solicitation(p.mac, gw),
                    };
                    if let Err(e) = out.send(p.gateway.ifindex, &frame).await {
                        debug!(gateway = %p.gateway.addr, error = %e, "cannot ask the gateway");
                    }
                }
            }
            got = answers.recv() => match got {
                Ok(Some(r)) => {
                    if let Some((addr, ifindex)) = answer(&r) {
                        checks.answered(addr, ifindex, Instant::now());
                    }
                }
                Ok(None) => {}
                Err(e) => {
                    warn!(error = %e, "cannot read the gateways' answers; upstream health is off");
                    return;
                }
            }
        }
    }
}

/// The time to the next round: rounds fall on the whole seconds of the
/// wall clock, on every node alike. When a router dies, every node heard
/// it last in the same round and finds it lost in the same later round,
/// each before the others' word of it comes by gossip; were the rounds
/// out of step, the first node to find it lost would hand its VIPs to a
/// node about to find the same, and take them back a moment later.
fn until_next_round() -> Duration {
    let into = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| Duration::from_nanos(u64::from(d.subsec_nanos())))
        .unwrap_or_default();
    PROBE_EVERY
        .saturating_sub(into)
        .max(Duration::from_millis(1))
}

/// Who answered, and on which interface: the sender of an ARP frame (the
/// kernel's filter passes only the gateways'), or the target of a Neighbor
/// Advertisement sent on the link.
fn answer(r: &Received) -> Option<(IpAddr, u32)> {
    match r {
        Received::Arp { frame, ifindex } => {
            let sender: [u8; 4] = frame.get(28..32)?.try_into().ok()?;
            let sender = Ipv4Addr::from(sender);
            (!sender.is_unspecified()).then_some((IpAddr::V4(sender), *ifindex))
        }
        Received::Icmp6 {
            message,
            ifindex,
            hop_limit,
        } => {
            if message.first() != Some(&136) || *hop_limit != Some(255) {
                return None;
            }
            let target: [u8; 16] = message.get(8..24)?.try_into().ok()?;
            Some((IpAddr::V6(Ipv6Addr::from(target)), *ifindex))
        }
    }
}

/// The address the kernel would send from toward `gateway`: a UDP socket
/// connected to it (no datagram leaves) is given it.
fn source_for(gateway: &Gateway) -> Option<IpAddr> {
    let (bind, to): (SocketAddr, SocketAddr) = match gateway.addr {
        IpAddr::V4(gw) => (
            SocketAddr::from((Ipv4Addr::UNSPECIFIED, 0)),
            SocketAddr::from((gw, 9)),
        ),
        IpAddr::V6(gw) => {
            let scope = if gw.is_unicast_link_local() {
                gateway.ifindex
            } else {
                0
            };
            (
                SocketAddr::from((Ipv6Addr::UNSPECIFIED, 0)),
                SocketAddr::V6(SocketAddrV6::new(gw, 9, 0, scope)),
            )
        }
    };
    let s = UdpSocket::bind(bind).ok()?;
    s.connect(to).ok()?;
    let ip = s.local_addr().ok()?.ip();
    (!ip.is_unspecified()).then_some(ip)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn gw(interface: &str, ifindex: u32, addr: &str) -> Gateway {
        Gateway {
            interface: interface.into(),
            ifindex,
            addr: addr.parse().unwrap(),
        }
    }

    fn lost(pairs: &[(&str, hostlb_api::Family)]) -> UpstreamLost {
        pairs.iter().map(|(i, f)| (i.to_string(), *f)).collect()
    }

    /// Lost only after answering and then staying silent for the bound;
    /// back only after answering again for [`BACK_AFTER`].
    #[test]
    fn a_gateway_is_lost_after_it_falls_silent_and_back_after_it_answers_a_while() {
        use hostlb_api::Family::V4;
        let t = Instant::now();
        let s = |n: u64| t + Duration::from_millis(n);
        let mut c = Checks::new(Duration::from_secs(3));
        c.set(&[gw("eth0", 2, "10.0.0.1")]);
        // Never answered: not lost, however long.
        assert_eq!(c.judge(s(60_000)), lost(&[]));
        c.answered("10.0.0.1".parse().unwrap(), 2, s(60_000));
        assert_eq!(c.judge(s(62_999)), lost(&[]));
        assert_eq!(c.judge(s(63_000)), lost(&[("eth0", V4)]));
        // One answer is not enough to be back.
        c.answered("10.0.0.1".parse().unwrap(), 2, s(64_000));
        assert_eq!(c.judge(s(64_000)), lost(&[("eth0", V4)]));
        assert_eq!(c.judge(s(65_999)), lost(&[("eth0", V4)]));
        c.answered("10.0.0.1".parse().unwrap(), 2, s(65_000));
        c.answered("10.0.0.1".parse().unwrap(), 2, s(66_000));
        assert_eq!(c.judge(s(66_000)), lost(&[]));
    }

    /// Silent again while coming back: the wait to be back starts over.
    #[test]
    fn a_gateway_that_falls_silent_while_coming_back_stays_lost() {
        use hostlb_api::Family::V6;
        let t = Instant::now();
        let s = |n: u64| t + Duration::from_millis(n);
        let fe80: IpAddr = "fe80::1".parse().unwrap();
        let mut c = Checks::new(Duration::from_secs(3));
        c.set(&[gw("eth0", 2, "fe80::1")]);
        c.answered(fe80, 2, s(0));
        assert_eq!(c.judge(s(3_000)), lost(&[("eth0", V6)]));
        c.answered(fe80, 2, s(3_500));
        assert_eq!(c.judge(s(4_000)), lost(&[("eth0", V6)]));
        // Silent from 3.5 s: lost again at 6.5 s, and the answer at 7 s
        // starts a new wait, not the old one.
        assert_eq!(c.judge(s(6_500)), lost(&[("eth0", V6)]));
        c.answered(fe80, 2, s(7_000));
        assert_eq!(c.judge(s(8_000)), lost(&[("eth0", V6)]));
        c.answered(fe80, 2, s(9_000));
        assert_eq!(c.judge(s(9_000)), lost(&[]));
    }

    /// Answers count only from the gateway's own interface; a gateway the
    /// routes no longer name is forgotten, and one they name again starts
    /// as never answered.
    #[test]
    fn answers_count_per_interface_and_a_new_route_starts_afresh() {
        use hostlb_api::Family::V4;
        let t = Instant::now();
        let s = |n: u64| t + Duration::from_millis(n);
        let g: IpAddr = "10.0.0.1".parse().unwrap();
        let mut c = Checks::new(Duration::from_secs(3));
        c.set(&[gw("eth0", 2, "10.0.0.1")]);
        c.answered(g, 2, s(0));
        c.answered(g, 7, s(2_000));
        assert_eq!(c.judge(s(3_000)), lost(&[("eth0", V4)]));
        c.set(&[gw("eth1", 3, "10.0.0.1")]);
        assert_eq!(c.judge(s(3_000)), lost(&[]));
        assert_eq!(c.gateways().count(), 1);
        c.set(&[gw("eth0", 2, "10.0.0.1")]);
        assert_eq!(c.judge(s(10_000)), lost(&[]), "never answered since");
    }

    #[test]
    fn answers_are_an_arp_sender_or_an_advertised_target_on_the_link() {
        let arp = packet::gratuitous_arp(
            packet::ArpOp::Reply,
            MacAddr([2, 0, 0, 0, 0, 1]),
            "10.0.0.1".parse().unwrap(),
        );
        let got = answer(&Received::Arp {
            frame: arp.bytes.clone(),
            ifindex: 2,
        });
        assert_eq!(got, Some(("10.0.0.1".parse().unwrap(), 2)));
        let probe = packet::arp_probe(MacAddr([2, 0, 0, 0, 0, 1]), "10.0.0.1".parse().unwrap());
        assert_eq!(
            answer(&Received::Arp {
                frame: probe.bytes,
                ifindex: 2
            }),
            None,
            "a probe names no sender"
        );
        let na = packet::unsolicited_na(MacAddr([2, 0, 0, 0, 0, 1]), "fe80::1".parse().unwrap());
        let message = na.bytes[14 + 40..].to_vec();
        let from = |hop_limit| {
            answer(&Received::Icmp6 {
                message: message.clone(),
                ifindex: 2,
                hop_limit,
            })
        };
        assert_eq!(from(Some(255)), Some(("fe80::1".parse().unwrap(), 2)));
        assert_eq!(from(Some(64)), None, "sent from off the link");
    }
}
