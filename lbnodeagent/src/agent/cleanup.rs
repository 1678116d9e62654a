//! `lbnodeagent cleanup`: fencing after the agent is gone. systemd runs it
//! as `ExecStopPost=`, which runs even after SIGKILL, so a crashed agent's
//! host stops answering for its VIPs at once and its peers take over within
//! a gossip round instead of after failure detection.
//!
//! It announces this node as `leaving` in gossip under a new generation,
//! which peers take as the node's newest state, to the peers the agent last
//! knew (`/run/lbnodeagent/peers`) and the configured seeds; waits (briefly)
//! until they show the node's VIPs as theirs, so no ARP request goes
//! unanswered; then removes every address the agent owns (by its tags and
//! record, never anything else).
//! A config that cannot be read does not stop the removal: the addresses
//! are found through the default run directory.

use std::net::{IpAddr, SocketAddr};
use std::path::Path;
use std::time::{Duration, Instant};

use hostlb_api::Family;
use tracing::{info, warn};

use super::config::{AgentConfig, DEFAULT_RUN_DIR};
use super::{AgentError, PEERS_FILE, source_address};
use crate::addrs::{AddressBackend, NetlinkBackend, NetlinkConfig};
use crate::gossip::{LocalState, Membership, Status};

/// How long `cleanup` waits to hear from a peer before giving up on telling
/// them (the removal is already done by then).
const REACH_PEERS: Duration = Duration::from_secs(1);

#[derive(Debug, Default, PartialEq, Eq)]
pub struct Cleaned {
    pub removed: usize,
    pub failed: usize,
    /// Peers that acknowledged the `leaving` state.
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
    // Make before break: peers learn this node left and take its VIPs over
    // (the kernel here answers meanwhile), then the addresses go.
    let mut gossip = None;
    if let Some(cfg) = cfg {
        let announced: Vec<IpAddr> = owned
            .iter()
            .filter(|a| Some(&a.interface) != cfg.announce.virtual_interface.as_ref())
            .map(|a| a.ip)
            .collect();
        match tell_peers(cfg, &backend, &run_dir, &announced).await {
            Ok((membership, told)) => {
                out.told = told;
                gossip = membership;
            }
            Err(e) => {
                warn!(error = %e, "cannot tell peers this node left; they notice by failure detection")
            }
        }
    }
    for a in owned {
        let vip = a.vip(crate::addrs::Lifetime::FOREVER);
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
    Ok(out)
}

/// Starts gossip as this node, `leaving`, and waits until a peer answered
/// and every address in `held` shows up at another node (each bounded).
/// Returns the running membership, to stop once the addresses are gone.
async fn tell_peers(
    mut cfg: AgentConfig,
    backend: &NetlinkBackend,
    run_dir: &Path,
    held: &[IpAddr],
) -> Result<(Option<Membership>, usize), AgentError> {
    let mut seeds: Vec<String> = std::fs::read_to_string(run_dir.join(PEERS_FILE))
        .unwrap_or_default()
        .lines()
        .filter_map(|l| l.trim().parse::<SocketAddr>().ok())
        .map(|a| a.to_string())
        .collect();
    seeds.extend(cfg.gossip.seeds.iter().cloned());
    seeds.sort();
    seeds.dedup();
    if seeds.is_empty() {
        return Ok((None, 0));
    }
    cfg.gossip.seeds = seeds;
    // The killed agent's socket can outlive it for a moment (the process
    // still exiting): then say it from another port. Peers learn the
    // address from the signed state and answer there.
    if let Err(e) = std::net::UdpSocket::bind(cfg.gossip.listen)
        && e.kind() == std::io::ErrorKind::AddrInUse
    {
        let free = std::net::UdpSocket::bind(SocketAddr::new(cfg.gossip.listen.ip(), 0))
            .and_then(|s| s.local_addr())
            .map_err(AgentError::NoPort)?;
        info!(busy = %cfg.gossip.listen, port = free.port(),
            "the gossip port is still held; telling peers from another");
        cfg.gossip.listen.set_port(free.port());
        if let Some(a) = &mut cfg.gossip.advertise {
            a.set_port(free.port());
        }
    }
    if cfg.gossip.advertise.is_none() && cfg.gossip.listen.ip().is_unspecified() {
        let family = if cfg.gossip.listen.is_ipv4() {
            Family::V4
        } else {
            Family::V6
        };
        let iface = backend
            .announce_interface(family, cfg.announce.interface.as_deref())
            .await?;
        let ip = iface
            .prefixes_of(family)
            .next()
            .and_then(source_address)
            .ok_or(AgentError::NoAdvertise)?;
        cfg.gossip.advertise = Some(SocketAddr::new(ip, cfg.gossip.listen.port()));
    }
    let transport = cfg.gossip.auth_transport()?;
    let local = LocalState {
        status: Status::Leaving,
        ..LocalState::default()
    };
    let membership = Membership::start(&cfg.gossip, local, &transport, &transport).await?;
    let mut views = membership.views();
    let others = |v: &crate::gossip::MembershipView| -> Vec<crate::gossip::MemberInfo> {
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
