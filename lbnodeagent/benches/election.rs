//! Election cost at SPEC §10 scale: 1,000 nodes x 10,000 VIPs.
//!
//! `cargo bench -p lbnodeagent --bench election`
//!
//! - `full_recompute/*`: `set_cluster` with every VIP re-elected from the
//!   compiled cluster (what a config or label change costs). Target < 50 ms.
//! - `membership_change/*`: one member fails, then returns; each iteration is
//!   those two changes. Target < 5 ms per change.
//! - `cold_start`: the first election, which also hashes every (node, VIP)
//!   pair once; later recomputes reuse those orders.

use std::collections::BTreeSet;
use std::hint::black_box;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};
use std::time::Duration;

use criterion::{Criterion, criterion_group, criterion_main};
use hostlb_api::{AddressRange, LabelSelector, Prefix, Selector};
use lbnodeagent::election::{
    Advertisement, Cluster, Election, Endpoints, Labels, Member, NodeInfo, Pool, Preference,
    ServiceInfo,
};

const NODES: usize = 1_000;
const VIPS: usize = 10_000;

fn sel(pairs: &[(&str, &str)]) -> Selector {
    Selector::parse(&LabelSelector::from_labels(pairs.iter().copied())).unwrap()
}

fn labels(pairs: &[(&str, String)]) -> Labels {
    pairs
        .iter()
        .map(|(k, v)| (k.to_string(), v.clone()))
        .collect()
}

/// A cluster of `NODES` nodes in four zones (10% `role=lb`, two edge nodes)
/// and `VIPS` single-address Services (80% IPv4; 10% Local with endpoints on
/// three nodes; 10% labelled `app=edge`).
fn cluster(preferences: bool) -> Cluster {
    let zones = ["a", "b", "c", "d"];
    let nodes: Vec<NodeInfo> = (0..NODES)
        .map(|i| {
            let mut l = vec![
                ("zone", zones[i % 4].to_string()),
                ("kubernetes.io/hostname", format!("worker-{i:04}")),
            ];
            if i % 10 == 0 {
                l.push(("role", "lb".into()));
            }
            if i == 10 || i == 20 {
                l.push(("node-role", "edge".into()));
            }
            NodeInfo {
                name: format!("worker-{i:04}"),
                labels: labels(&l),
                network_unavailable: false,
                addresses: Vec::new(),
                cordoned: false,
            }
        })
        .collect();
    let pools = vec![Pool {
        name: "default".into(),
        labels: Labels::new(),
        created: Some(0),
        ranges: vec![
            AddressRange::parse("10.0.0.0/16").unwrap(),
            AddressRange::parse("fd00:10::/64").unwrap(),
        ],
    }];
    let mut main = Advertisement {
        name: "main".into(),
        ..Default::default()
    };
    let mut edge = Advertisement {
        name: "edge".into(),
        service_selectors: vec![sel(&[("app", "edge")])],
        node_selectors: vec![sel(&[("role", "lb")])],
        ..Default::default()
    };
    if preferences {
        main.preferences = vec![
            Preference {
                weight: 100,
                selector: sel(&[("zone", "a")]),
            },
            Preference {
                weight: 50,
                selector: sel(&[("zone", "b")]),
            },
        ];
        edge.preferences = vec![Preference {
            weight: 100,
            selector: sel(&[("node-role", "edge")]),
        }];
    }
    let services = (0..VIPS)
        .map(|i| {
            let ip = if i % 5 == 4 {
                IpAddr::V6(Ipv6Addr::new(0xfd00, 0x10, 0, 0, 0, 0, 0, i as u16 + 1))
            } else {
                let n = i as u32 + 1;
                IpAddr::V4(Ipv4Addr::new(10, 0, (n >> 8) as u8, n as u8))
            };
            let local = i % 10 == 3;
            let endpoints = if local {
                Endpoints {
                    any_usable: true,
                    nodes: (0..3)
                        .map(|k| format!("worker-{:04}", (i * 7 + k * 331) % NODES))
                        .collect::<BTreeSet<_>>(),
                }
            } else {
                Endpoints {
                    any_usable: true,
                    nodes: BTreeSet::new(),
                }
            };
            let mut l = Labels::new();
            if i % 10 == 7 {
                l.insert("app".into(), "edge".into());
            }
            ServiceInfo {
                key: format!("ns-{}/svc-{i}", i % 50),
                labels: l,
                created: Some(i as i64),
                addresses: vec![ip],
                allocated_pool: Some("default".into()),
                local_traffic: local,
                rebalance: false,
                endpoints,
                ports: Vec::new(),
            }
        })
        .collect();
    Cluster {
        nodes,
        pools,
        advertisements: vec![main, edge],
        services,
    }
}

fn members() -> Vec<Member> {
    (0..NODES)
        .map(|i| {
            Member::alive(
                &format!("worker-{i:04}"),
                [
                    "10.0.0.0/8".parse::<Prefix>().unwrap(),
                    "fd00::/16".parse().unwrap(),
                ],
            )
        })
        .collect()
}

/// The node holding the most VIPs: the worst single failure.
fn busiest(e: &Election) -> String {
    let mut counts = std::collections::HashMap::new();
    for (_, w) in e.winners() {
        if let Some(w) = w {
            *counts.entry(w.to_string()).or_insert(0usize) += 1;
        }
    }
    counts.into_iter().max_by_key(|(_, c)| *c).unwrap().0
}

/// Resident set size of this process, from `/proc/self/status`.
fn rss_kib() -> u64 {
    std::fs::read_to_string("/proc/self/status")
        .unwrap()
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.trim().trim_end_matches(" kB").trim().parse().ok())
        .unwrap()
}

fn bench(c: &mut Criterion) {
    {
        let cl = cluster(true);
        let before = rss_kib();
        let e = Election::new(&cl, members());
        eprintln!(
            "engine memory at {NODES} nodes x {VIPS} VIPs: {} MiB above the cluster objects",
            (rss_kib() - before) / 1024
        );
        drop(e);
    }
    for (name, prefs) in [("no_preferences", false), ("preferences", true)] {
        let cl = cluster(prefs);
        let mut e = Election::new(&cl, members());
        let mut g = c.benchmark_group("full_recompute");
        g.sample_size(20).measurement_time(Duration::from_secs(10));
        g.bench_function(name, |b| {
            b.iter(|| black_box(e.set_cluster(black_box(&cl))))
        });
        g.finish();

        let victim = busiest(&e);
        let held = e
            .winners()
            .filter(|(_, w)| *w == Some(victim.as_str()))
            .count();
        eprintln!("membership_change/{name}: {victim} holds {held} of {VIPS} VIPs");
        let back = members().into_iter().find(|m| m.node == victim).unwrap();
        let mut g = c.benchmark_group("membership_change");
        g.sample_size(50);
        g.bench_function(format!("{name}/fail_and_return"), |b| {
            b.iter(|| {
                let gone = e.remove_member(black_box(&victim));
                let back = e.upsert_member(black_box(back.clone()));
                assert_eq!(gone.len(), held);
                assert_eq!(back.len(), held);
            })
        });
        g.finish();
    }

    let cl = cluster(false);
    let mut g = c.benchmark_group("cold_start");
    g.sample_size(10).measurement_time(Duration::from_secs(20));
    g.bench_function("no_preferences", |b| {
        b.iter(|| black_box(Election::new(black_box(&cl), members())))
    });
    g.finish();
}

criterion_group!(benches, bench);
criterion_main!(benches);
