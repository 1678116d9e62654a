//! `lbnodeagent cleanup`: fencing after the agent is gone. systemd runs it
//! as `ExecStopPost=`, which runs even after SIGKILL, so a crashed agent's
//! host stops answering for its VIPs at once and its peers take over within
//! a gossip round instead of after failure detection.
//!
//! It removes every address the agent owns (by its tags and record, never
//! anything else) and announces this node as `leaving` in gossip under a new
//! generation, which peers take as the node's newest state, to the peers
//! the agent last knew (`/run/lbnodeagent/peers`) and the configured seeds.
//! A config that cannot be read does not stop the removal: the addresses
//! are found through the default run directory.

use std::net::SocketAddr;
use std::path::Path;
use std::time::{Duration, Instant};

use hostlb_api::Family;
use tracing::{info, warn};

use super::config::{AgentConfig, DEFAULT_RUN_DIR};
use super::{AgentError, PEERS_FILE, source_address};
use crate::addrs::{AddressBackend, NetlinkBackend, NetlinkConfig, VipAddress};
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
    let mut out = Cleaned::default();
    let owned = backend.adopt().await?;
    for a in owned {
        let vip = VipAddress {
            interface: a.interface.clone(),
            ifindex: a.ifindex,
            ip: a.ip,
            prefix_len: a.prefix_len,
            lifetime: crate::addrs::Lifetime::FOREVER,
        };
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
    if let Some(cfg) = cfg {
        match tell_peers(cfg, &backend, &run_dir).await {
            Ok(n) => out.told = n,
            Err(e) => {
                warn!(error = %e, "cannot tell peers this node left; they notice by failure detection")
            }
        }
    }
    Ok(out)
}

async fn tell_peers(
    mut cfg: AgentConfig,
    backend: &NetlinkBackend,
    run_dir: &Path,
) -> Result<usize, AgentError> {
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
        return Ok(0);
    }
    cfg.gossip.seeds = seeds;
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
    let membership = Membership::start(&cfg.gossip, local, &transport).await?;
    let mut views = membership.views();
    let deadline = Instant::now() + REACH_PEERS;
    let mut told = 0;
    while Instant::now() < deadline {
        told = views
            .borrow()
            .nodes
            .iter()
            .filter(|n| n.node != cfg.node_name)
            .count();
        if told > 0 {
            break;
        }
        let _ = tokio::time::timeout_at(deadline.into(), views.changed()).await;
    }
    if told > 0 {
        // Push the state to every live peer, then let it spread a round.
        membership.set_leaving().await;
        tokio::time::sleep(cfg.gossip.interval * 2).await;
    }
    let _ = membership.shutdown().await;
    info!(peers = told, "told peers this node left");
    Ok(told)
}
