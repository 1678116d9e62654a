//! What a simulated run is made of: a cluster (nodes, pools,
//! advertisements, Services) drawn from the seed, and the faults and
//! changes the schedule may throw at it.

use std::collections::BTreeSet;
use std::net::IpAddr;
use std::time::Duration;

use hostlb_api::{AddressRange, LabelSelector, Selector};

use super::rng::Rng;
use crate::election::{
    Advertisement, Cluster, Endpoints, Labels, NodeInfo, Pool, Preference, ServiceInfo,
};

/// The on-link subnet of every simulated host.
pub const SUBNET_V4: &str = "10.0.0.0/16";
pub const SUBNET_V6: &str = "fd00::/64";
/// Addresses on no host's subnet: held in virtual mode by every eligible node.
pub const OFF_LINK: &str = "10.99.0.0/24";
pub const LABEL_TIER: &str = "tier";
pub const LABEL_ZONE: &str = "zone";

/// The cluster objects as the API server has them.
#[derive(Clone, Debug)]
pub struct Truth {
    pub cluster: Cluster,
    /// Bumped at every write: the resourceVersion.
    pub version: u64,
    /// Bumped at every change of what the election reads: the agents'
    /// annotations move `version` and not this (the view's digest).
    pub content: u64,
    /// The Services whose endpoints alone changed at the last change.
    pub endpoints_only: Option<Vec<String>>,
    /// In a cluster whose main advertisement is sticky, the generator of
    /// its own that draws the rebalances asked (see [`Truth::make_sticky`]).
    sticky: Option<Rng>,
    next_address: u32,
    next_service: u32,
}

fn sel(pairs: &[(&str, &str)]) -> Selector {
    Selector::parse(&LabelSelector::from_labels(pairs.iter().copied())).expect("valid selector")
}

impl Truth {
    /// A cluster for `nodes`: one on-link pool (IPv4 and IPv6), one
    /// off-link pool, an advertisement for each, preferences on some seeds,
    /// and `services` Services, some dual-stack, some with
    /// `externalTrafficPolicy: Local`.
    pub fn generate(rng: &mut Rng, nodes: &[String], services: usize) -> Truth {
        let node_infos = nodes
            .iter()
            .map(|n| {
                let mut labels = Labels::new();
                labels.insert("kubernetes.io/hostname".into(), n.clone());
                labels.insert(
                    LABEL_ZONE.into(),
                    if rng.chance(0.5) { "a" } else { "b" }.into(),
                );
                if rng.chance(0.2) {
                    labels.insert(LABEL_TIER.into(), "edge".into());
                }
                NodeInfo {
                    name: n.clone(),
                    labels,
                    network_unavailable: false,
                    addresses: Vec::new(),
                    cordoned: false,
                }
            })
            .collect();
        let pools = vec![
            Pool {
                name: "main".into(),
                ranges: vec![
                    AddressRange::parse("10.0.1.0-10.0.1.255").expect("valid"),
                    AddressRange::parse("fd00::1:0-fd00::1:ff").expect("valid"),
                ],
                created: Some(1),
                ..Pool::default()
            },
            Pool {
                name: "routed".into(),
                ranges: vec![AddressRange::parse(OFF_LINK).expect("valid")],
                created: Some(2),
                ..Pool::default()
            },
        ];
        let preferences = if rng.chance(0.5) {
            vec![Preference {
                weight: 50,
                selector: sel(&[(LABEL_TIER, "edge")]),
            }]
        } else {
            Vec::new()
        };
        let advertisements = vec![
            Advertisement {
                name: "main".into(),
                pools: vec!["main".into()],
                preferences,
                ..Advertisement::default()
            },
            Advertisement {
                name: "routed".into(),
                pools: vec!["routed".into()],
                ..Advertisement::default()
            },
        ];
        let mut truth = Truth {
            cluster: Cluster {
                nodes: node_infos,
                pools,
                advertisements,
                services: Vec::new(),
            },
            version: 1,
            content: 1,
            endpoints_only: None,
            sticky: None,
            next_address: 1,
            next_service: 0,
        };
        for _ in 0..services {
            truth.push_service(rng);
        }
        truth
    }

    /// Places the main advertisement's addresses sticky, in a quarter of
    /// the seeds, drawn from a generator of its own so that the others
    /// run as they did: then half of the changes that would restrict the
    /// advertisement to a zone or open it again ask a Service to be
    /// rebalanced, or take that back, instead.
    pub fn make_sticky(&mut self, seed: u64) {
        let mut rng = Rng::new(seed ^ 0x5eed_f0e9_ed00_0003);
        if rng.chance(0.25) {
            self.cluster.advertisements[0].sticky = true;
            self.sticky = Some(rng);
        }
    }

    pub fn is_sticky(&self) -> bool {
        self.sticky.is_some()
    }

    fn push_service(&mut self, rng: &mut Rng) {
        let i = self.next_service;
        self.next_service += 1;
        let n = self.next_address;
        self.next_address += 1;
        let off_link = rng.chance(0.1);
        let mut addresses: Vec<IpAddr> = Vec::new();
        let pool = if off_link {
            addresses.push(format!("10.99.0.{}", n % 250 + 1).parse().expect("valid"));
            "routed"
        } else {
            addresses.push(format!("10.0.1.{}", n % 250 + 1).parse().expect("valid"));
            if rng.chance(0.3) {
                addresses.push(format!("fd00::1:{:x}", n % 250 + 1).parse().expect("valid"));
            }
            "main"
        };
        let local_traffic = rng.chance(0.3);
        let endpoints = self.random_endpoints(rng, local_traffic);
        self.cluster.services.push(ServiceInfo {
            key: format!("default/s{i}"),
            labels: Labels::new(),
            created: Some(i64::from(i)),
            addresses,
            allocated_pool: Some(pool.into()),
            local_traffic,
            rebalance: false,
            endpoints,
            ports: Vec::new(),
        });
    }

    fn random_endpoints(&self, rng: &mut Rng, local: bool) -> Endpoints {
        let names: Vec<&str> = self.cluster.nodes.iter().map(|n| n.name.as_str()).collect();
        let count = if local {
            rng.range(1, 2)
        } else {
            rng.range(1, 3)
        } as usize;
        let mut on = BTreeSet::new();
        for _ in 0..count {
            on.insert(*rng.pick(&names));
        }
        Endpoints::on(on)
    }

    fn bump(&mut self, endpoints_only: Option<Vec<String>>) {
        self.version += 1;
        self.content += 1;
        self.endpoints_only = endpoints_only;
    }

    /// An agent wrote its announcing annotations: a write every watch
    /// sees, with nothing in it the election reads.
    pub fn annotated(&mut self) {
        self.version += 1;
    }

    /// One change a user or a controller makes: a Service created or
    /// deleted, its endpoints moved or gone, a node's preference label
    /// toggled, the main advertisement restricted to a zone or opened
    /// again. Returns what it did, for the trace.
    pub fn churn(&mut self, rng: &mut Rng) -> String {
        match rng.below(6) {
            0 if self.cluster.services.len() < 40 => {
                self.push_service(rng);
                self.bump(None);
                let s = self.cluster.services.last().expect("just pushed");
                format!("service {} created at {:?}", s.key, s.addresses)
            }
            1 if self.cluster.services.len() > 1 => {
                let i = rng.below(self.cluster.services.len());
                let s = self.cluster.services.remove(i);
                self.bump(None);
                format!("service {} deleted", s.key)
            }
            2 | 3 if !self.cluster.services.is_empty() => {
                let i = rng.below(self.cluster.services.len());
                let local = self.cluster.services[i].local_traffic;
                let endpoints = if rng.chance(0.2) {
                    Endpoints::default()
                } else {
                    self.random_endpoints(rng, local)
                };
                let s = &mut self.cluster.services[i];
                s.endpoints = endpoints;
                let text = format!("endpoints of {} now on {:?}", s.key, s.endpoints.nodes);
                let key = s.key.clone();
                self.bump(Some(vec![key]));
                text
            }
            4 => {
                let i = rng.below(self.cluster.nodes.len());
                let node = &mut self.cluster.nodes[i];
                let text = if node.labels.remove(LABEL_TIER).is_some() {
                    format!("{} no longer tier=edge", node.name)
                } else {
                    node.labels.insert(LABEL_TIER.into(), "edge".into());
                    format!("{} labelled tier=edge", node.name)
                };
                self.bump(None);
                text
            }
            _ if !self.cluster.services.is_empty()
                && self.sticky.as_mut().is_some_and(|r| r.chance(0.5)) =>
            {
                let r = self.sticky.as_mut().expect("sticky");
                let i = r.below(self.cluster.services.len());
                let s = &mut self.cluster.services[i];
                s.rebalance = !s.rebalance;
                let text = if s.rebalance {
                    format!("rebalance of {} asked", s.key)
                } else {
                    format!("rebalance of {} over", s.key)
                };
                self.bump(None);
                text
            }
            _ => {
                let ad = &mut self.cluster.advertisements[0];
                let text = if ad.node_selectors.is_empty() {
                    ad.node_selectors = vec![sel(&[(LABEL_ZONE, "a")])];
                    "advertisement main: only zone a"
                } else {
                    ad.node_selectors.clear();
                    "advertisement main: every node"
                };
                self.bump(None);
                text.into()
            }
        }
    }
}

/// Something that happens to a host or to the cluster. Each fault has its
/// recovery, scheduled when the fault happens.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Fault {
    /// The host loses power: its kernel and agent are gone.
    Crash(usize),
    /// Power back: the host boots and its agent starts.
    Boot(usize),
    /// SIGSTOP to the agent; its kernel goes on answering.
    Freeze(usize),
    Thaw(usize),
    /// The agent starved of CPU for a moment (at most 200 ms), then on
    /// again ([`Fault::Thaw`]): its beats stop, its kernel goes on
    /// answering, and nobody may take its VIPs.
    Stall(usize),
    /// SIGKILL, nobody cleans up: the addresses stay until they lapse.
    Kill(usize),
    /// SIGKILL, then systemd's `ExecStopPost=lbnodeagent cleanup`.
    KillCleanup(usize),
    /// SIGTERM: a planned hand-over.
    Term(usize),
    /// The agent starts (again).
    Start(usize),
    /// The host's switch port goes down.
    PortDown(usize),
    PortUp(usize),
    /// A firewall drops gossip to and from the host; ARP still flows.
    Partition(usize),
    Heal(usize),
    /// The API server stops answering.
    ApiDown,
    ApiUp,
    /// The host's path to the API server is cut (a firewall, a broken
    /// route to its load balancer): its agent's watches hear nothing while
    /// the others go on hearing every change, so views differ between live
    /// agents that gossip with each other, for as long as it lasts.
    ApiCut(usize),
    ApiMend(usize),
    /// The host's kernel refuses a share of address operations.
    Flaky(usize),
    Steady(usize),
    /// Its operator drains the node (its NodeAgent's `spec.drain`): its
    /// VIPs move away make before break; [`Fault::Undrain`] lets it win
    /// again.
    Drain(usize),
    Undrain(usize),
    /// The host's default gateways stop answering it (its uplink is cut),
    /// its carrier stays up: its agent finds them lost within a round,
    /// and its VIPs move away make before break. A restarted agent finds
    /// nothing (a gateway that never answered is not lost).
    GatewayLost(usize),
    GatewayBack(usize),
    /// The router itself goes down: every running agent finds its gateways
    /// lost within a few milliseconds of the others (their rounds fall on
    /// the same whole seconds), and nothing may move for it.
    RouterDown,
    RouterUp,
}

impl Fault {
    /// Planned changes keep their promise of no lost reply; every other
    /// fault may cost one, within bounds.
    pub fn planned(self) -> bool {
        matches!(
            self,
            Fault::Term(_)
                | Fault::Start(_)
                | Fault::Stall(_)
                | Fault::Drain(_)
                | Fault::Undrain(_)
                | Fault::GatewayLost(_)
                | Fault::GatewayBack(_)
                | Fault::RouterDown
                | Fault::RouterUp
        )
    }
}

/// The run's shape, drawn from the seed.
#[derive(Clone, Debug)]
pub struct Shape {
    pub nodes: usize,
    pub services: usize,
    pub lifetime: Duration,
    /// Share of gossip messages lost.
    pub loss: f64,
    /// Faults and changes are over by then; the rest is for settling.
    pub faults_until: Duration,
    pub end: Duration,
}

impl Shape {
    pub fn draw(rng: &mut Rng) -> Shape {
        let nodes = match rng.below(10) {
            0..=5 => rng.range(3, 5),
            6..=8 => rng.range(6, 10),
            _ => rng.range(11, 20),
        } as usize;
        let faults_until = Duration::from_secs(rng.range(20, 40));
        Shape {
            nodes,
            services: rng.range(2, 16) as usize,
            lifetime: Duration::from_secs(rng.range(4, 8)),
            loss: *rng.pick(&[0.0, 0.0, 0.01, 0.05]),
            faults_until,
            end: faults_until + Duration::from_secs(20),
        }
    }
}
