//! Typed gossip settings (`[gossip]` in the agent's TOML, SPEC §8) and the
//! shipped defaults, with the measurements behind them in `gossip/mod.rs`.

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};
use std::path::PathBuf;
use std::time::Duration;

use chitchat::FailureDetectorConfig;

use super::GossipError;
use super::keys::{GossipKeys, default_key_file};
use super::transport::AuthTransport;

/// Gossip round period, and the failure detector's probe period: a crash
/// is seen by every node in under a second up to a few hundred members and
/// about 1.2 s at 1,000 (measurements in `gossip/mod.rs` and
/// docs/agent-network.md).
pub const DEFAULT_INTERVAL: Duration = Duration::from_millis(100);
/// chitchat's own rounds come this many gossip intervals apart: at rest
/// nothing is news, and a round only carries heartbeats (which no agent of
/// this release reads; the failure detector says who is up) and repairs
/// what a lost message missed.
pub const REST_ROUNDS: u32 = 10;
/// chitchat's own failure detector, which judges only peers that run no
/// SWIM detector (agents of an earlier release, mid-upgrade): silence, in
/// mean heartbeat intervals, after which such a peer is dead, about 3.7
/// of chitchat's rounds (at rest, [`REST_ROUNDS`] intervals each), one
/// round more than the tightest setting that never
/// flapped under CPU load or 10% loss.
pub const DEFAULT_PHI_THRESHOLD: f64 = 8.0;
/// How long a dead node's state is kept: long enough to ride out a
/// partition, short enough that restarts do not pile stale generations
/// into every digest.
pub const DEFAULT_DEAD_NODE_GRACE: Duration = Duration::from_secs(10 * 60);
/// How long a deleted key's tombstone is kept; a peer that missed it for
/// longer is resent the whole (small) node state.
pub const DEFAULT_TOMBSTONE_GRACE: Duration = Duration::from_secs(10 * 60);
/// Rounds a leaving node keeps gossiping after publishing `leaving`, for
/// peers the direct push missed.
pub const DEFAULT_LEAVE_ROUNDS: u32 = 3;
/// How far a frame's timestamp may be from our clock: covers clock skew,
/// bounds how long a captured frame stays replayable.
pub const DEFAULT_REPLAY_WINDOW: Duration = Duration::from_secs(30);
/// Bytes per second a node's state gossip (chitchat) may take on the wire
/// (see `pace`). It binds from about 150 members, where chitchat's digests
/// of every member would otherwise grow its traffic with the cluster; past
/// that, published changes spread more slowly. Liveness does not depend on
/// it: the failure detector runs beside it at a few kB/s whatever the
/// cluster size (docs/agent-network.md).
pub const DEFAULT_MAX_BANDWIDTH: Option<u64> = Some(128_000);
/// Below this a budget cannot carry one round of a small cluster.
pub const MIN_MAX_BANDWIDTH: u64 = 8_000;
pub use crate::model::DEFAULT_PORT;
pub const DEFAULT_CLUSTER_ID: &str = "hostlb";

#[derive(Clone, Debug, PartialEq)]
pub struct GossipConfig {
    /// Separates clusters that share a network and, by mistake, a key.
    pub cluster_id: String,
    /// Must equal the Kubernetes Node name: the election ranks by it.
    pub node_name: String,
    pub agent_version: String,
    /// Default `[::]:7934`: one dual-stack socket receives both families,
    /// so IPv4, IPv6-only and dual-stack hosts need no setting.
    pub listen: SocketAddr,
    /// The address peers reach us on. Default: `listen` when it names one
    /// address; with a wildcard `listen` the agent fills it in from the
    /// announce interface (see `agent::default_advertise`).
    pub advertise: Option<SocketAddr>,
    /// `ip:port` or `host:port` (DNS is re-resolved every minute by
    /// chitchat). More can be handed over at run time with
    /// [`Membership::set_seeds`](super::Membership::set_seeds).
    pub seeds: Vec<String>,
    pub key_file: PathBuf,
    pub interval: Duration,
    pub phi_threshold: f64,
    pub dead_node_grace_period: Duration,
    pub marked_for_deletion_grace_period: Duration,
    pub leave_rounds: u32,
    pub replay_window: Duration,
    /// Byte budget per second on the wire; `None`: unlimited.
    pub max_bandwidth: Option<u64>,
    /// chitchat generation; `None` = the start time (ms, shifted left 20
    /// bits), so every start is a new generation that sorts after the
    /// previous one.
    pub generation: Option<u64>,
}

impl Default for GossipConfig {
    fn default() -> Self {
        GossipConfig {
            cluster_id: DEFAULT_CLUSTER_ID.to_string(),
            node_name: String::new(),
            agent_version: crate::VERSION.to_string(),
            listen: SocketAddr::from((Ipv6Addr::UNSPECIFIED, DEFAULT_PORT)),
            advertise: None,
            seeds: Vec::new(),
            key_file: default_key_file(),
            interval: DEFAULT_INTERVAL,
            phi_threshold: DEFAULT_PHI_THRESHOLD,
            dead_node_grace_period: DEFAULT_DEAD_NODE_GRACE,
            marked_for_deletion_grace_period: DEFAULT_TOMBSTONE_GRACE,
            leave_rounds: DEFAULT_LEAVE_ROUNDS,
            replay_window: DEFAULT_REPLAY_WINDOW,
            max_bandwidth: DEFAULT_MAX_BANDWIDTH,
            generation: None,
        }
    }
}

impl GossipConfig {
    /// A node on `listen` (also its advertise address) with the shipped
    /// timing and no seeds or key file.
    pub fn for_test(node_name: &str, listen: SocketAddr) -> GossipConfig {
        GossipConfig {
            cluster_id: "test".to_string(),
            node_name: node_name.to_string(),
            listen,
            advertise: Some(listen),
            key_file: PathBuf::from("/nonexistent/test.key"),
            ..GossipConfig::default()
        }
    }

    /// Whether the listen socket can send to and hear from `ip`: an IPv4
    /// socket only IPv4, an IPv6 wildcard both families, one IPv6 address
    /// only IPv6.
    pub fn reaches(&self, ip: IpAddr) -> bool {
        match self.listen.ip() {
            IpAddr::V4(_) => ip.to_canonical().is_ipv4(),
            IpAddr::V6(v6) if v6.is_unspecified() => true,
            IpAddr::V6(_) => ip.to_canonical().is_ipv6(),
        }
    }

    /// `listen` as this host can bind it: the shipped `[::]` becomes
    /// `0.0.0.0` where IPv6 is turned off (`ipv6.disable=1`: no IPv6
    /// socket can be opened at all), so such hosts need no setting either.
    pub fn usable_listen(&self) -> SocketAddr {
        match self.listen {
            SocketAddr::V6(l)
                if l.ip().is_unspecified()
                    && std::net::UdpSocket::bind((Ipv6Addr::UNSPECIFIED, 0)).is_err() =>
            {
                SocketAddr::from((Ipv4Addr::UNSPECIFIED, l.port()))
            }
            l => l,
        }
    }

    /// Errors name the config key, as for every other agent setting.
    pub fn validate(&self) -> Result<(), GossipError> {
        let bad = |key: &'static str, problem: String| Err(GossipError::Config { key, problem });
        if self.node_name.is_empty() {
            return bad("node_name", "must not be empty".into());
        }
        if self.cluster_id.is_empty() {
            return bad("gossip.cluster_id", "must not be empty".into());
        }
        if self.interval < Duration::from_millis(10) || self.interval > Duration::from_secs(10) {
            return bad(
                "gossip.interval",
                format!("{:?} is outside 10ms..10s", self.interval),
            );
        }
        if !(self.phi_threshold.is_finite() && self.phi_threshold >= 2.0) {
            return bad(
                "gossip.phi_threshold",
                format!("{} must be at least 2", self.phi_threshold),
            );
        }
        if self.dead_node_grace_period < self.interval * 10 {
            return bad(
                "gossip.dead_node_grace_period",
                "must be at least 10 gossip intervals".into(),
            );
        }
        if let Some(budget) = self.max_bandwidth
            && budget < MIN_MAX_BANDWIDTH
        {
            return bad(
                "gossip.max_bandwidth",
                format!(
                    "{budget} B/s is below {MIN_MAX_BANDWIDTH} B/s; raise it, or write \"unlimited\""
                ),
            );
        }
        if self.replay_window < Duration::from_secs(1) {
            return bad("gossip.replay_window", "must be at least 1s".into());
        }
        let advertise = self.advertise_addr()?;
        // Both keys are named: either one may be the mistake. Left so,
        // every agent would gossip alone.
        if !self.reaches(advertise.ip()) {
            return bad(
                "gossip.advertise",
                format!(
                    "{advertise} is {}, and gossip.listen {} cannot receive it; listen on \"[::]:{}\" (both families) or advertise an {} address",
                    family_name(advertise.ip()),
                    self.listen,
                    self.listen.port(),
                    family_name(self.listen.ip()),
                ),
            );
        }
        for seed in &self.seeds {
            if let Ok(addr) = seed.parse::<SocketAddr>()
                && !self.reaches(addr.ip())
            {
                return bad(
                    "gossip.seeds",
                    format!(
                        "{addr} is {}, and gossip.listen {} cannot reach it; listen on \"[::]:{}\" (both families) or name {} seeds",
                        family_name(addr.ip()),
                        self.listen,
                        self.listen.port(),
                        family_name(self.listen.ip()),
                    ),
                );
            }
        }
        Ok(())
    }

    pub fn advertise_addr(&self) -> Result<SocketAddr, GossipError> {
        match self.advertise {
            Some(addr) if addr.ip().is_unspecified() || addr.port() == 0 => {
                Err(GossipError::Config {
                    key: "gossip.advertise",
                    problem: format!("{addr} is not an address peers can reach"),
                })
            }
            Some(addr) => Ok(addr),
            None if self.listen.ip().is_unspecified() => Err(GossipError::Config {
                key: "gossip.advertise",
                problem: format!(
                    "listen is {}, so set advertise to the address peers reach this node on",
                    self.listen
                ),
            }),
            None => Ok(self.listen),
        }
    }

    /// The failure detector, from these settings. `initial_interval` is
    /// chitchat's round at rest, when heartbeats come: chitchat's 5 s
    /// default is the prior mean for the first samples and would make
    /// detection take ~40 s right after a peer joins. `max_interval`
    /// discards gaps longer than 10 of those rounds (a paused peer) so one
    /// long pause does not slow detection afterwards.
    pub fn failure_detector(&self) -> FailureDetectorConfig {
        let rest = self.interval * REST_ROUNDS;
        FailureDetectorConfig {
            phi_threshold: self.phi_threshold,
            sampling_window_size: 1_000,
            max_interval: rest * 10,
            initial_interval: rest,
            dead_node_grace_period: self.dead_node_grace_period,
        }
    }

    /// The authenticated UDP transport, keyed from `key_file`, accepting
    /// frames addressed to the advertise address (see `transport`).
    pub fn auth_transport(&self) -> Result<AuthTransport, GossipError> {
        let advertise = self.advertise_addr()?;
        let keys = GossipKeys::load(&self.key_file)?;
        Ok(AuthTransport::new(keys, self.replay_window).with_destinations([advertise]))
    }
}

fn family_name(ip: IpAddr) -> &'static str {
    if ip.to_canonical().is_ipv4() {
        "IPv4"
    } else {
        "IPv6"
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ok() -> GossipConfig {
        GossipConfig::for_test("n1", "127.0.0.1:7934".parse().unwrap())
    }

    #[test]
    fn for_test_is_valid() {
        ok().validate().unwrap();
    }

    #[test]
    fn errors_name_the_key() {
        let cases: Vec<(GossipConfig, &str)> = vec![
            (
                GossipConfig {
                    node_name: String::new(),
                    ..ok()
                },
                "node_name",
            ),
            (
                GossipConfig {
                    interval: Duration::from_millis(1),
                    ..ok()
                },
                "gossip.interval",
            ),
            (
                GossipConfig {
                    phi_threshold: f64::NAN,
                    ..ok()
                },
                "gossip.phi_threshold",
            ),
            (
                GossipConfig {
                    advertise: None,
                    listen: "0.0.0.0:7934".parse().unwrap(),
                    ..ok()
                },
                "gossip.advertise",
            ),
            (
                GossipConfig {
                    advertise: Some("0.0.0.0:7934".parse().unwrap()),
                    ..ok()
                },
                "gossip.advertise",
            ),
        ];
        for (config, key) in cases {
            let err = config.validate().unwrap_err();
            assert!(
                matches!(&err, GossipError::Config { key: k, .. } if *k == key),
                "{key}: {err}"
            );
            assert!(err.to_string().contains(key), "{err}");
        }
    }

    /// Combinations in which no peer could ever be heard are refused, with
    /// both keys named; the dual-stack wildcard takes either family.
    #[test]
    fn an_advertise_address_or_seed_the_listen_socket_cannot_serve_is_refused() {
        let with = |listen: &str, advertise: &str, seeds: &[&str]| GossipConfig {
            listen: listen.parse().unwrap(),
            advertise: Some(advertise.parse().unwrap()),
            seeds: seeds.iter().map(|s| s.to_string()).collect(),
            ..ok()
        };
        let err = with("0.0.0.0:7934", "[fd00::1]:7934", &[])
            .validate()
            .unwrap_err()
            .to_string();
        assert!(
            err.contains("gossip.advertise")
                && err.contains("is IPv6")
                && err.contains("gossip.listen 0.0.0.0:7934")
                && err.contains("[::]:7934"),
            "{err}"
        );
        let err = with("[fd00::1]:7934", "10.0.0.1:7934", &[])
            .validate()
            .unwrap_err()
            .to_string();
        assert!(
            err.contains("gossip.advertise") && err.contains("is IPv4"),
            "{err}"
        );
        let err = with(
            "0.0.0.0:7934",
            "10.0.0.1:7934",
            &["10.0.0.2:7934", "[fd00::2]:7934"],
        )
        .validate()
        .unwrap_err()
        .to_string();
        assert!(
            err.contains("gossip.seeds") && err.contains("[fd00::2]:7934"),
            "{err}"
        );
        with(
            "[::]:7934",
            "10.0.0.1:7934",
            &["[fd00::2]:7934", "10.0.0.2:7934"],
        )
        .validate()
        .unwrap();
        with(
            "[::]:7934",
            "[fd00::1]:7934",
            &["10.0.0.2:7934", "seed.example:7934"],
        )
        .validate()
        .unwrap();
        assert_eq!(
            GossipConfig::default().listen,
            "[::]:7934".parse().unwrap(),
            "both families by default"
        );
    }

    #[test]
    fn advertise_defaults_to_a_specific_listen_address() {
        let config = GossipConfig {
            advertise: None,
            ..ok()
        };
        assert_eq!(config.advertise_addr().unwrap(), config.listen);
    }

    #[test]
    fn detector_starts_from_the_round_at_rest() {
        let fd = ok().failure_detector();
        assert_eq!(fd.initial_interval, DEFAULT_INTERVAL * REST_ROUNDS);
        assert_eq!(fd.phi_threshold, DEFAULT_PHI_THRESHOLD);
    }
}
