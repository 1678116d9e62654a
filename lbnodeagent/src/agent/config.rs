//! `/etc/lbnodeagent/lbnodeagent.toml` (SPEC §8): every key has a default,
//! so a file with only `kubeconfig` works; an unknown key or a bad value is
//! an error naming the key and the line, as `lbnodeagent check` prints it.
//!
//! The file is parsed at the edge into typed values ([`AgentConfig`]); the
//! rest of the agent never sees text. A reload (SIGHUP) parses the new file
//! completely before anything is applied, so a bad file changes nothing.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::time::Duration;

use serde::Deserialize;

use crate::addrs::{DEFAULT_ADDRESS_LIFETIME, DEFAULT_VIRTUAL_INTERFACE, Lifetime};
use crate::announce::AnnounceConfig;
#[cfg(test)]
use crate::gossip::DEFAULT_MAX_BANDWIDTH;
use crate::gossip::{DEFAULT_CLUSTER_ID, DEFAULT_INTERVAL, DEFAULT_PORT, GossipConfig};

pub const DEFAULT_CONFIG_PATH: &str = "/etc/lbnodeagent/lbnodeagent.toml";
pub const DEFAULT_KUBECONFIG: &str = "/etc/lbnodeagent/kubeconfig";
pub const DEFAULT_RUN_DIR: &str = "/run/lbnodeagent";
pub const DEFAULT_HTTP_LISTEN: &str = "127.0.0.1:7472";

#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    #[error("cannot read {}: {source}", path.display())]
    Read {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    /// The TOML parser's message already names the key, line and column.
    #[error("{}: {message}", path.display())]
    Parse { path: PathBuf, message: String },
    #[error("{}: line {line}: {key}: {problem}", path.display())]
    Invalid {
        path: PathBuf,
        key: String,
        line: usize,
        problem: String,
    },
}

/// The agent's settings, typed and checked.
#[derive(Clone, Debug, PartialEq)]
pub struct AgentConfig {
    pub node_name: String,
    pub kubeconfig: PathBuf,
    /// Holds the address record and the last known peers (for `cleanup`).
    pub run_dir: PathBuf,
    /// Namespace of IPAddressPools and L2Advertisements.
    pub namespace: String,
    pub load_balancer_class: String,
    pub gossip: GossipConfig,
    pub announce: AnnounceSettings,
    pub http_listen: SocketAddr,
    /// `firewall.enabled`: traffic to a VIP reaches this host only on its
    /// Services' ports (and ICMP); on by default.
    pub firewall: bool,
    /// `[upstream]`: whether this node checks that it reaches its default
    /// gateways (see `announce::gateway`).
    pub upstream: UpstreamSettings,
}

#[derive(Clone, Debug, PartialEq)]
pub struct UpstreamSettings {
    /// `upstream.enabled`; on by default.
    pub enabled: bool,
    /// `upstream.lost_after`: how long a gateway that answered may stay
    /// silent before it counts as lost.
    pub lost_after: Duration,
}

/// [`UpstreamSettings::lost_after`] unless set: three unanswered rounds.
pub const DEFAULT_UPSTREAM_LOST_AFTER: Duration = Duration::from_secs(3);

#[derive(Clone, Debug, PartialEq)]
pub struct AnnounceSettings {
    /// `None`: the default-route interface of each family.
    pub interface: Option<String>,
    /// `None`: virtual mode off.
    pub virtual_interface: Option<String>,
    pub lifetime: Lifetime,
    pub garp: AnnounceConfig,
}

impl AgentConfig {
    /// Settings for tests: a node on `listen` with the shipped timing.
    pub fn for_test(node_name: &str, listen: SocketAddr, run_dir: &Path) -> AgentConfig {
        let file = FileConfig::default();
        let mut c = file
            .resolve(Path::new("test.toml"), "", || node_name.to_string())
            .expect("defaults are valid");
        c.gossip.listen = listen;
        c.gossip.advertise = Some(listen);
        c.run_dir = run_dir.to_path_buf();
        c
    }

    /// Reads and checks a file; `hostname` gives the default node name.
    pub fn load(path: &Path) -> Result<AgentConfig, ConfigError> {
        let text = std::fs::read_to_string(path).map_err(|source| ConfigError::Read {
            path: path.to_path_buf(),
            source,
        })?;
        AgentConfig::parse(&text, path, hostname)
    }

    pub fn parse(
        text: &str,
        path: &Path,
        hostname: impl FnOnce() -> String,
    ) -> Result<AgentConfig, ConfigError> {
        let file: FileConfig = toml::from_str(text).map_err(|e| ConfigError::Parse {
            path: path.to_path_buf(),
            message: e.to_string().trim_end().to_string(),
        })?;
        file.resolve(path, text, hostname)
    }

    /// Settings that a reload cannot change in a running agent: they name
    /// who this node is or where it listens.
    pub fn restart_only_changes(&self, new: &AgentConfig) -> Vec<&'static str> {
        let mut out = Vec::new();
        let mut check = |changed: bool, key: &'static str| {
            if changed {
                out.push(key);
            }
        };
        check(self.node_name != new.node_name, "node_name");
        check(self.kubeconfig != new.kubeconfig, "kubeconfig");
        check(self.run_dir != new.run_dir, "run_dir");
        check(self.namespace != new.namespace, "namespace");
        check(
            self.load_balancer_class != new.load_balancer_class,
            "load_balancer_class",
        );
        check(self.gossip.listen != new.gossip.listen, "gossip.listen");
        check(
            self.gossip.advertise != new.gossip.advertise,
            "gossip.advertise",
        );
        check(
            self.gossip.interval != new.gossip.interval,
            "gossip.interval",
        );
        check(
            self.gossip.max_bandwidth != new.gossip.max_bandwidth,
            "gossip.max_bandwidth",
        );
        check(
            self.gossip.cluster_id != new.gossip.cluster_id,
            "gossip.cluster_id",
        );
        check(self.http_listen != new.http_listen, "http.listen");
        out
    }
}

fn hostname() -> String {
    std::fs::read_to_string("/proc/sys/kernel/hostname")
        .map(|s| s.trim().to_string())
        .unwrap_or_default()
}

/// The file as written: every field optional.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct FileConfig {
    node_name: Option<String>,
    kubeconfig: Option<PathBuf>,
    run_dir: Option<PathBuf>,
    namespace: Option<String>,
    load_balancer_class: Option<String>,
    #[serde(default)]
    gossip: GossipSection,
    #[serde(default)]
    announce: AnnounceSection,
    #[serde(default)]
    http: HttpSection,
    #[serde(default)]
    firewall: FirewallSection,
    #[serde(default)]
    upstream: UpstreamSection,
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct UpstreamSection {
    enabled: Option<bool>,
    lost_after: Option<String>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct FirewallSection {
    enabled: Option<bool>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct GossipSection {
    listen: Option<String>,
    advertise: Option<String>,
    seeds: Option<Vec<String>>,
    key_file: Option<PathBuf>,
    interval: Option<String>,
    cluster_id: Option<String>,
    phi_threshold: Option<f64>,
    max_bandwidth: Option<String>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct AnnounceSection {
    interface: Option<String>,
    virtual_interface: Option<String>,
    address_lifetime: Option<String>,
    garp_count: Option<i64>,
    garp_interval: Option<String>,
    refresh_interval: Option<String>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct HttpSection {
    listen: Option<String>,
}

impl FileConfig {
    fn resolve(
        self,
        path: &Path,
        text: &str,
        hostname: impl FnOnce() -> String,
    ) -> Result<AgentConfig, ConfigError> {
        let bad = |key: &str, problem: String| ConfigError::Invalid {
            path: path.to_path_buf(),
            key: key.to_string(),
            line: line_of(text, key),
            problem,
        };
        let node_name = self.node_name.unwrap_or_else(hostname);
        if node_name.is_empty() {
            return Err(bad(
                "node_name",
                "is empty and the hostname could not be read; set it to this host's Kubernetes Node name".into(),
            ));
        }
        let duration = |key: &str, value: Option<String>, default: Duration| match value {
            None => Ok(default),
            Some(v) => parse_duration(&v).map_err(|p| bad(key, p)),
        };
        let socket = |key: &str, value: &str| {
            value.parse::<SocketAddr>().map_err(|_| {
                bad(
                    key,
                    format!("{value:?} is not an address and port like 192.0.2.1:7934"),
                )
            })
        };

        let mut gossip = GossipConfig {
            node_name: node_name.clone(),
            ..GossipConfig::default()
        };
        let g = self.gossip;
        if let Some(l) = &g.listen {
            gossip.listen = socket("gossip.listen", l)?;
        }
        if let Some(a) = &g.advertise {
            let addr = match a.parse::<std::net::IpAddr>() {
                Ok(ip) => SocketAddr::new(ip, gossip.listen.port()),
                Err(_) => socket("gossip.advertise", a)?,
            };
            gossip.advertise = Some(addr);
        }
        if let Some(seeds) = g.seeds {
            gossip.seeds = seeds
                .into_iter()
                .map(|s| {
                    if s.parse::<std::net::IpAddr>().is_ok() {
                        SocketAddr::new(s.parse().expect("checked"), DEFAULT_PORT).to_string()
                    } else {
                        s
                    }
                })
                .collect();
        }
        if let Some(k) = g.key_file {
            gossip.key_file = k;
        }
        gossip.interval = duration("gossip.interval", g.interval, DEFAULT_INTERVAL)?;
        gossip.cluster_id = g.cluster_id.unwrap_or_else(|| DEFAULT_CLUSTER_ID.into());
        if let Some(phi) = g.phi_threshold {
            gossip.phi_threshold = phi;
        }
        if let Some(b) = &g.max_bandwidth {
            gossip.max_bandwidth =
                parse_bandwidth(b).map_err(|p| bad("gossip.max_bandwidth", p))?;
        }
        // Checked without the advertise address, which may be filled in from
        // the announce interface at start.
        let mut probe = gossip.clone();
        if gossip.listen.ip().is_unspecified() {
            probe
                .advertise
                .get_or_insert(SocketAddr::from(([192, 0, 2, 1], gossip.listen.port())));
        }
        if let Err(crate::gossip::GossipError::Config { key, problem }) = probe.validate() {
            return Err(bad(key, problem));
        }

        let a = self.announce;
        let lifetime = duration(
            "announce.address_lifetime",
            a.address_lifetime,
            DEFAULT_ADDRESS_LIFETIME,
        )?;
        if !lifetime.is_zero() && lifetime < Duration::from_secs(3) {
            return Err(bad(
                "announce.address_lifetime",
                "must be at least 3s (renewed at a third of it), or 0s for forever".into(),
            ));
        }
        let defaults = AnnounceConfig::default();
        let count = match a.garp_count {
            None => defaults.count,
            Some(n) if (0..=100).contains(&n) => n as u32,
            Some(n) => {
                return Err(bad(
                    "announce.garp_count",
                    format!("{n} is outside 0..=100"),
                ));
            }
        };
        let interval = duration("announce.garp_interval", a.garp_interval, defaults.interval)?;
        if interval > Duration::from_secs(60) {
            return Err(bad(
                "announce.garp_interval",
                "must be at most 60s".to_string(),
            ));
        }
        let refresh = duration(
            "announce.refresh_interval",
            a.refresh_interval,
            Duration::ZERO,
        )?;
        if !refresh.is_zero() && refresh < Duration::from_secs(1) {
            return Err(bad(
                "announce.refresh_interval",
                "must be at least 1s (one round for every held VIP each time), or 0s for off"
                    .to_string(),
            ));
        }
        let refresh = (!refresh.is_zero()).then_some(refresh);
        let interface = a.interface.filter(|i| !i.is_empty());
        let virtual_interface = match a.virtual_interface {
            None => Some(DEFAULT_VIRTUAL_INTERFACE.to_string()),
            Some(v) if v.is_empty() => None,
            Some(v) => Some(v),
        };
        for (key, name) in [
            ("announce.interface", &interface),
            ("announce.virtual_interface", &virtual_interface),
        ] {
            if let Some(n) = name
                && (n.len() > 15 || n.contains(['/', ' ']) || n == "." || n == "..")
            {
                return Err(bad(key, format!("{n:?} is not a Linux interface name")));
            }
        }

        let lost_after = duration(
            "upstream.lost_after",
            self.upstream.lost_after,
            DEFAULT_UPSTREAM_LOST_AFTER,
        )?;
        if !(Duration::from_secs(2)..=Duration::from_secs(60)).contains(&lost_after) {
            return Err(bad(
                "upstream.lost_after",
                "must be between 2s and 60s (the gateway is asked every second)".into(),
            ));
        }
        let upstream = UpstreamSettings {
            enabled: self.upstream.enabled.unwrap_or(true),
            lost_after,
        };

        let http_listen = socket(
            "http.listen",
            self.http.listen.as_deref().unwrap_or(DEFAULT_HTTP_LISTEN),
        )?;
        Ok(AgentConfig {
            node_name,
            kubeconfig: self
                .kubeconfig
                .unwrap_or_else(|| PathBuf::from(DEFAULT_KUBECONFIG)),
            run_dir: self
                .run_dir
                .unwrap_or_else(|| PathBuf::from(DEFAULT_RUN_DIR)),
            namespace: self
                .namespace
                .unwrap_or_else(|| hostlb_api::annotations::SYSTEM_NAMESPACE.into()),
            load_balancer_class: self
                .load_balancer_class
                .unwrap_or_else(|| hostlb_api::annotations::DEFAULT_LOAD_BALANCER_CLASS.into()),
            gossip,
            announce: AnnounceSettings {
                interface,
                virtual_interface,
                lifetime: Lifetime::new(lifetime),
                garp: AnnounceConfig {
                    count,
                    interval,
                    refresh,
                },
            },
            http_listen,
            firewall: self.firewall.enabled.unwrap_or(true),
            upstream,
        })
    }
}

/// The 1-based line where `key` (`section.name` or `name`) is set, for
/// errors found after parsing; 0 when it cannot be told (a default).
fn line_of(text: &str, key: &str) -> usize {
    let (section, name) = match key.split_once('.') {
        Some((s, n)) => (Some(s), n),
        None => (None, key),
    };
    let mut current: Option<String> = None;
    for (i, line) in text.lines().enumerate() {
        let t = line.trim();
        if let Some(s) = t.strip_prefix('[').and_then(|s| s.strip_suffix(']')) {
            current = Some(s.trim().to_string());
            continue;
        }
        let Some((k, _)) = t.split_once('=') else {
            continue;
        };
        if k.trim() == name && current.as_deref() == section {
            return i + 1;
        }
    }
    0
}

/// `"128kB/s"`, `"1MB/s"`, `"1Mbit/s"`, `"500000B/s"` (decimal units, as
/// link speeds are written) or `"unlimited"`.
pub fn parse_bandwidth(text: &str) -> Result<Option<u64>, String> {
    let t = text.trim();
    if t == "unlimited" {
        return Ok(None);
    }
    let split = t
        .find(|c: char| !(c.is_ascii_digit() || c == '.'))
        .unwrap_or(t.len());
    let (number, unit) = t.split_at(split);
    let example = "write it like \"128kB/s\", \"1Mbit/s\" or \"unlimited\"";
    let value: f64 = number
        .parse()
        .map_err(|_| format!("{text:?} is not a rate; {example}"))?;
    let bytes = match unit.trim() {
        "B/s" => 1.0,
        "kB/s" => 1e3,
        "MB/s" => 1e6,
        "kbit/s" => 1e3 / 8.0,
        "Mbit/s" => 1e6 / 8.0,
        "Gbit/s" => 1e9 / 8.0,
        _ => return Err(format!("{text:?} has no known unit; {example}")),
    };
    let rate = value * bytes;
    if !rate.is_finite() || rate > 1e12 {
        return Err(format!("{text:?} is too large; {example}"));
    }
    Ok(Some(rate as u64))
}

/// `"200ms"`, `"15s"`, `"2m"`, `"1h"`, `"0s"`; a bare `0` too.
pub fn parse_duration(text: &str) -> Result<Duration, String> {
    let t = text.trim();
    if t == "0" {
        return Ok(Duration::ZERO);
    }
    let split = t
        .find(|c: char| !(c.is_ascii_digit() || c == '.'))
        .unwrap_or(t.len());
    let (number, unit) = t.split_at(split);
    // "100 ms" as well as "100ms".
    let unit = unit.trim_start();
    let value: f64 = number
        .parse()
        .map_err(|_| format!("{text:?} is not a duration like \"200ms\", \"15s\" or \"1m\""))?;
    let scale = match unit {
        "ms" => 0.001,
        "s" => 1.0,
        "m" => 60.0,
        "h" => 3600.0,
        "" => {
            return Err(format!(
                "{text:?} has no unit: write it like \"200ms\", \"15s\" or \"1m\""
            ));
        }
        other => {
            return Err(format!(
                "{text:?}: unknown unit {other:?}; use ms, s, m or h, like \"200ms\" or \"1m\""
            ));
        }
    };
    let secs = value * scale;
    if !secs.is_finite() || secs > 86_400.0 * 365.0 {
        return Err(format!("{text:?} is too long"));
    }
    Ok(Duration::from_secs_f64(secs))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(text: &str) -> Result<AgentConfig, ConfigError> {
        AgentConfig::parse(text, Path::new("/etc/lbnodeagent/lbnodeagent.toml"), || {
            "host-1".to_string()
        })
    }

    #[test]
    fn a_file_with_only_kubeconfig_takes_every_default() {
        let c = parse("kubeconfig = \"/etc/k\"\n").unwrap();
        assert_eq!(c.node_name, "host-1");
        assert_eq!(c.kubeconfig, PathBuf::from("/etc/k"));
        assert_eq!(c.gossip.listen, "[::]:7934".parse().unwrap());
        assert_eq!(c.gossip.interval, DEFAULT_INTERVAL);
        assert_eq!(c.gossip.advertise, None);
        assert_eq!(c.announce.interface, None);
        assert_eq!(c.announce.virtual_interface.as_deref(), Some("kube-lb0"));
        assert_eq!(c.announce.lifetime, Lifetime::new(Duration::from_secs(15)));
        assert_eq!(c.announce.garp, AnnounceConfig::default());
        assert_eq!(c.http_listen, "127.0.0.1:7472".parse().unwrap());
        assert!(c.firewall, "on unless turned off");
        assert!(c.upstream.enabled, "on unless turned off");
        assert_eq!(c.upstream.lost_after, Duration::from_secs(3));
        assert_eq!(c.run_dir, PathBuf::from("/run/lbnodeagent"));
    }

    #[test]
    fn the_documented_example_parses() {
        let c = parse(
            r#"
node_name = "node1"
kubeconfig = "/etc/lbnodeagent/kubeconfig"
[gossip]
listen = "0.0.0.0:7934"
advertise = "192.168.10.151:7934"
seeds = ["192.168.10.152:7934", "192.168.10.153"]
key_file = "/etc/lbnodeagent/gossip.key"
interval = "200ms"
[announce]
interface = ""
virtual_interface = ""
address_lifetime = "0s"
garp_count = 5
garp_interval = "250ms"
refresh_interval = "30s"
[http]
listen = "127.0.0.1:9000"
[firewall]
enabled = false
[upstream]
enabled = false
lost_after = "5s"
"#,
        )
        .unwrap();
        assert_eq!(c.node_name, "node1");
        assert_eq!(
            c.gossip.advertise,
            Some("192.168.10.151:7934".parse().unwrap())
        );
        assert_eq!(
            c.gossip.seeds,
            vec!["192.168.10.152:7934", "192.168.10.153:7934"]
        );
        assert_eq!(c.gossip.interval, Duration::from_millis(200));
        assert_eq!(c.announce.virtual_interface, None);
        assert_eq!(c.announce.lifetime, Lifetime::FOREVER);
        assert_eq!(c.announce.garp.count, 5);
        assert_eq!(c.announce.garp.interval, Duration::from_millis(250));
        assert_eq!(c.announce.garp.refresh, Some(Duration::from_secs(30)));
        assert!(!c.firewall);
        assert!(!c.upstream.enabled);
        assert_eq!(c.upstream.lost_after, Duration::from_secs(5));
        assert_eq!(c.http_listen.port(), 9000);
    }

    #[test]
    fn errors_name_the_key_and_the_line() {
        let err = |text: &str| parse(text).unwrap_err().to_string();
        let e = err("kubeconfig = \"/k\"\n[gossip]\nlisen = \"0.0.0.0:1\"\n");
        assert!(e.contains("lisen") && e.contains("line 3"), "{e}");
        let e = err("[upstream]\nlost_after = \"1s\"\n");
        assert!(e.contains("line 2: upstream.lost_after"), "{e}");
        let e = err("[announce]\ngarp_count = 500\n");
        assert!(
            e.contains("line 2: announce.garp_count: 500 is outside 0..=100"),
            "{e}"
        );
        let e = err("[gossip]\ninterval = \"fast\"\n");
        assert!(e.contains("line 2: gossip.interval"), "{e}");
        let e = err("\n\n[announce]\naddress_lifetime = \"1s\"\n");
        assert!(e.contains("line 4: announce.address_lifetime"), "{e}");
        let e = err("[announce]\nrefresh_interval = \"100ms\"\n");
        assert!(
            e.contains("line 2: announce.refresh_interval: must be at least 1s"),
            "{e}"
        );
        let e = err("[http]\nlisten = \"localhost\"\n");
        assert!(e.contains("line 2: http.listen"), "{e}");
        let e = err("[gossip]\ninterval = \"5ms\"\n");
        assert!(
            e.contains("gossip.interval") && e.contains("10ms..10s"),
            "{e}"
        );
        let e = err("kubeconfig = 3\n");
        assert!(e.contains("kubeconfig") && e.contains("line 1"), "{e}");
        let e = err("[announce]\ninterface = \"a/b\"\n");
        assert!(e.contains("announce.interface"), "{e}");
    }

    #[test]
    fn durations() {
        assert_eq!(parse_duration("200ms"), Ok(Duration::from_millis(200)));
        assert_eq!(parse_duration("1.5s"), Ok(Duration::from_millis(1500)));
        assert_eq!(parse_duration("2m"), Ok(Duration::from_secs(120)));
        assert_eq!(parse_duration("0"), Ok(Duration::ZERO));
        assert_eq!(parse_duration("100 ms"), Ok(Duration::from_millis(100)));
        assert!(
            parse_duration("100 sec")
                .unwrap_err()
                .contains("unknown unit \"sec\"")
        );
        assert!(parse_duration("15").unwrap_err().contains("no unit"));
        assert!(parse_duration("-1s").is_err());
        assert!(parse_duration("").is_err());
    }

    #[test]
    fn bandwidths() {
        assert_eq!(parse_bandwidth("128kB/s"), Ok(Some(128_000)));
        assert_eq!(parse_bandwidth("1Mbit/s"), Ok(Some(125_000)));
        assert_eq!(parse_bandwidth("1.5MB/s"), Ok(Some(1_500_000)));
        assert_eq!(parse_bandwidth(" 9000 B/s "), Ok(Some(9_000)));
        assert_eq!(parse_bandwidth("unlimited"), Ok(None));
        assert!(parse_bandwidth("128").unwrap_err().contains("unit"));
        assert!(parse_bandwidth("128KB").unwrap_err().contains("unit"));
        assert!(parse_bandwidth("-1kB/s").is_err());
        assert!(parse_bandwidth("1e30 B/s").is_err());
    }

    #[test]
    fn the_gossip_budget_defaults_and_too_small_a_one_is_refused() {
        let c = parse("kubeconfig = \"/k\"\n").unwrap();
        assert_eq!(c.gossip.max_bandwidth, DEFAULT_MAX_BANDWIDTH);
        let c = parse("kubeconfig = \"/k\"\n[gossip]\nmax_bandwidth = \"128kB/s\"\n").unwrap();
        assert_eq!(c.gossip.max_bandwidth, Some(128_000));
        let c = parse("kubeconfig = \"/k\"\n[gossip]\nmax_bandwidth = \"unlimited\"\n").unwrap();
        assert_eq!(c.gossip.max_bandwidth, None);
        let e = parse("kubeconfig = \"/k\"\n[gossip]\nmax_bandwidth = \"1kB/s\"\n")
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("line 3: gossip.max_bandwidth") && e.contains("8000 B/s"),
            "{e}"
        );
        let e = parse("kubeconfig = \"/k\"\n[gossip]\nmax_bandwidth = \"fast\"\n")
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("gossip.max_bandwidth") && e.contains("128kB/s"),
            "{e}"
        );
    }

    #[test]
    fn a_reload_tells_which_changes_need_a_restart() {
        let a = parse("kubeconfig = \"/k\"\n").unwrap();
        let b = parse("kubeconfig = \"/k\"\n[announce]\ngarp_count = 1\n").unwrap();
        assert!(a.restart_only_changes(&b).is_empty());
        let c = parse("node_name = \"x\"\nkubeconfig = \"/k\"\n[gossip]\nlisten = \"0.0.0.0:1\"\n")
            .unwrap();
        assert_eq!(
            a.restart_only_changes(&c),
            vec!["node_name", "gossip.listen"]
        );
    }
}
