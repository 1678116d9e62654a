//! Property tests over random clusters: the engine agrees with the naive
//! reference, and the invariants operators rely on hold.

use std::collections::{BTreeMap, BTreeSet};

use hostlb_api::annotations::EXCLUDE_FROM_EXTERNAL_LB;
use hostlb_tests::rng::Rng;
use proptest::prelude::*;

use super::*;
use crate::election::{Duty, NodeName};

fn random_selector(r: &mut Rng) -> Selector {
    let choices: [&[(&str, &str)]; 7] = [
        &[],
        &[("zone", "a")],
        &[("zone", "b")],
        &[("role", "lb")],
        &[("role", "edge")],
        &[("gpu", "true")],
        &[("zone", "a"), ("role", "lb")],
    ];
    sel(choices[r.below(choices.len() as u64) as usize])
}

pub(super) struct World {
    pub cluster: Cluster,
    pub members: Vec<Member>,
}

pub(super) fn world(seed: u64) -> World {
    let mut r = Rng(seed);
    let max_nodes = if r.chance(0.3) { 40 } else { 12 };
    let n_nodes = 1 + r.below(max_nodes) as usize;
    let mut nodes = Vec::new();
    for i in 0..n_nodes {
        let mut l: Vec<(&str, &str)> = Vec::new();
        if r.chance(0.8) {
            l.push(("zone", *r.pick(&["a", "b", "c"])));
        }
        if r.chance(0.6) {
            l.push(("role", *r.pick(&["lb", "edge"])));
        }
        if r.chance(0.3) {
            l.push(("gpu", "true"));
        }
        if r.chance(0.07) {
            l.push((EXCLUDE_FROM_EXTERNAL_LB, ""));
        }
        let mut n = mk_node(&format!("node-{i}"), &l);
        n.network_unavailable = r.chance(0.07);
        n.cordoned = r.chance(0.1);
        nodes.push(n);
    }
    let n_pools = 1 + r.below(3) as usize;
    let mut pools = Vec::new();
    for i in 0..n_pools {
        let v4 = format!("10.{i}.0.0/28");
        let v6 = format!("fd00:{i}::/124");
        let mut entries = vec![v4.as_str(), v6.as_str()];
        if i > 0 && r.chance(0.2) {
            entries.push("10.0.0.0/30");
        }
        let mut p = mk_pool(&format!("pool-{i}"), &entries);
        p.labels = labels(&[("tier", *r.pick(&["gold", "silver"]))]);
        p.created = r.chance(0.8).then(|| r.below(5) as i64);
        pools.push(p);
    }
    let n_ads = r.below(5) as usize;
    let mut ads = Vec::new();
    for i in 0..n_ads {
        let mut ad = mk_ad(&format!("ad-{i}"), &[]);
        match r.below(4) {
            0 => {}
            1 => ad.pools = vec![format!("pool-{}", r.below(n_pools as u64 + 1))],
            2 => ad.pool_selectors = vec![sel(&[("tier", *r.pick(&["gold", "silver"]))])],
            _ => {
                ad.pools = vec![format!("pool-{}", r.below(n_pools as u64))];
                ad.pool_selectors = vec![sel(&[("tier", "gold")])];
            }
        }
        for _ in 0..r.below(3) {
            ad.node_selectors.push(random_selector(&mut r));
        }
        if r.chance(0.3) {
            ad.service_selectors
                .push(sel(&[("app", *r.pick(&["frontend", "backend"]))]));
        }
        if r.chance(0.15) {
            ad.interfaces = vec!["eth1".into()];
        }
        ad.drain_cordoned = r.chance(0.4);
        for _ in 0..r.below(4) {
            ad.preferences.push(Preference {
                weight: 1 + r.below(100) as u32,
                selector: random_selector(&mut r),
            });
        }
        ads.push(ad);
    }
    let n_svcs = 1 + r.below(10) as usize;
    let mut services: Vec<ServiceInfo> = Vec::new();
    for i in 0..n_svcs {
        let mut addrs: Vec<IpAddr> = Vec::new();
        if i > 0 && r.chance(0.2) {
            let other = &services[r.below(i as u64) as usize];
            addrs.push(other.addresses[0]);
        } else {
            let p = r.below(n_pools as u64 + 1); // one beyond: in no pool
            let host = r.below(16);
            addrs.push(ip(&format!("10.{p}.0.{host}")));
            if r.chance(0.3) {
                addrs.push(ip(&format!("fd00:{p}::{host:x}")));
            }
        }
        let mut s = ServiceInfo {
            key: format!("ns/svc-{i}"),
            labels: labels(&[("app", *r.pick(&["frontend", "backend"]))]),
            created: r.chance(0.8).then(|| r.below(5) as i64),
            addresses: addrs,
            allocated_pool: None,
            local_traffic: r.chance(0.3),
            rebalance: false,
            endpoints: Endpoints {
                any_usable: r.chance(0.9),
                nodes: BTreeSet::new(),
            },
            ports: Vec::new(),
        };
        if r.chance(0.2) {
            s.allocated_pool = Some(format!("pool-{}", r.below(n_pools as u64 + 1)));
        }
        if s.local_traffic {
            let picked: Vec<String> = nodes
                .iter()
                .filter(|_| r.chance(0.4))
                .map(|n| n.name.clone())
                .collect();
            s.endpoints = Endpoints::on(picked.iter().map(String::as_str));
        }
        services.push(s);
    }
    let mut members = Vec::new();
    let mut names: Vec<String> = nodes.iter().map(|n| n.name.clone()).collect();
    if r.chance(0.2) {
        names.push("stranger".into());
    }
    for name in names {
        if !r.chance(0.8) {
            continue;
        }
        members.push(random_member(&mut r, &name, n_pools));
    }
    World {
        cluster: cluster(nodes, pools, ads, services),
        members,
    }
}

fn random_member(r: &mut Rng, name: &str, n_pools: usize) -> Member {
    let mut on_link = Vec::new();
    let on = |p: &str, iface: &str, announce: bool| OnLink {
        prefix: p.parse().unwrap(),
        interface: iface.into(),
        announce,
        upstream_lost: false,
    };
    match r.below(10) {
        0..=6 => {
            on_link.push(on("10.0.0.0/8", "eth0", true));
            on_link.push(on("fd00::/16", "eth0", true));
        }
        7 | 8 => {
            let p = r.below(n_pools as u64);
            on_link.push(on(&format!("10.{p}.0.0/24"), "eth0", true));
        }
        _ => {}
    }
    if r.chance(0.2) {
        on_link.push(on("10.0.0.0/8", "eth1", false));
    }
    // A gateway lost, for one family on every interface: the node is the
    // last resort for that family's addresses wherever it holds them.
    if r.chance(0.15) {
        let v4 = r.chance(0.5);
        for o in &mut on_link {
            o.upstream_lost = o.prefix.addr().is_ipv4() == v4;
        }
    }
    Member {
        node: name.into(),
        leaving: r.chance(0.1),
        drained: r.chance(0.15),
        virtual_mode: r.chance(0.8),
        on_link: on_link.into(),
    }
}

/// Every member's gateways answer.
fn no_gateway_lost(w: &mut World) {
    for m in &mut w.members {
        m.on_link = m
            .on_link
            .iter()
            .map(|o| OnLink {
                upstream_lost: false,
                ..o.clone()
            })
            .collect();
    }
}

fn winners(e: &Election) -> BTreeMap<IpAddr, Option<String>> {
    e.winners()
        .map(|(i, w)| (i, w.map(str::to_string)))
        .collect()
}

fn assert_matches_reference(e: &Election, w: &World) {
    let want = reference::elect(&w.cluster, &w.members);
    let got = e.report_all();
    assert_eq!(got.len(), want.len());
    for r in got {
        let a = &want[&r.ip];
        let order: Vec<(String, u32)> = r
            .candidates
            .iter()
            .map(|c| (c.node.clone(), c.score))
            .collect();
        assert_eq!(order, a.order, "order for {}", r.ip);
        assert_eq!(r.winner, a.winner, "winner for {}", r.ip);
        assert_eq!(
            e.winner(r.ip),
            a.winner.as_deref(),
            "fast path for {}",
            r.ip
        );
    }
}

fn shuffled<T: Clone>(items: &[T], r: &mut Rng) -> Vec<T> {
    let mut v = items.to_vec();
    for i in (1..v.len()).rev() {
        let j = r.below(i as u64 + 1) as usize;
        v.swap(i, j);
    }
    v
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(400))]

    /// Both ways of finding a winner (walking the hash order, hashing a
    /// tier directly) and their mix agree with the reference.
    #[test]
    fn engine_agrees_with_the_reference(seed in any::<u64>()) {
        let w = world(seed);
        for (direct_hash_max, order_depth) in [(0, 1), (0, 3), (2, 2), (8, 32), (usize::MAX, 32)] {
            let e = Election::tuned(&w.cluster, w.members.clone(), direct_hash_max, order_depth);
            assert_matches_reference(&e, &w);
        }
    }

    #[test]
    fn answer_does_not_depend_on_input_order(seed in any::<u64>(), shuffle in any::<u64>()) {
        let w = world(seed);
        let mut r = Rng(shuffle);
        let c2 = Cluster {
            nodes: shuffled(&w.cluster.nodes, &mut r),
            pools: shuffled(&w.cluster.pools, &mut r),
            advertisements: shuffled(&w.cluster.advertisements, &mut r),
            services: shuffled(&w.cluster.services, &mut r),
        };
        let a = Election::new(&w.cluster, w.members.clone()).report_all();
        let b = Election::new(&c2, shuffled(&w.members, &mut r)).report_all();
        prop_assert_eq!(a, b);
    }

    /// Every node, computing from the same view, reaches the same single
    /// winner: exactly one node has an Announce duty for each elected VIP,
    /// and it is a live, eligible, on-link candidate.
    #[test]
    fn one_owner_per_vip_across_nodes(seed in any::<u64>()) {
        let w = world(seed);
        let mut announcers: BTreeMap<IpAddr, Vec<String>> = BTreeMap::new();
        for node in &w.cluster.nodes {
            // Each node builds its own engine, with members in its own order.
            let mut r = Rng(seed ^ node.name.len() as u64);
            let e = Election::new(&w.cluster, shuffled(&w.members, &mut r));
            for d in e.duties(&node.name) {
                match d {
                    Duty::Announce { ip, .. } => {
                        announcers.entry(ip).or_default().push(node.name.clone());
                    }
                    // A virtual address on a node that has the prefix on
                    // any interface would be answered there too.
                    Duty::Virtual { ip } => {
                        let m = w.members.iter().find(|m| m.node == node.name).unwrap();
                        prop_assert!(!m.on_link.iter().any(|o| o.prefix.contains(ip)));
                    }
                }
            }
        }
        let e = Election::new(&w.cluster, w.members.clone());
        for r in e.report_all() {
            match &r.winner {
                Some(win) => {
                    prop_assert_eq!(announcers.get(&r.ip).cloned().unwrap_or_default(), vec![win.clone()]);
                    let m = w.members.iter().find(|m| &m.node == win).unwrap();
                    prop_assert!(!m.leaving);
                    prop_assert!(m.on_link.iter().any(|o| o.prefix.contains(r.ip)));
                    prop_assert!(w.cluster.nodes.iter().any(|n| &n.name == win && !n.network_unavailable));
                }
                None => prop_assert!(!announcers.contains_key(&r.ip)),
            }
        }
    }

    /// Without preferences the candidates are in pure hash order.
    #[test]
    fn no_preferences_means_hash_order(seed in any::<u64>()) {
        let mut w = world(seed);
        for ad in &mut w.cluster.advertisements {
            ad.preferences.clear();
        }
        for m in &mut w.members {
            m.drained = false;
        }
        no_gateway_lost(&mut w);
        for n in &mut w.cluster.nodes {
            n.cordoned = false;
        }
        for r in Election::new(&w.cluster, w.members.clone()).report_all() {
            let mut by_hash = r.candidates.clone();
            by_hash.sort_by_key(|c| c.hash);
            prop_assert_eq!(&by_hash, &r.candidates);
            for (i, c) in r.candidates.iter().enumerate() {
                prop_assert_eq!(c.score, 0);
                prop_assert_eq!(c.hash_rank, i + 1);
            }
        }
    }

    /// When a node leaves, only the VIPs it won move.
    #[test]
    fn a_departure_moves_only_its_vips(seed in any::<u64>(), pick in any::<u64>()) {
        let w = world(seed);
        prop_assume!(!w.members.is_empty());
        let gone = w.members[(pick % w.members.len() as u64) as usize].node.clone();
        let mut e = Election::new(&w.cluster, w.members.clone());
        let before = winners(&e);
        let moved = e.remove_member(&gone);
        let after = winners(&e);
        for (ip, win) in &before {
            if win.as_deref() != Some(gone.as_str()) {
                prop_assert_eq!(win, &after[ip], "{} moved though {} did not hold it", ip, gone);
            } else {
                prop_assert_ne!(after[ip].as_deref(), Some(gone.as_str()));
            }
        }
        let expect: Vec<IpAddr> = before.iter().filter(|(ip, w)| after[*ip] != **w).map(|(ip, _)| *ip).collect();
        prop_assert_eq!(moved, expect);
    }

    /// Draining a node moves exactly the VIPs it won that a node that is
    /// not drained can serve, to the one that would win without it; what
    /// no such node can serve stays with the drained nodes, in their
    /// order; undraining it gives back what it had.
    #[test]
    fn a_drain_moves_what_can_move_and_undrain_restores(seed in any::<u64>(), pick in any::<u64>()) {
        let mut w = world(seed);
        prop_assume!(!w.members.is_empty());
        let i = (pick % w.members.len() as u64) as usize;
        w.members[i].drained = false;
        // Drains alone: cordons drain per address, and lost gateways per
        // family (each tested on their own).
        for n in &mut w.cluster.nodes {
            n.cordoned = false;
        }
        no_gateway_lost(&mut w);
        let node = w.members[i].node.clone();
        let mut e = Election::new(&w.cluster, w.members.clone());
        let before = winners(&e);
        let already: BTreeSet<String> = w.members.iter().filter(|m| m.drained).map(|m| m.node.to_string()).collect();
        let mut drained = w.members[i].clone();
        drained.drained = true;
        let moved = e.upsert_member(drained.clone());
        let after = winners(&e);
        for (ip, win) in &before {
            if win.as_deref() == Some(node.as_str()) {
                let other = e.winner_without(*ip, |n| n == node || already.contains(n));
                if let Some(o) = other {
                    prop_assert_eq!(after[ip].as_deref(), Some(o), "{} had another candidate", ip);
                }
            } else {
                prop_assert_eq!(win, &after[ip], "{} moved though {} did not hold it", ip, node);
            }
        }
        let expect: Vec<IpAddr> = before.iter().filter(|(ip, w)| after[*ip] != **w).map(|(ip, _)| *ip).collect();
        prop_assert_eq!(moved, expect);
        let mut members = w.members.clone();
        members[i] = drained;
        assert_matches_reference(&e, &World { cluster: w.cluster.clone(), members });
        let mut back = w.members[i].clone();
        back.drained = false;
        e.upsert_member(back);
        prop_assert_eq!(winners(&e), before);
    }

    /// Raising one node's weight never makes it lose a VIP it held.
    #[test]
    fn more_weight_never_loses(seed in any::<u64>(), pick in any::<u64>(), weight in 1u32..=100) {
        let w = world(seed);
        prop_assume!(!w.cluster.nodes.is_empty());
        let node = w.cluster.nodes[(pick % w.cluster.nodes.len() as u64) as usize].name.clone();
        let e = Election::new(&w.cluster, w.members.clone());
        let held: Vec<IpAddr> = e.winners().filter(|(_, x)| *x == Some(node.as_str())).map(|(i, _)| i).collect();
        let mut c2 = w.cluster.clone();
        for ad in &mut c2.advertisements {
            ad.preferences.push(Preference {
                weight,
                selector: sel(&[("kubernetes.io/hostname", node.as_str())]),
            });
        }
        let e2 = Election::new(&c2, w.members.clone());
        for ip in held {
            prop_assert_eq!(e2.winner(ip), Some(node.as_str()), "{} lost {}", node, ip);
        }
    }

    /// Nodes that appear after the first election (new slots in partially
    /// cached orders) are placed exactly where a fresh election puts them.
    #[test]
    fn nodes_added_later_equal_scratch(seed in any::<u64>(), split in any::<u64>()) {
        let w = world(seed);
        let mut r = Rng(split);
        let mut early = w.cluster.clone();
        early.nodes.retain(|_| r.chance(0.5));
        let early_names: Vec<String> = early.nodes.iter().map(|n| n.name.clone()).collect();
        let early_members: Vec<Member> = w.members.iter().filter(|m| early_names.contains(&m.node.to_string())).cloned().collect();
        let depth = 1 + r.below(4) as usize;
        let mut e = Election::tuned(&early, early_members, r.below(3) as usize, depth);
        e.set_cluster(&w.cluster);
        for m in &w.members {
            e.upsert_member(m.clone());
        }
        assert_matches_reference(&e, &w);
    }

    /// Any sequence of membership changes applied incrementally gives the
    /// same winners as computing from scratch, and matches the reference.
    #[test]
    fn incremental_equals_scratch(seed in any::<u64>(), ops in any::<u64>()) {
        let w = world(seed);
        let mut r = Rng(ops);
        let mut e = Election::tuned(&w.cluster, w.members.clone(), r.below(4) as usize, 1 + r.below(4) as usize);
        let mut live: Vec<Member> = w.members.clone();
        let names: Vec<String> = w.cluster.nodes.iter().map(|n| n.name.clone()).collect();
        prop_assume!(!names.is_empty());
        for _ in 0..12 {
            let name = r.pick(&names).clone();
            match r.below(3) {
                0 => {
                    e.remove_member(&name);
                    live.retain(|m| m.node != name);
                }
                _ => {
                    let m = random_member(&mut r, &name, w.cluster.pools.len());
                    e.upsert_member(m.clone());
                    live.retain(|x| x.node != name);
                    live.push(m);
                }
            }
            let scratch = Election::new(&w.cluster, live.clone());
            prop_assert_eq!(winners(&e), winners(&scratch));
        }
        assert_matches_reference(&e, &World { cluster: w.cluster.clone(), members: live });
    }

    /// Changing one Service's endpoints through `set_endpoints` gives what a
    /// whole new cluster view with those endpoints gives, and the addresses
    /// it returns include every one whose duties moved.
    #[test]
    fn endpoints_alone_equal_a_new_view(seed in any::<u64>(), pick in any::<u64>()) {
        let w = world(seed);
        prop_assume!(!w.cluster.services.is_empty());
        let mut r = Rng(pick);
        let i = r.below(w.cluster.services.len() as u64) as usize;
        let names: Vec<&str> = w.cluster.nodes.iter().map(|n| n.name.as_str()).collect();
        let on: Vec<&str> = names.iter().copied().filter(|_| r.chance(0.4)).collect();
        let endpoints = if r.chance(0.2) { Endpoints::default() } else { Endpoints::on(on) };
        let mut e = Election::new(&w.cluster, w.members.clone());
        let duties_before: Vec<_> = names.iter().map(|n| e.duties(n)).collect();
        let touched = e.set_endpoints(&w.cluster.services[i].key, &endpoints);
        let mut changed = w.cluster.clone();
        changed.services[i].endpoints = endpoints;
        let scratch = Election::new(&changed, w.members.clone());
        prop_assert_eq!(e.report_all(), scratch.report_all());
        for (n, before) in names.iter().zip(duties_before) {
            let after = e.duties(n);
            for d in after.iter().filter(|d| !before.contains(d)).chain(before.iter().filter(|d| !after.contains(d))) {
                let ip = match d { Duty::Announce { ip, .. } | Duty::Virtual { ip } => *ip };
                prop_assert!(touched.contains(&ip), "{} moved for {} but was not returned", ip, n);
            }
        }
    }

    /// `duty` is `duties` one address at a time; `winner_without` and
    /// `duty_without` with nobody passed over are `winner` and the
    /// winner's duty, and passing over the winner names the runner-up.
    #[test]
    fn one_address_at_a_time_agrees_with_the_whole(seed in any::<u64>()) {
        let w = world(seed);
        let e = Election::new(&w.cluster, w.members.clone());
        for n in &w.cluster.nodes {
            let all = e.duties(&n.name);
            for r in e.report_all() {
                let one = e.duty(&n.name, r.ip);
                let listed = all.iter().find(|d| matches!(d, Duty::Announce { ip, .. } | Duty::Virtual { ip } if *ip == r.ip)).cloned();
                prop_assert_eq!(one.clone(), listed);
                if r.winner.as_deref() == Some(n.name.as_str()) {
                    prop_assert_eq!(e.duty_without(&n.name, r.ip, |_| false), one);
                }
            }
        }
        for r in e.report_all() {
            prop_assert_eq!(e.winner_without(r.ip, |_| false), r.winner.as_deref());
            if let Some(w0) = r.winner.as_deref() {
                let second = r.candidates.get(1).map(|c| c.node.as_str());
                prop_assert_eq!(e.winner_without(r.ip, |n| n == w0), second);
                if let Some(s) = second {
                    prop_assert!(e.duty_without(s, r.ip, |n| n == w0).is_some());
                    prop_assert!(e.duty_without(s, r.ip, |_| false).is_none());
                }
            }
        }
    }

    /// `runners_up()` pairs every VIP's winner with its second candidate,
    /// with the walk (shallow cached orders) and direct hashing alike.
    #[test]
    fn runners_up_pair_each_winner_with_its_second(seed in any::<u64>()) {
        let w = world(seed);
        for (direct, depth) in [(0, 1), (usize::MAX, 32)] {
            let mut e = Election::tuned(&w.cluster, w.members.clone(), direct, depth);
            let reports = e.report_all();
            let mut expected: std::collections::BTreeMap<NodeName, Vec<(std::net::IpAddr, NodeName)>> =
                Default::default();
            for r in &reports {
                if let (Some(w0), Some(second)) = (&r.winner, r.candidates.get(1)) {
                    expected.entry(w0.into()).or_default().push((r.ip, second.node.as_str().into()));
                }
            }
            for runs in expected.values_mut() {
                runs.sort();
            }
            prop_assert_eq!(e.runners_up(), expected);
        }
    }
}
