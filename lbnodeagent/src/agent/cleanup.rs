//! `lbnodeagent cleanup`: fencing after the agent is gone. systemd runs it
//! as `ExecStopPost=`, which runs even after SIGKILL, so a crashed agent's
//! host stops answering for its VIPs at once and its peers take over
//! within milliseconds instead of after failure detection.
//!
//! Make before break, judged on the wire: it sends a signed *leaving* beat
//! (see `gossip::beats`) to every peer the agent last knew
//! (`/run/lbnodeagent/peers`) and the configured seeds (eight times, 5 ms
//! apart), which take it as
//! this node leaving, so each VIP's next winner adds it and announces it
//! while this host still answers; it watches ARP/NA for another MAC to
//! claim each announced VIP (asking the LAN for the ones nobody claimed
//! yet); then removes every address the agent owns (by its tags and
//! record, never anything else). Peers of a release that ignores the
//! beat's flag, and lost beats, are covered by also announcing `leaving`
//! in gossip under a new generation after [`BEATS_FIRST`]; whichever shows
//! every VIP taken first ends the wait.
//! A config that cannot be read does not stop the removal: the addresses
//! are found through the default run directory.

use std::cell::RefCell;
use std::collections::{BTreeMap, BTreeSet};
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};
use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, Instant};

use hostlb_api::Family;
use tokio::sync::mpsc;
use tracing::{debug, info, warn};

use super::config::{AgentConfig, DEFAULT_RUN_DIR};
use super::{AgentError, GENERATION_FILE, PEERS_FILE};
use crate::addrs::{
    AddressBackend, Lifetime, MacAddr, NetlinkBackend, NetlinkConfig, OwnedAddress,
};
use crate::announce::{Announcer, Claims, Target};
use crate::gossip::beats::send_leaving;
use crate::gossip::{AuthTransport, LocalState, Membership, ProbeSend, Status};

/// How long `cleanup` waits to hear from a peer before giving up on telling
/// them (the removal is already done by then).
const REACH_PEERS: Duration = Duration::from_secs(1);
/// The leaving beats work alone this long: peers that read them take over
/// within a few milliseconds. Gossip as leaving starts after it.
const BEATS_FIRST: Duration = Duration::from_millis(100);
/// VIPs nobody has claimed yet are asked about this often (a gratuitous
/// ARP or NA can be lost, or come before the claims socket opened).
const ASK_EVERY: Duration = Duration::from_millis(50);
/// Longest `cleanup` waits for the API to take the `Stopped` record.
const RECORD_WAIT: Duration = Duration::from_secs(2);

#[derive(Debug, Default, PartialEq, Eq)]
pub struct Cleaned {
    pub removed: usize,
    pub failed: usize,
    /// Peers told: sent the leaving beat, or (gossip) that acknowledged the
    /// `leaving` state.
    pub told: usize,
}

pub async fn cleanup(config_path: &Path) -> Result<Cleaned, AgentError> {
    let cfg = match AgentConfig::load(config_path) {
        Ok(c) => Some(c),
        Err(e) => {
            warn!(error = %e, "config unreadable; removing addresses only");
            None
        }
    };
    let run_dir = cfg
        .as_ref()
        .map(|c| c.run_dir.clone())
        .unwrap_or_else(|| DEFAULT_RUN_DIR.into());
    let backend = NetlinkBackend::new(NetlinkConfig {
        run_dir: run_dir.clone(),
        ..NetlinkConfig::default()
    })
    .await?;
    let owned = backend.adopt().await?;
    let mut out = Cleaned::default();
    let removed_early = RefCell::new(Vec::new());
    let mut gossip = None;
    let record_cfg = cfg.clone();
    if let Some(cfg) = cfg {
        let (routed, announced): (Vec<OwnedAddress>, Vec<OwnedAddress>) = owned
            .iter()
            .cloned()
            .partition(|a| Some(&a.interface) == cfg.announce.virtual_interface.as_ref());
        // Every eligible node holds a routed address at once, so nobody
        // takes it over: it goes first, and the routing daemon withdraws
        // this node's route without waiting for the hand-over of the rest.
        let vips: Vec<_> = routed.iter().map(|a| a.vip(Lifetime::FOREVER)).collect();
        let results = backend.remove_many(&vips).await;
        for (a, result) in routed.into_iter().zip(results) {
            match result {
                Ok(_) => {
                    info!(ip = %a.ip, interface = %a.interface, "removed");
                    removed_early.borrow_mut().push(a);
                }
                Err(e) => warn!(ip = %a.ip, error = %e, "cannot remove; trying again at the end"),
            }
        }
        match hand_over(cfg, &backend, &run_dir, &announced, &removed_early).await {
            Ok((membership, told)) => {
                out.told = told;
                gossip = membership;
            }
            Err(e) => {
                warn!(error = %e, "cannot tell peers this node left; they notice by failure detection")
            }
        }
    }
    let removed_early = removed_early.into_inner();
    out.removed = removed_early.len();
    for a in owned {
        if removed_early.contains(&a) {
            continue;
        }
        let vip = a.vip(Lifetime::FOREVER);
        match backend.remove(&vip).await {
            Ok(_) => {
                info!(ip = %a.ip, interface = %a.interface, "removed");
                out.removed += 1;
            }
            Err(e) => {
                warn!(ip = %a.ip, error = %e, "cannot remove");
                out.failed += 1;
            }
        }
    }
    if let Some(m) = gossip {
        let _ = m.shutdown().await;
    }
    // With its addresses gone the table guards nothing; the next run
    // writes it again from its first view of the cluster. While any is
    // left (a removal failed), it stays: it guards them until they lapse.
    let firewall_on = record_cfg.as_ref().is_none_or(|c| c.firewall);
    let left = match backend.owned().await {
        Ok(left) => left.len(),
        Err(e) => {
            warn!(error = %e, "cannot read what is left of this node's addresses");
            out.failed.max(1)
        }
    };
    if left > 0 {
        warn!(
            left,
            table = crate::firewall::TABLE,
            "addresses of this node are left in the kernel; the firewall stays in force for them"
        );
    } else {
        match crate::firewall::apply(&crate::model::FirewallPlan::Off).await {
            Ok(()) => info!(table = crate::firewall::TABLE, "firewall removed"),
            Err(crate::firewall::FirewallError::Spawn(_)) if !firewall_on => {}
            Err(e) => warn!(error = %e, "cannot remove the firewall"),
        }
    }
    // Then the record says the agent stopped: readers see a crashed agent
    // at once, not when its heartbeat goes stale minutes later. After the
    // hand-over, which it must not slow (a client loads its CA roots).
    if let Some(cfg) = record_cfg {
        mark_stopped(cfg).await;
    }
    Ok(out)
}

/// Marks this node's `NodeAgent` record `Stopped` (the agent exited
/// without a clean stop), keeping what else it says; at most
/// [`RECORD_WAIT`], and only a log line if the API is away.
async fn mark_stopped(cfg: AgentConfig) {
    let write = async {
        let (client, _) = super::start::kube_client(&cfg)
            .await
            .map_err(|e| e.to_string())?;
        let why = "the agent exited without a clean stop (killed or crashed); cleanup handed its VIPs over";
        super::record::mark_stopped(&client, &cfg.node_name, why)
            .await
            .map_err(|e| e.to_string())
    };
    match tokio::time::timeout(RECORD_WAIT, write).await {
        Ok(Ok(())) => info!("NodeAgent record marked Stopped"),
        Ok(Err(e)) => {
            warn!(error = %e, "cannot mark the NodeAgent record Stopped; it goes stale instead")
        }
        Err(_) => warn!("the API did not answer in time; the NodeAgent record goes stale instead"),
    }
}

/// Tells the peers, by leaving beats and by gossip, and waits until each
/// announced VIP is another node's (on the wire or in gossip), at most
/// until a hand-over's bound. Returns gossip, when it was started, to stop
/// once the addresses are gone, and how many peers were told.
async fn hand_over(
    mut cfg: AgentConfig,
    backend: &NetlinkBackend,
    run_dir: &Path,
    announced: &[OwnedAddress],
    removed: &RefCell<Vec<OwnedAddress>>,
) -> Result<(Option<Membership>, usize), AgentError> {
    gossip_addresses(&mut cfg, backend).await?;
    let peers = known_peers(run_dir, &cfg);
    if peers.is_empty() && cfg.gossip.seeds.is_empty() {
        return Ok((None, 0));
    }
    let transport = cfg.gossip.auth_transport()?;
    let generation = std::fs::read_to_string(run_dir.join(GENERATION_FILE))
        .ok()
        .and_then(|g| g.trim().parse::<u64>().ok());
    // The node's own key: peers that know its identity believe nothing
    // in its name without it.
    let key = crate::identity::NodeKey::load_existing(run_dir).map(Arc::new);
    let beats = LeavingBeats::new(
        &transport,
        &cfg.node_name,
        generation,
        key.clone(),
        peers.clone(),
    );
    let wire = match WireWatch::open(backend, announced).await {
        Ok(w) => Some(w),
        Err(e) => {
            warn!(error = %e, "cannot watch ARP/NA; waiting for gossip to show the VIPs taken");
            None
        }
    };
    let started = Instant::now();
    let fast = async {
        match wire {
            Some(w) => w.until_taken(&beats, backend, removed).await,
            None => {
                beats.send_all().await;
                std::future::pending().await
            }
        }
    };
    let held: Vec<IpAddr> = announced.iter().map(|a| a.ip).collect();
    let slow = async {
        tokio::time::sleep(BEATS_FIRST).await;
        tell_peers(cfg, transport, key, &held, peers).await
    };
    tokio::select! {
        biased;
        () = fast => {
            info!(peers = beats.told(), elapsed_ms = started.elapsed().as_millis() as u64,
                "another node answers for every announced VIP");
            Ok((None, beats.told()))
        }
        r = slow => r,
    }
}

/// The listen and advertise addresses as the agent worked them out.
async fn gossip_addresses(
    cfg: &mut AgentConfig,
    backend: &NetlinkBackend,
) -> Result<(), AgentError> {
    cfg.gossip.listen = cfg.gossip.usable_listen();
    if cfg.gossip.advertise.is_none() && cfg.gossip.listen.ip().is_unspecified() {
        let links = super::kernel::read_links(backend, cfg, false).await;
        cfg.gossip.advertise = Some(super::default_advertise(cfg.gossip.listen, &links)?);
    }
    Ok(())
}

/// The gossip addresses of the peers the agent last knew, and the seeds
/// given as addresses.
fn known_peers(run_dir: &Path, cfg: &AgentConfig) -> Vec<SocketAddr> {
    let mut peers: BTreeSet<SocketAddr> = std::fs::read_to_string(run_dir.join(PEERS_FILE))
        .unwrap_or_default()
        .lines()
        .filter_map(|l| l.trim().parse::<SocketAddr>().ok())
        .collect();
    peers.extend(
        cfg.gossip
            .seeds
            .iter()
            .filter_map(|s| s.parse::<SocketAddr>().ok()),
    );
    if let Some(own) = cfg.gossip.advertise {
        peers.remove(&own);
    }
    peers.into_iter().collect()
}

/// The leaving beat, to every known peer, from a socket of each family.
struct LeavingBeats {
    node: String,
    /// The dead run's generation, when it noted one: peers then never
    /// take these beats for a newer run of the node.
    generation: Option<u64>,
    peers: Vec<SocketAddr>,
    key: Option<Arc<crate::identity::NodeKey>>,
    v4: Option<Arc<dyn ProbeSend>>,
    v6: Option<Arc<dyn ProbeSend>>,
}

impl LeavingBeats {
    fn new(
        transport: &AuthTransport,
        node: &str,
        generation: Option<u64>,
        key: Option<Arc<crate::identity::NodeKey>>,
        peers: Vec<SocketAddr>,
    ) -> LeavingBeats {
        let open = |family: Family, any: IpAddr| {
            if !peers.iter().any(|p| Family::of(p.ip()) == family) {
                return None;
            }
            transport
                .sender(SocketAddr::new(any, 0))
                .inspect_err(
                    |e| warn!(error = %e, ?family, "cannot open a socket for leaving beats"),
                )
                .ok()
        };
        LeavingBeats {
            v4: open(Family::V4, Ipv4Addr::UNSPECIFIED.into()),
            v6: open(Family::V6, Ipv6Addr::UNSPECIFIED.into()),
            node: node.to_string(),
            generation,
            key,
            peers,
        }
    }

    /// Every round (see `gossip::beats::send_leaving`).
    async fn send_all(&self) {
        // Without the dead run's generation, peers take the beat for the
        // run gossip shows.
        // The dead run's own counter is gone with it: the clock is past
        // the last count it used, and grows from round to round.
        let counter = crate::gossip::beats::Counter::default();
        send_leaving(
            &self.node,
            self.generation,
            self.key.as_deref(),
            &counter,
            &self.peers,
            |to, payload| {
                let socket = if to.is_ipv4() { &self.v4 } else { &self.v6 };
                if let Some(s) = socket {
                    s.send(to, payload);
                }
            },
        )
        .await;
    }

    fn told(&self) -> usize {
        self.peers.len()
    }
}

/// Who claims the announced VIPs on the wire.
struct WireWatch {
    claims: mpsc::Receiver<crate::announce::packet::Claim>,
    reader: tokio::task::JoinHandle<()>,
    announcer: Announcer,
    /// Announced VIPs no other MAC has claimed yet, and where to ask.
    unclaimed: BTreeMap<IpAddr, (OwnedAddress, Option<Target>)>,
    ours: BTreeSet<MacAddr>,
}

impl Drop for WireWatch {
    fn drop(&mut self) {
        self.reader.abort();
    }
}

impl WireWatch {
    async fn open(
        backend: &NetlinkBackend,
        announced: &[OwnedAddress],
    ) -> Result<WireWatch, AgentError> {
        let claims = Claims::open()?;
        let announcer = Announcer::new()?;
        let links = backend.interfaces().await?;
        let ours = links.iter().filter_map(|l| l.mac).collect();
        let unclaimed = announced
            .iter()
            .map(|a| {
                let target = links
                    .iter()
                    .find(|l| l.index == a.ifindex)
                    .and_then(|l| Target::on(l, a.ip));
                (a.ip, (a.clone(), target))
            })
            .collect();
        let (tx, rx) = mpsc::channel(1024);
        // As in the agent (`wire::admit`): a claim counts only from the
        // interface its address is on, and an advertisement only from the
        // link; anything else would let a pod on this host, or a host
        // beyond a router, have the VIP removed before a successor holds.
        let on: BTreeMap<IpAddr, u32> = announced.iter().map(|a| (a.ip, a.ifindex)).collect();
        let reader = tokio::spawn(async move {
            while let Ok(heard) = claims.next().await {
                if !heard.on_link || on.get(&heard.claim.ip) != Some(&heard.ifindex) {
                    continue;
                }
                if tx.send(heard.claim).await.is_err() {
                    return;
                }
            }
        });
        Ok(WireWatch {
            claims: rx,
            reader,
            announcer,
            unclaimed,
            ours,
        })
    }

    /// Sends the beats, removes each VIP as soon as another MAC claims it
    /// (into `removed`), and returns once none is left and every beat went
    /// out.
    async fn until_taken(
        mut self,
        beats: &LeavingBeats,
        backend: &NetlinkBackend,
        removed: &RefCell<Vec<OwnedAddress>>,
    ) {
        let start = tokio::time::Instant::now();
        let mut next_ask = start + ASK_EVERY;
        let sending = beats.send_all();
        tokio::pin!(sending);
        let mut sent = false;
        while !self.unclaimed.is_empty() {
            tokio::select! {
                () = &mut sending, if !sent => sent = true,
                claim = self.claims.recv() => match claim {
                    Some(first) => {
                        let mut taken = Vec::new();
                        let mut next = Some(first);
                        while let Some(c) = next {
                            if !self.ours.contains(&c.mac)
                                && let Some((a, _)) = self.unclaimed.remove(&c.ip)
                            {
                                taken.push((a, c.mac));
                            }
                            next = self.claims.try_recv().ok();
                        }
                        let vips: Vec<_> = taken.iter().map(|(a, _)| a.vip(Lifetime::FOREVER)).collect();
                        let results = backend.remove_many(&vips).await;
                        for ((a, mac), result) in taken.into_iter().zip(results) {
                            match result {
                                Ok(_) => {
                                    info!(ip = %a.ip, interface = %a.interface, answered_by = %mac,
                                        "another host answers; removed");
                                    removed.borrow_mut().push(a);
                                }
                                Err(e) => warn!(ip = %a.ip, error = %e, "cannot remove; trying again at the end"),
                            }
                        }
                    }
                    None => std::future::pending().await,
                },
                () = tokio::time::sleep_until(next_ask) => {
                    for t in self.unclaimed.values().filter_map(|(_, t)| t.as_ref()) {
                        if let Err(e) = self.announcer.probe(t).await {
                            debug!(ip = %t.ip, error = %e, "cannot ask about a VIP");
                        }
                    }
                    next_ask += ASK_EVERY;
                }
            }
        }
        // Peers that missed the first beats (and, with nothing announced,
        // every peer) still hear the rest.
        if !sent {
            sending.await;
        }
    }
}

/// Starts gossip as this node, `leaving`, and waits until a peer answered
/// and every address in `held` shows up at another node (each bounded).
/// Returns the running membership, to stop once the addresses are gone.
async fn tell_peers(
    mut cfg: AgentConfig,
    transport: AuthTransport,
    key: Option<Arc<crate::identity::NodeKey>>,
    held: &[IpAddr],
    peers: Vec<SocketAddr>,
) -> Result<(Option<Membership>, usize), AgentError> {
    let mut seeds: Vec<String> = peers.iter().map(|a| a.to_string()).collect();
    seeds.extend(cfg.gossip.seeds.iter().cloned());
    seeds.sort();
    seeds.dedup();
    cfg.gossip.seeds = seeds;
    // The killed agent's socket can outlive it for a moment (the process
    // still exiting): then say it from another port. Peers learn the
    // address from the signed state and answer there.
    if let Err(e) = crate::gossip::bind_udp(cfg.gossip.listen)
        && e.kind() == std::io::ErrorKind::AddrInUse
    {
        let free = crate::gossip::bind_udp(SocketAddr::new(cfg.gossip.listen.ip(), 0))
            .and_then(|s| s.local_addr())
            .map_err(AgentError::NoPort)?;
        info!(busy = %cfg.gossip.listen, port = free.port(),
            "the gossip port is still held; telling peers from another");
        cfg.gossip.listen.set_port(free.port());
        if let Some(a) = &mut cfg.gossip.advertise {
            a.set_port(free.port());
        }
    }
    let local = LocalState {
        status: Status::Leaving,
        ..LocalState::default()
    };
    let membership = Membership::start(&cfg.gossip, local, &transport, &transport).await?;
    if let Some(key) = key {
        membership.sign_with(key).await;
    }
    let mut views = membership.views();
    let others = |v: &crate::gossip::MembershipView| -> Vec<Arc<crate::gossip::MemberInfo>> {
        v.nodes
            .iter()
            .filter(|n| n.node != cfg.node_name)
            .cloned()
            .collect()
    };
    let deadline = Instant::now() + REACH_PEERS;
    while others(&views.borrow()).is_empty() && Instant::now() < deadline {
        let _ = tokio::time::timeout_at(deadline.into(), views.changed()).await;
    }
    let told = others(&views.borrow()).len();
    if told == 0 {
        return Ok((Some(membership), 0));
    }
    // Push the state to every live peer at once.
    membership.set_leaving().await;
    let deadline = Instant::now() + super::HANDOVER_MAX;
    loop {
        let peers = others(&views.borrow());
        let taken = held
            .iter()
            .all(|ip| peers.iter().any(|n| n.vips.contains(ip)));
        if taken || Instant::now() >= deadline {
            if !taken {
                warn!("not every VIP was taken over in time; removing anyway");
            }
            break;
        }
        let _ = tokio::time::timeout_at(deadline.into(), views.changed()).await;
    }
    info!(peers = told, "told peers this node left");
    Ok((Some(membership), told))
}
