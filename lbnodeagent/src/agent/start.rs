//! Start-up: reading the configuration and the host, the kube client, the
//! core's settings, joining gossip as `starting`, and `keygen`.

use std::net::{IpAddr, SocketAddr};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Instant;

use hostlb_api::Family;
use tracing::{error, info};

use super::config::AgentConfig;
use super::core::links::Links;
use super::core::{Core, Settings};
use super::kernel::{kernel_worker, note_announce_interface, read_links};
use super::telemetry::Telemetry;
use super::watches::KubeInputs;
use super::wire::open_wire;
use super::{Agent, AgentError, Gossip};
use super::{beats, record, report, telemetry};
use crate::addrs::{AddressBackend, Interface, NetlinkBackend, NetlinkConfig};
use crate::announce::Announcer;
use crate::gossip::Membership;
use crate::inputs::Scope;

impl<B: AddressBackend + 'static> Agent<B> {
    /// Reads the host, joins gossip (as `starting`) and starts the watches;
    /// nothing is added or removed before [`run`](Self::run) has a complete
    /// cluster view and membership has settled.
    pub async fn start(
        mut cfg: AgentConfig,
        config_path: PathBuf,
        backend: Arc<B>,
        announcer: Option<Arc<Announcer>>,
    ) -> Result<Agent<B>, AgentError> {
        info!(node = %cfg.node_name, version = crate::VERSION, "starting");
        let telemetry = Telemetry::new();
        let links = read_links(&*backend, &cfg, true).await;
        note_announce_interface(&telemetry, &cfg, &links);

        cfg.gossip.listen = cfg.gossip.usable_listen();
        if cfg.gossip.advertise.is_none() && cfg.gossip.listen.ip().is_unspecified() {
            cfg.gossip.advertise = Some(default_advertise(cfg.gossip.listen, &links)?);
        }
        let wire = open_wire(announcer);
        let core_settings = settings(&cfg, wire.announcer.is_some() && wire.claims.is_some());
        if let Some(why) = &core_settings.unable {
            error!("{why}");
            telemetry.cannot_serve.set(1);
        }
        let core = Core::new(core_settings, links, Instant::now());
        let transport = cfg.gossip.auth_transport()?;
        telemetry.set_gossip_counters(transport.counters());
        let membership =
            Membership::start(&cfg.gossip, core.local_state(), &transport, &transport).await?;
        telemetry.set_gossip_held(membership.gossip_held_counter());
        telemetry.set_detector_counters(membership.detector_counters());
        let views = membership.views();
        let (beats, beats_in) = match membership.take_beats() {
            Some(link) => (
                Some(beats::Beats::start(
                    cfg.node_name.clone(),
                    link.generation,
                    link.send,
                )),
                Some(link.recv),
            ),
            None => (None, None),
        };

        let (client, server) = kube_client(&cfg).await?;
        let scope = Scope {
            namespace: cfg.namespace.clone(),
            load_balancer_class: cfg.load_balancer_class.clone(),
        };
        let kube = KubeInputs::start(&client, &scope, &server);
        let mut records = record::Records::new(&client);
        records.ask();
        let publisher = record::Publisher::start(&client, &cfg.node_name);
        let report = report::start(
            client,
            &cfg.node_name,
            kube.services.clone(),
            telemetry.clone(),
        );

        hostlb_api::runtime::admin::serve(cfg.http_listen, telemetry::router(telemetry.clone()))
            .await
            .map_err(|source| AgentError::Http {
                addr: cfg.http_listen,
                source,
            })?;
        let kernel = kernel_worker(backend.clone());
        let config_hash = config_hash(&cfg);
        Ok(Agent {
            core,
            cfg,
            config_path,
            backend,
            wire,
            gossip: Gossip {
                membership,
                beats,
                beats_in,
                transport,
                views,
                seeds_given: Vec::new(),
                peers_written: Vec::new(),
            },
            kube,
            report,
            records,
            publisher,
            config_hash,
            conflict_seen: None,
            telemetry,
            kernel,
            ensure_virtual: false,
            cluster_sent: false,
        })
    }
}

/// What `lbnodeagent check` can tell without the network, beyond the file
/// itself: that the kubeconfig reads and resolves to a cluster and
/// credentials (certificates and token files loaded), and that the gossip
/// key file loads with a safe mode. Both would stop `run` at start; the
/// unit's `ExecStartPre=` check then fails with the reason instead.
pub async fn check_offline(cfg: &AgentConfig) -> Result<(), AgentError> {
    kube_client(cfg).await?;
    crate::gossip::GossipKeys::load(&cfg.gossip.key_file)?;
    Ok(())
}

/// The client, and the API server's URL (for log lines). Its User-Agent
/// names this node.
pub(super) async fn kube_client(cfg: &AgentConfig) -> Result<(kube::Client, String), AgentError> {
    hostlb_api::runtime::client::client(Some(&cfg.kubeconfig), "lbnodeagent", &cfg.node_name)
        .await
        .map_err(|e| match e {
            hostlb_api::runtime::client::ClientError::Kubeconfig { path, message } => {
                AgentError::Kubeconfig { path, message }
            }
            other => AgentError::Kubeconfig {
                path: cfg.kubeconfig.clone(),
                message: other.to_string(),
            },
        })
}

/// 12 hex digits of SHA-256: enough to tell two values apart at a glance.
pub(super) fn short_hash(bytes: &[u8]) -> String {
    use sha2::Digest;
    let digest = sha2::Sha256::digest(bytes);
    digest[..6].iter().map(|b| format!("{b:02x}")).collect()
}

/// The configuration in force, hashed without what names the node (its
/// name and its own addresses), so agents configured alike agree.
pub(super) fn config_hash(cfg: &AgentConfig) -> String {
    let mut c = cfg.clone();
    c.node_name.clear();
    c.gossip.node_name.clear();
    c.gossip.advertise = None;
    short_hash(format!("{c:?}").as_bytes())
}

/// The address the kernel would use to reach `prefix`: the interface's own
/// address there. A UDP connect sends nothing.
pub(super) fn source_address(prefix: &hostlb_api::Prefix) -> Option<IpAddr> {
    let (first, last) = prefix.range().bounds();
    let target = hostlb_api::address::from_u128(prefix.family(), first.saturating_add(1).min(last));
    let bind: SocketAddr = match target {
        IpAddr::V4(_) => "0.0.0.0:0".parse().ok()?,
        IpAddr::V6(_) => "[::]:0".parse().ok()?,
    };
    let s = std::net::UdpSocket::bind(bind).ok()?;
    s.connect(SocketAddr::new(target, 9)).ok()?;
    Some(s.local_addr().ok()?.ip())
}

/// The core's settings from the configuration.
pub(super) fn settings(cfg: &AgentConfig, wire: bool) -> Settings {
    Settings {
        node: cfg.node_name.clone(),
        lifetime: cfg.announce.lifetime,
        garp: cfg.announce.garp,
        gossip_interval: cfg.gossip.interval,
        wire,
        unable: unable(),
    }
}

/// Why this process cannot add addresses, if it cannot: CAP_NET_ADMIN
/// (bit 12) missing from its effective capabilities. Such an agent still
/// gossips and reports, but stands in no election.
pub(super) fn unable() -> Option<String> {
    let status = std::fs::read_to_string("/proc/self/status").ok()?;
    let caps = status
        .lines()
        .find_map(|l| l.strip_prefix("CapEff:"))
        .and_then(|v| u64::from_str_radix(v.trim(), 16).ok())?;
    (caps & (1 << 12) == 0).then(|| {
        "no CAP_NET_ADMIN: this agent cannot add addresses, so it is no candidate (run it as the packaged unit does, with AmbientCapabilities=CAP_NET_ADMIN CAP_NET_RAW)".to_string()
    })
}

/// A new gossip key: 32 random bytes from the kernel, as hex.
pub fn keygen() -> std::io::Result<String> {
    use std::io::Read;
    let mut key = [0u8; 32];
    std::fs::File::open("/dev/urandom")?.read_exact(&mut key)?;
    Ok(hex::encode(key))
}

/// Starts the agent on a real host and runs it until SIGTERM/SIGINT.
pub async fn run(config_path: &Path) -> Result<(), AgentError> {
    let cfg = AgentConfig::load(config_path)?;
    let backend = NetlinkBackend::new(NetlinkConfig {
        run_dir: cfg.run_dir.clone(),
        ..NetlinkConfig::default()
    })
    .await?;
    let announcer = match Announcer::new() {
        Ok(a) => Some(Arc::new(a)),
        Err(e) => {
            error!(error = %e, "cannot send gratuitous ARP/NA; VIPs will move as client caches expire");
            None
        }
    };
    Agent::start(cfg, config_path.to_path_buf(), Arc::new(backend), announcer)
        .await?
        .run()
        .await
}

/// The address peers reach this node on when `gossip.advertise` is not
/// set and `listen` is a wildcard: its own address on the announce
/// interface, IPv4 when the host has one and the socket can take it,
/// otherwise IPv6. Every node picks the same way, so a fleet with IPv4
/// gossips over IPv4 and an IPv6-only fleet over IPv6; only a fleet mixing
/// IPv6-only hosts with others has to set it. A node with no announce
/// interface (no default route, a typo in `announce.interface`) still
/// gossips, and so tells its peers why it is no candidate: from its first
/// other link with carrier and an on-link prefix.
pub fn default_advertise(listen: SocketAddr, links: &Links) -> Result<SocketAddr, AgentError> {
    let families: &[Family] = if listen.is_ipv4() {
        &[Family::V4]
    } else {
        &[Family::V4, Family::V6]
    };
    let virtual_index = links.virtual_link.as_ref().map(|v| v.index);
    let own = |family: Family| {
        let announce = match family {
            Family::V4 => links.announce_v4,
            Family::V6 => links.announce_v6,
        };
        let first = |i: &Interface| i.prefixes_of(family).next().and_then(source_address);
        announce
            .and_then(|i| links.by_index(i))
            .and_then(first)
            .or_else(|| {
                links
                    .all
                    .iter()
                    .filter(|i| i.carrier && i.mac.is_some() && Some(i.index) != virtual_index)
                    .find_map(first)
            })
    };
    families
        .iter()
        .find_map(|f| own(*f))
        .map(|ip| SocketAddr::new(ip, listen.port()))
        .ok_or(AgentError::NoAdvertise)
}
