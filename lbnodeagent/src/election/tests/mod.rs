//! Election tests: builders here, topics in the files below.

mod props;
mod reference;
mod rules;
mod seed_examples;

use std::net::IpAddr;

use hostlb_api::{AddressRange, LabelSelector, Prefix, Selector};

use super::view::*;
use super::{Election, VipReport};

pub(super) fn ip(s: &str) -> IpAddr {
    s.parse().unwrap()
}

pub(super) fn labels(pairs: &[(&str, &str)]) -> Labels {
    pairs
        .iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect()
}

pub(super) fn sel(pairs: &[(&str, &str)]) -> Selector {
    Selector::parse(&LabelSelector::from_labels(pairs.iter().copied())).unwrap()
}

pub(super) fn mk_node(name: &str, l: &[(&str, &str)]) -> NodeInfo {
    let mut labels = labels(l);
    labels.insert("kubernetes.io/hostname".into(), name.into());
    NodeInfo {
        name: name.into(),
        labels,
        ..NodeInfo::default()
    }
}

pub(super) fn mk_pool(name: &str, entries: &[&str]) -> Pool {
    Pool {
        name: name.into(),
        labels: Labels::new(),
        created: None,
        ranges: entries
            .iter()
            .map(|e| AddressRange::parse(e).unwrap())
            .collect(),
    }
}

/// An advertisement for the named pools (none = every pool).
pub(super) fn mk_ad(name: &str, pools: &[&str]) -> Advertisement {
    Advertisement {
        name: name.into(),
        pools: pools.iter().map(|p| p.to_string()).collect(),
        ..Default::default()
    }
}

pub(super) trait AdExt {
    fn nodes(self, s: &[(&str, &str)]) -> Self;
    fn prefer(self, weight: u32, s: &[(&str, &str)]) -> Self;
    fn services(self, s: &[(&str, &str)]) -> Self;
}

impl AdExt for Advertisement {
    fn nodes(mut self, s: &[(&str, &str)]) -> Self {
        self.node_selectors.push(sel(s));
        self
    }
    fn prefer(mut self, weight: u32, s: &[(&str, &str)]) -> Self {
        self.preferences.push(Preference {
            weight,
            selector: sel(s),
        });
        self
    }
    fn services(mut self, s: &[(&str, &str)]) -> Self {
        self.service_selectors.push(sel(s));
        self
    }
}

/// A Cluster-policy Service with endpoints everywhere.
pub(super) fn mk_svc(key: &str, addrs: &[&str]) -> ServiceInfo {
    ServiceInfo {
        key: key.into(),
        labels: Labels::new(),
        created: None,
        addresses: addrs.iter().map(|a| ip(a)).collect(),
        allocated_pool: None,
        local_traffic: false,
        rebalance: false,
        endpoints: Endpoints {
            any_usable: true,
            nodes: Default::default(),
        },
        ports: Vec::new(),
    }
}

/// Members for the given nodes, every one on-link for everything.
pub(super) fn everywhere(nodes: &[&str]) -> Vec<Member> {
    nodes
        .iter()
        .map(|n| {
            Member::alive(
                n,
                [
                    "0.0.0.0/0".parse::<Prefix>().unwrap(),
                    "::/0".parse().unwrap(),
                ],
            )
        })
        .collect()
}

pub(super) fn cluster(
    nodes: Vec<NodeInfo>,
    pools: Vec<Pool>,
    ads: Vec<Advertisement>,
    services: Vec<ServiceInfo>,
) -> Cluster {
    Cluster {
        nodes,
        pools,
        advertisements: ads,
        services,
    }
}

/// The names of the nodes in `nodes`.
pub(super) fn names(nodes: &[NodeInfo]) -> Vec<&str> {
    nodes.iter().map(|n| n.name.as_str()).collect()
}

pub(super) fn report(c: &Cluster, members: Vec<Member>, vip: &str) -> VipReport {
    Election::new(c, members).explain(ip(vip)).unwrap()
}

/// `(node, score)` in election order.
pub(super) fn order(r: &VipReport) -> Vec<(&str, u32)> {
    r.candidates
        .iter()
        .map(|c| (c.node.as_str(), c.score))
        .collect()
}

/// Node names sorted by `sha256(node#ip)`: the order without preferences.
pub(super) fn hash_sorted<'a>(nodes: &[&'a str], vip: &str) -> Vec<&'a str> {
    let mut v = nodes.to_vec();
    v.sort_by_key(|n| super::rank_key(n, vip));
    v
}
