//! The worked examples and the unit-test plan of the preferred-node design
//! (`seeds/metallb-preferred-node-l2-design.txt`), as engine tests.

use super::*;
use crate::election::Reason;

const VIP: &str = "192.168.10.1";

fn pool() -> Pool {
    mk_pool("production-pool", &["192.168.10.0/24"])
}

/// Ad1 {role: lb} → A, B; Ad2 {role: edge} → C, D; Ad3 {role: gpu} → E with a
/// weight-100 preference for zone=primary. C is in zone primary but only Ad3
/// can score zone=primary, and Ad3 does not select C: C scores 0.
#[test]
fn ad_scoped_three_ads() {
    let nodes = vec![
        mk_node("a", &[("role", "lb")]),
        mk_node("b", &[("role", "lb")]),
        mk_node("c", &[("role", "edge"), ("zone", "primary")]),
        mk_node("d", &[("role", "edge")]),
        mk_node("e", &[("role", "gpu"), ("zone", "primary")]),
        mk_node("f", &[("role", "storage"), ("zone", "primary")]),
    ];
    let ads = vec![
        mk_ad("ad1", &["production-pool"]).nodes(&[("role", "lb")]),
        mk_ad("ad2", &["production-pool"]).nodes(&[("role", "edge")]),
        mk_ad("ad3", &["production-pool"])
            .nodes(&[("role", "gpu")])
            .prefer(100, &[("zone", "primary")]),
    ];
    let c = cluster(
        nodes.clone(),
        vec![pool()],
        ads,
        vec![mk_svc("default/web", &[VIP])],
    );
    let r = report(&c, everywhere(&names(&nodes)), VIP);
    let mut want = vec![("e", 100)];
    want.extend(
        hash_sorted(&["a", "b", "c", "d"], VIP)
            .into_iter()
            .map(|n| (n, 0)),
    );
    assert_eq!(order(&r), want);
    assert_eq!(r.winner.as_deref(), Some("e"));
    assert_eq!(
        r.excluded,
        vec![crate::election::Excluded {
            node: "f".into(),
            reason: Reason::NotEligible
        }],
        "the combined eligible set is the OR of the three ads"
    );
}

/// Two ads over the same eligible set both contribute: X = 70 + 30, Y = 70, Z = 0.
#[test]
fn seventy_plus_thirty() {
    let nodes = vec![
        mk_node("x", &[("role", "lb"), ("zone", "primary"), ("gpu", "true")]),
        mk_node("y", &[("role", "lb"), ("zone", "primary")]),
        mk_node("z", &[("role", "lb")]),
    ];
    let ads = vec![
        mk_ad("ad1", &[])
            .nodes(&[("role", "lb")])
            .prefer(70, &[("zone", "primary")]),
        mk_ad("ad2", &[])
            .nodes(&[("role", "lb")])
            .prefer(30, &[("gpu", "true")]),
    ];
    let c = cluster(
        nodes,
        vec![pool()],
        ads,
        vec![mk_svc("default/web", &[VIP])],
    );
    let r = report(&c, everywhere(&["x", "y", "z"]), VIP);
    assert_eq!(order(&r), vec![("x", 100), ("y", 70), ("z", 0)]);
}

/// Weights add within one ad: zone=primary (60) + gpu (50) = 110 beats a
/// single weight-100 selector.
#[test]
fn cumulative_110_beats_100() {
    let nodes = vec![
        mk_node("both", &[("zone", "primary"), ("gpu", "true")]),
        mk_node("gold", &[("tier", "gold")]),
        mk_node("primary", &[("zone", "primary")]),
        mk_node("gpu", &[("gpu", "true")]),
        mk_node("plain", &[]),
    ];
    let ads = vec![
        mk_ad("cumulative-example", &["production-pool"])
            .prefer(60, &[("zone", "primary")])
            .prefer(50, &[("gpu", "true")])
            .prefer(100, &[("tier", "gold")]),
    ];
    let c = cluster(
        nodes,
        vec![pool()],
        ads,
        vec![mk_svc("default/web", &[VIP])],
    );
    let r = report(
        &c,
        everywhere(&["both", "gold", "primary", "gpu", "plain"]),
        VIP,
    );
    assert_eq!(
        order(&r),
        vec![
            ("both", 110),
            ("gold", 100),
            ("primary", 60),
            ("gpu", 50),
            ("plain", 0)
        ]
    );
}

fn tiered() -> (Cluster, Vec<&'static str>) {
    let nodes = vec![
        mk_node("p1", &[("zone", "primary")]),
        mk_node("p2", &[("zone", "primary")]),
        mk_node("s1", &[("zone", "secondary")]),
        mk_node("s2", &[("zone", "secondary")]),
        mk_node("o1", &[]),
        mk_node("o2", &[]),
    ];
    let ads = vec![
        mk_ad("tiered-zones", &["production-pool"])
            .prefer(100, &[("zone", "primary")])
            .prefer(50, &[("zone", "secondary")]),
    ];
    (
        cluster(
            nodes,
            vec![pool()],
            ads,
            vec![mk_svc("default/web", &[VIP])],
        ),
        vec!["p1", "p2", "s1", "s2", "o1", "o2"],
    )
}

/// Primary scores 100, secondary 50, the rest 0; hash order within a tier.
#[test]
fn tiered_zones() {
    let (c, all) = tiered();
    let r = report(&c, everywhere(&all), VIP);
    let mut want: Vec<(&str, u32)> = Vec::new();
    want.extend(
        hash_sorted(&["p1", "p2"], VIP)
            .into_iter()
            .map(|n| (n, 100)),
    );
    want.extend(hash_sorted(&["s1", "s2"], VIP).into_iter().map(|n| (n, 50)));
    want.extend(hash_sorted(&["o1", "o2"], VIP).into_iter().map(|n| (n, 0)));
    assert_eq!(order(&r), want);
}

/// Failover walks down the tiers and back up when preferred nodes return.
#[test]
fn failover_preferred_removed_returns_all_unavailable() {
    let (c, all) = tiered();
    let mut e = Election::new(&c, everywhere(&all));
    let first_primary = hash_sorted(&["p1", "p2"], VIP)[0];
    let other_primary = hash_sorted(&["p1", "p2"], VIP)[1];
    assert_eq!(e.winner(ip(VIP)), Some(first_primary));

    // Preferred node removed: the other primary takes over.
    assert_eq!(e.remove_member(first_primary), vec![ip(VIP)]);
    assert_eq!(e.winner(ip(VIP)), Some(other_primary));
    // All preferred nodes unavailable: the secondary tier, then anything.
    e.remove_member(other_primary);
    assert_eq!(e.winner(ip(VIP)), Some(hash_sorted(&["s1", "s2"], VIP)[0]));
    e.remove_member("s1");
    e.remove_member("s2");
    assert_eq!(e.winner(ip(VIP)), Some(hash_sorted(&["o1", "o2"], VIP)[0]));
    // Preferred node returns: it reclaims the address.
    let back = everywhere(&[first_primary]).pop().unwrap();
    assert_eq!(e.upsert_member(back), vec![ip(VIP)]);
    assert_eq!(e.winner(ip(VIP)), Some(first_primary));
    // A leaving node stops being a candidate before it is gone.
    let mut leaving = everywhere(&[first_primary]).pop().unwrap();
    leaving.leaving = true;
    e.upsert_member(leaving);
    assert_eq!(e.winner(ip(VIP)), Some(hash_sorted(&["o1", "o2"], VIP)[0]));
    assert_eq!(
        e.explain(ip(VIP))
            .unwrap()
            .excluded
            .iter()
            .find(|x| x.node == first_primary)
            .unwrap()
            .reason,
        Reason::Leaving
    );
}

/// Empty preference, no nodeSelectors: every node gets the same bump, so the
/// order is the pure hash order.
#[test]
fn empty_preference_without_node_selectors() {
    let nodes: Vec<NodeInfo> = ["n1", "n2", "n3", "n4", "n5"]
        .iter()
        .map(|n| mk_node(n, &[]))
        .collect();
    let ads = vec![mk_ad("everyone", &[]).prefer(40, &[])];
    let c = cluster(
        nodes,
        vec![pool()],
        ads,
        vec![mk_svc("default/web", &[VIP])],
    );
    let all = ["n1", "n2", "n3", "n4", "n5"];
    let r = report(&c, everywhere(&all), VIP);
    let want: Vec<(&str, u32)> = hash_sorted(&all, VIP)
        .into_iter()
        .map(|n| (n, 40))
        .collect();
    assert_eq!(order(&r), want);
}

/// Empty preference on an ad with nodeSelectors lifts exactly that ad's nodes
/// above the nodes eligible only through another ad.
#[test]
fn empty_preference_with_node_selectors() {
    let nodes = vec![
        mk_node("lb1", &[("role", "lb")]),
        mk_node("lb2", &[("role", "lb")]),
        mk_node("w1", &[]),
        mk_node("w2", &[]),
        mk_node("w3", &[]),
    ];
    let ads = vec![
        mk_ad("lb-only", &[])
            .nodes(&[("role", "lb")])
            .prefer(10, &[]),
        mk_ad("everyone", &[]),
    ];
    let c = cluster(
        nodes,
        vec![pool()],
        ads,
        vec![mk_svc("default/web", &[VIP])],
    );
    let r = report(&c, everywhere(&["lb1", "lb2", "w1", "w2", "w3"]), VIP);
    let mut want: Vec<(&str, u32)> = hash_sorted(&["lb1", "lb2"], VIP)
        .into_iter()
        .map(|n| (n, 10))
        .collect();
    want.extend(
        hash_sorted(&["w1", "w2", "w3"], VIP)
            .into_iter()
            .map(|n| (n, 0)),
    );
    assert_eq!(order(&r), want);
}

/// A service-scoped ad's preferences apply only to the Services it matches.
#[test]
fn service_selectors_scope_preferences() {
    let nodes = vec![
        mk_node("primary", &[("zone", "primary")]),
        mk_node("n2", &[]),
        mk_node("n3", &[]),
        mk_node("n4", &[]),
    ];
    let ads = vec![
        mk_ad("zone-preference-for-frontend", &["shared-pool"])
            .services(&[("app", "frontend")])
            .prefer(100, &[("zone", "primary")]),
        mk_ad("shared", &["shared-pool"]),
    ];
    let mut front = mk_svc("default/frontend", &["10.0.0.1"]);
    front.labels = labels(&[("app", "frontend")]);
    // Pick a backend address whose hash order does not already put
    // `primary` first, so the test can tell scoped from unscoped scoring.
    let all = ["primary", "n2", "n3", "n4"];
    let back_ip = (2..50)
        .map(|i| format!("10.0.0.{i}"))
        .find(|a| hash_sorted(&all, a)[0] != "primary")
        .unwrap();
    let mut back = mk_svc("default/backend", &[back_ip.as_str()]);
    back.labels = labels(&[("app", "backend")]);
    let c = cluster(
        nodes,
        vec![mk_pool("shared-pool", &["10.0.0.0/24"])],
        ads,
        vec![front, back],
    );
    let e = Election::new(&c, everywhere(&all));
    assert_eq!(e.winner(ip("10.0.0.1")), Some("primary"));
    let r = e.explain(ip(&back_ip)).unwrap();
    assert!(r.candidates.iter().all(|c| c.score == 0));
    assert_eq!(r.winner.as_deref(), Some(hash_sorted(&all, &back_ip)[0]));
}

/// Equal weights tie-break by hash; a single selector scores its matches only.
#[test]
fn single_selector_and_equal_weight_tie_break() {
    let nodes = vec![
        mk_node("e1", &[("node-role", "edge")]),
        mk_node("e2", &[("node-role", "edge")]),
        mk_node("w1", &[]),
        mk_node("w2", &[]),
    ];
    let ads = vec![mk_ad("prefer-edge", &[]).prefer(100, &[("node-role", "edge")])];
    let c = cluster(
        nodes,
        vec![pool()],
        ads,
        vec![mk_svc("default/web", &[VIP])],
    );
    let r = report(&c, everywhere(&["e1", "e2", "w1", "w2"]), VIP);
    let mut want: Vec<(&str, u32)> = hash_sorted(&["e1", "e2"], VIP)
        .into_iter()
        .map(|n| (n, 100))
        .collect();
    want.extend(hash_sorted(&["w1", "w2"], VIP).into_iter().map(|n| (n, 0)));
    assert_eq!(order(&r), want);
    // hash_rank is the position by hash alone among all candidates.
    let by_hash = hash_sorted(&["e1", "e2", "w1", "w2"], VIP);
    for cand in &r.candidates {
        assert_eq!(by_hash[cand.hash_rank - 1], cand.node);
    }
}

/// nodeSelectors filter hard; preferences only order within the eligible set,
/// and externalTrafficPolicy: Local keeps only nodes with a usable endpoint.
#[test]
fn required_plus_preferred_and_local_traffic() {
    let nodes = vec![
        mk_node("lb-edge", &[("role", "lb"), ("node-role", "edge")]),
        mk_node("lb1", &[("role", "lb")]),
        mk_node("lb2", &[("role", "lb")]),
        mk_node("edge-only", &[("node-role", "edge")]),
    ];
    let ads = vec![
        mk_ad("prefer-edge", &["production-pool"])
            .nodes(&[("role", "lb")])
            .prefer(100, &[("node-role", "edge")]),
    ];
    let mut svc = mk_svc("default/web", &[VIP]);
    let c = cluster(nodes.clone(), vec![pool()], ads.clone(), vec![svc.clone()]);
    let all = ["lb-edge", "lb1", "lb2", "edge-only"];
    let r = report(&c, everywhere(&all), VIP);
    assert_eq!(r.winner.as_deref(), Some("lb-edge"));
    assert_eq!(r.excluded[0].node, "edge-only");
    assert_eq!(r.excluded[0].reason, Reason::NotEligible);

    svc.local_traffic = true;
    svc.endpoints = Endpoints::on(["lb2", "edge-only"]);
    let c = cluster(nodes, vec![pool()], ads, vec![svc]);
    let r = report(&c, everywhere(&all), VIP);
    assert_eq!(order(&r), vec![("lb2", 0)]);
    let reasons: Vec<(&str, Reason)> = r
        .excluded
        .iter()
        .map(|x| (x.node.as_str(), x.reason))
        .collect();
    assert_eq!(
        reasons,
        vec![
            ("edge-only", Reason::NotEligible),
            ("lb-edge", Reason::NoReadyEndpoint),
            ("lb1", Reason::NoReadyEndpoint)
        ]
    );
}

/// No preferences anywhere: scores are all 0 and the order is the hash order,
/// exactly as before preferences existed.
#[test]
fn backward_compatible_without_preferences() {
    let all: Vec<String> = (0..20).map(|i| format!("node-{i}")).collect();
    let all: Vec<&str> = all.iter().map(String::as_str).collect();
    let nodes: Vec<NodeInfo> = all.iter().map(|n| mk_node(n, &[])).collect();
    let ads = vec![mk_ad("default", &["production-pool"])];
    let vips: Vec<String> = (1..=30).map(|i| format!("192.168.10.{i}")).collect();
    let svcs = vips
        .iter()
        .enumerate()
        .map(|(i, v)| mk_svc(&format!("ns/s{i}"), &[v]))
        .collect();
    let c = cluster(nodes, vec![pool()], ads, svcs);
    let e = Election::new(&c, everywhere(&all));
    for v in &vips {
        let r = e.explain(ip(v)).unwrap();
        let want: Vec<(&str, u32)> = hash_sorted(&all, v).into_iter().map(|n| (n, 0)).collect();
        assert_eq!(order(&r), want, "{v}");
    }
}
