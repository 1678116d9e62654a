//! One test per rule of SPEC §5 beyond the preference examples: exclusions,
//! on-link and virtual mode, interfaces, shared addresses, pool lookup.

use hostlb_api::annotations::EXCLUDE_FROM_EXTERNAL_LB;

use super::*;
use crate::election::{Duty, Excluded, Note, Reason};

fn reasons(r: &VipReport) -> Vec<(&str, Reason)> {
    r.excluded
        .iter()
        .map(|x| (x.node.as_str(), x.reason))
        .collect()
}

fn member(node: &str, prefixes: &[&str]) -> Member {
    Member::alive(node, prefixes.iter().map(|p| p.parse::<Prefix>().unwrap()))
}

#[test]
fn every_exclusion_reason() {
    let mut unavailable = mk_node("unavailable", &[]);
    unavailable.network_unavailable = true;
    let nodes = vec![
        mk_node("ok", &[]),
        mk_node("not-selected", &[("role", "worker")]),
        mk_node("excluded", &[(EXCLUDE_FROM_EXTERNAL_LB, "")]),
        unavailable,
        mk_node("dead", &[]),
        mk_node("leaving", &[]),
        mk_node("elsewhere", &[]),
        mk_node("no-endpoint", &[]),
    ];
    // Eligible: nodes without a `role` label.
    let mut ad = mk_ad("ad", &[]);
    ad.node_selectors = vec![
        hostlb_api::Selector::parse(&hostlb_api::LabelSelector {
            match_labels: None,
            match_expressions: Some(vec![hostlb_api::selector::LabelSelectorRequirement {
                key: "role".into(),
                operator: "DoesNotExist".into(),
                values: None,
            }]),
        })
        .unwrap(),
    ];
    let ads = vec![ad];
    let mut svc = mk_svc("default/web", &["10.0.0.1"]);
    svc.local_traffic = true;
    svc.endpoints = Endpoints::on([
        "ok",
        "not-selected",
        "excluded",
        "unavailable",
        "dead",
        "leaving",
        "elsewhere",
    ]);
    let c = cluster(nodes, vec![mk_pool("p", &["10.0.0.0/24"])], ads, vec![svc]);
    let mut members = vec![
        member("ok", &["10.0.0.0/24"]),
        member("not-selected", &["10.0.0.0/24"]),
        member("excluded", &["10.0.0.0/24"]),
        member("unavailable", &["10.0.0.0/24"]),
        member("leaving", &["10.0.0.0/24"]),
        member("no-endpoint", &["10.0.0.0/24"]),
    ];
    members[4].leaving = true;
    let mut elsewhere = member("elsewhere", &["10.9.0.0/24"]);
    elsewhere.virtual_mode = false;
    members.push(elsewhere);
    let r = report(&c, members, "10.0.0.1");
    assert_eq!(r.winner.as_deref(), Some("ok"));
    assert_eq!(
        reasons(&r),
        vec![
            ("dead", Reason::NotLive),
            ("elsewhere", Reason::NotOnLink),
            ("excluded", Reason::ExcludeLabel),
            ("leaving", Reason::Leaving),
            ("no-endpoint", Reason::NoReadyEndpoint),
            ("not-selected", Reason::NotEligible),
            ("unavailable", Reason::NetworkUnavailable),
        ]
    );
    assert!(r.virtual_nodes.is_empty());
}

/// A node with virtual mode off counts the routed VIPs it cannot serve:
/// those no node is on-link for. A VIP another segment serves on its LAN
/// is not its concern, and with virtual mode on there is nothing to count.
#[test]
fn routed_vips_nobody_serves_are_counted_for_a_node_without_virtual_mode() {
    let nodes = vec![mk_node("rack1-a", &[]), mk_node("rack2-a", &[])];
    let c = cluster(
        nodes,
        vec![mk_pool("p", &["10.1.0.100-10.1.0.200", "10.99.0.0/24"])],
        vec![mk_ad("ad", &[])],
        vec![
            mk_svc("default/a", &["10.1.0.100"]),
            mk_svc("default/b", &["10.99.0.5"]),
        ],
    );
    let mut off = member("rack2-a", &["10.2.0.0/24"]);
    off.virtual_mode = false;
    let e = Election::new(&c, vec![member("rack1-a", &["10.1.0.0/24"]), off.clone()]);
    assert_eq!(
        e.routed_unserved("rack2-a"),
        vec![ip("10.99.0.5")],
        "10.1.0.100 is rack1-a's on its LAN; 10.99.0.5 is on nobody's"
    );
    assert!(e.routed_unserved("rack1-a").is_empty(), "virtual mode on");
    assert!(e.routed_unserved("nobody").is_empty());
    off.virtual_mode = true;
    let e = Election::new(&c, vec![member("rack1-a", &["10.1.0.0/24"]), off]);
    assert!(e.routed_unserved("rack2-a").is_empty());
}

#[test]
fn off_link_nodes_go_virtual_and_never_win() {
    let nodes = vec![
        mk_node("rack1-a", &[]),
        mk_node("rack1-b", &[]),
        mk_node("rack2-a", &[]),
    ];
    let c = cluster(
        nodes,
        vec![mk_pool("p", &["10.1.0.100-10.1.0.200", "10.99.0.0/24"])],
        vec![mk_ad("ad", &[])],
        vec![
            mk_svc("default/a", &["10.1.0.100"]),
            mk_svc("default/b", &["10.99.0.5"]),
        ],
    );
    let members = vec![
        member("rack1-a", &["10.1.0.0/24"]),
        member("rack1-b", &["10.1.0.0/24"]),
        member("rack2-a", &["10.2.0.0/24"]),
    ];
    let e = Election::new(&c, members);
    let r = e.explain(ip("10.1.0.100")).unwrap();
    assert_eq!(r.virtual_nodes, vec!["rack2-a"]);
    assert_eq!(r.candidates.len(), 2);
    assert!(r.excluded.is_empty());
    // An address on nobody's link: no winner, everyone virtual.
    let r = e.explain(ip("10.99.0.5")).unwrap();
    assert_eq!(r.winner, None);
    assert_eq!(r.virtual_nodes, vec!["rack1-a", "rack1-b", "rack2-a"]);
    // The cheap form answers the same.
    for a in ["10.1.0.100", "10.99.0.5"] {
        let r = e.explain(ip(a)).unwrap();
        assert_eq!(e.virtual_nodes(ip(a)), r.virtual_nodes, "{a}");
    }
    assert!(
        e.virtual_nodes(ip("10.1.0.250")).is_empty(),
        "an unknown address"
    );
    assert_eq!(
        e.duties("rack2-a"),
        vec![
            Duty::Virtual {
                ip: ip("10.1.0.100")
            },
            Duty::Virtual {
                ip: ip("10.99.0.5")
            }
        ]
    );
}

#[test]
fn most_specific_on_link_prefix_and_dhcpv6_host_route() {
    let c = cluster(
        vec![mk_node("a", &[])],
        vec![mk_pool("p", &["fd00:1::100-fd00:1::1ff", "10.0.5.0/28"])],
        vec![mk_ad("ad", &[])],
        vec![mk_svc("default/a", &["fd00:1::100", "10.0.5.1"])],
    );
    // A DHCPv6 host has fd00:1::7/128 on the interface and fd00:1::/64 on-link.
    let e = Election::new(
        &c,
        vec![member(
            "a",
            &["fd00:1::7/128", "fd00:1::/64", "10.0.0.0/16", "10.0.5.0/24"],
        )],
    );
    let duties = e.duties("a");
    let prefix_of = |want: &str| {
        duties
            .iter()
            .find_map(|d| match d {
                Duty::Announce { ip: i, on_link } if *i == ip(want) => {
                    Some(on_link.prefix.to_string())
                }
                _ => None,
            })
            .unwrap()
    };
    assert_eq!(prefix_of("fd00:1::100"), "fd00:1::/64");
    assert_eq!(prefix_of("10.0.5.1"), "10.0.5.0/24");
}

#[test]
fn advertisement_interfaces_choose_where_to_announce() {
    let nodes = vec![mk_node("a", &[]), mk_node("b", &[])];
    let c = cluster(
        nodes,
        vec![mk_pool("p", &["10.20.0.0/24"])],
        vec![mk_ad("ad", &[]).clone()]
            .into_iter()
            .map(|mut a| {
                a.interfaces = vec!["eth1".into(), "eth2".into()];
                a
            })
            .collect(),
        vec![mk_svc("default/a", &["10.20.0.1"])],
    );
    let on = |iface: &str, prefix: &str, announce: bool| OnLink {
        prefix: prefix.parse().unwrap(),
        interface: iface.into(),
        announce,
        upstream_lost: false,
    };
    let a = Member {
        node: "a".into(),
        leaving: false,
        drained: false,
        virtual_mode: true,
        // The VIP's subnet is on the default interface only, which the ad
        // does not allow: `a` sits out. It must not go virtual either, or
        // its kernel would answer ARP for the VIP on eth0 beside `b`.
        on_link: vec![on("eth0", "10.20.0.0/24", true)].into(),
    };
    let b = Member {
        node: "b".into(),
        leaving: false,
        drained: false,
        virtual_mode: false,
        on_link: vec![
            on("eth0", "10.0.0.0/24", true),
            on("eth2", "10.20.0.0/24", false),
        ]
        .into(),
    };
    let e = Election::new(&c, vec![a, b]);
    let r = e.explain(ip("10.20.0.1")).unwrap();
    assert_eq!(r.winner.as_deref(), Some("b"));
    assert!(r.virtual_nodes.is_empty());
    assert_eq!(reasons(&r), vec![("a", Reason::InterfaceNotAllowed)]);
    assert_eq!(e.duties("a"), vec![]);
    assert_eq!(
        e.duties("b"),
        vec![Duty::Announce {
            ip: ip("10.20.0.1"),
            on_link: on("eth2", "10.20.0.0/24", false)
        }]
    );
}

#[test]
fn a_prefix_only_on_a_non_announce_interface_excludes_rather_than_goes_virtual() {
    let c = cluster(
        vec![mk_node("a", &[]), mk_node("b", &[]), mk_node("far", &[])],
        vec![mk_pool("p", &["10.20.0.0/24"])],
        vec![mk_ad("ad", &[])],
        vec![mk_svc("default/a", &["10.20.0.1"])],
    );
    let on = |iface: &str, prefix: &str, announce: bool| OnLink {
        prefix: prefix.parse().unwrap(),
        interface: iface.into(),
        announce,
        upstream_lost: false,
    };
    let with = |node: &str, on_link: Vec<OnLink>| Member {
        node: node.into(),
        leaving: false,
        drained: false,
        virtual_mode: true,
        on_link: on_link.into(),
    };
    let members = vec![
        // The VIP's subnet is on a storage NIC, not the announce interface.
        with(
            "a",
            vec![
                on("eth0", "10.0.0.0/24", true),
                on("eth1", "10.20.0.0/16", false),
            ],
        ),
        with("b", vec![on("eth0", "10.20.0.0/24", true)]),
        with("far", vec![on("eth0", "10.9.0.0/24", true)]),
    ];
    let e = Election::new(&c, members);
    let r = e.explain(ip("10.20.0.1")).unwrap();
    assert_eq!(r.winner.as_deref(), Some("b"));
    assert_eq!(reasons(&r), vec![("a", Reason::InterfaceNotAllowed)]);
    // Only a node with the prefix on no interface at all goes virtual.
    assert_eq!(r.virtual_nodes, vec!["far"]);
    assert_eq!(e.duties("a"), vec![]);
    assert_eq!(
        e.duties("far"),
        vec![Duty::Virtual {
            ip: ip("10.20.0.1")
        }]
    );
}

#[test]
fn shared_address_elects_once_with_the_oldest_service_inputs() {
    let nodes = vec![mk_node("a", &[]), mk_node("b", &[]), mk_node("c", &[])];
    let mut old = mk_svc("default/old", &["10.0.0.1"]);
    old.created = Some(100);
    old.local_traffic = true;
    old.endpoints = Endpoints::on(["c"]);
    let mut new = mk_svc("default/new", &["10.0.0.1"]);
    new.created = Some(200);
    new.local_traffic = true;
    new.endpoints = Endpoints::on(["a"]);
    let c = cluster(
        nodes,
        vec![mk_pool("p", &["10.0.0.0/24"])],
        vec![mk_ad("ad", &[])],
        vec![new, old],
    );
    let r = report(&c, everywhere(&["a", "b", "c"]), "10.0.0.1");
    assert_eq!(r.services, vec!["default/old", "default/new"]);
    assert_eq!(r.winner.as_deref(), Some("c"));
}

#[test]
fn pool_lookup_annotation_then_oldest_containing_pool() {
    let nodes = vec![
        mk_node("a", &[("role", "one")]),
        mk_node("b", &[("role", "two")]),
    ];
    let mut older = mk_pool("older", &["10.0.0.0/24"]);
    older.created = Some(1);
    let mut newer = mk_pool("newer", &["10.0.0.0/25"]);
    newer.created = Some(2);
    let ads = vec![
        mk_ad("for-older", &["older"]).nodes(&[("role", "one")]),
        mk_ad("for-newer", &["newer"]).nodes(&[("role", "two")]),
    ];
    let plain = mk_svc("default/plain", &["10.0.0.1"]);
    let mut annotated = mk_svc("default/annotated", &["10.0.0.2"]);
    annotated.allocated_pool = Some("newer".into());
    let mut unknown = mk_svc("default/unknown-pool", &["10.0.0.3"]);
    unknown.allocated_pool = Some("gone".into());
    // "newer" was edited and no longer holds .200: the annotation is stale
    // and the allocator (`hostlb_api::rules::pool_holding`) counts the
    // address as "older"'s, so must the agent.
    let mut stale = mk_svc("default/stale", &["10.0.0.200"]);
    stale.allocated_pool = Some("newer".into());
    let c = cluster(
        nodes,
        vec![newer, older],
        ads,
        vec![plain, annotated, unknown, stale],
    );
    let e = Election::new(&c, everywhere(&["a", "b"]));
    assert_eq!(
        e.explain(ip("10.0.0.1")).unwrap().pool.as_deref(),
        Some("older")
    );
    assert_eq!(e.winner(ip("10.0.0.1")), Some("a"));
    assert_eq!(
        e.explain(ip("10.0.0.2")).unwrap().pool.as_deref(),
        Some("newer")
    );
    assert_eq!(e.winner(ip("10.0.0.2")), Some("b"));
    assert_eq!(
        e.explain(ip("10.0.0.3")).unwrap().pool.as_deref(),
        Some("older")
    );
    assert_eq!(
        e.explain(ip("10.0.0.200")).unwrap().pool.as_deref(),
        Some("older")
    );
    assert_eq!(e.winner(ip("10.0.0.200")), Some("a"));
}

#[test]
fn pool_selection_by_name_label_or_all_and_service_scoping() {
    let nodes = vec![mk_node("a", &[])];
    let mut labelled = mk_pool("labelled", &["10.0.1.0/24"]);
    labelled.labels = labels(&[("tier", "gold")]);
    let pools = vec![
        mk_pool("named", &["10.0.0.0/24"]),
        labelled,
        mk_pool("other", &["10.0.2.0/24"]),
    ];
    let mut by_label = mk_ad("by-label", &[]);
    by_label.pool_selectors = vec![sel(&[("tier", "gold")])];
    let mut matches_nothing = mk_ad("matches-nothing", &[]);
    matches_nothing.pool_selectors = vec![sel(&[("tier", "none")])];
    let ads = vec![mk_ad("by-name", &["named"]), by_label, matches_nothing];
    let svcs = vec![
        mk_svc("d/a", &["10.0.0.1"]),
        mk_svc("d/b", &["10.0.1.1"]),
        mk_svc("d/c", &["10.0.2.1"]),
        mk_svc("d/d", &["10.0.3.1"]),
    ];
    let c = cluster(nodes, pools, ads, svcs);
    let e = Election::new(&c, everywhere(&["a"]));
    assert_eq!(e.winner(ip("10.0.0.1")), Some("a"));
    assert_eq!(e.winner(ip("10.0.1.1")), Some("a"));
    let r = e.explain(ip("10.0.2.1")).unwrap();
    assert_eq!(r.winner, None);
    assert_eq!(
        r.note,
        Some(Note::NoAdvertisement {
            pool: "other".into()
        })
    );
    assert_eq!(reasons(&r), vec![("a", Reason::NotEligible)]);
    assert_eq!(e.explain(ip("10.0.3.1")).unwrap().note, Some(Note::NoPool));

    // An ad with neither pools nor selectors selects every pool.
    let c2 = cluster(
        c.nodes.clone(),
        c.pools.clone(),
        vec![mk_ad("all", &[])],
        c.services.clone(),
    );
    let e2 = Election::new(&c2, everywhere(&["a"]));
    assert!(
        e2.winners()
            .all(|(ip_, w)| w == Some("a") || ip_ == ip("10.0.3.1"))
    );

    // serviceSelectors that match no Service leave the address unannounced.
    let c3 = cluster(
        c.nodes.clone(),
        c.pools.clone(),
        vec![mk_ad("frontend-only", &[]).services(&[("app", "frontend")])],
        c.services.clone(),
    );
    let e3 = Election::new(&c3, everywhere(&["a"]));
    assert_eq!(e3.winner(ip("10.0.0.1")), None);
}

#[test]
fn no_usable_endpoint_anywhere_means_no_announcement() {
    let mut svc = mk_svc("default/web", &["10.0.0.1"]);
    svc.endpoints = Endpoints::default();
    let c = cluster(
        vec![mk_node("a", &[]), mk_node("b", &[])],
        vec![mk_pool("p", &["10.0.0.0/24"])],
        vec![mk_ad("ad", &[])],
        vec![svc],
    );
    let e = Election::new(
        &c,
        vec![member("a", &["10.0.0.0/24"]), member("b", &["10.9.0.0/24"])],
    );
    let r = e.explain(ip("10.0.0.1")).unwrap();
    assert_eq!(r.winner, None);
    assert_eq!(r.note, Some(Note::NoEndpoints));
    assert!(r.virtual_nodes.is_empty(), "no endpoints: not even virtual");
    assert_eq!(
        reasons(&r),
        vec![
            ("a", Reason::NoReadyEndpoint),
            ("b", Reason::NoReadyEndpoint)
        ]
    );
    assert!(e.duties("a").is_empty() && e.duties("b").is_empty());
}

#[test]
fn dual_stack_addresses_elect_separately() {
    let all: Vec<String> = (0..16).map(|i| format!("n{i}")).collect();
    let all: Vec<&str> = all.iter().map(String::as_str).collect();
    let c = cluster(
        all.iter().map(|n| mk_node(n, &[])).collect(),
        vec![mk_pool("p", &["10.0.0.0/24", "fd00::/120"])],
        vec![mk_ad("ad", &[])],
        vec![mk_svc("default/dual", &["10.0.0.7", "fd00::7"])],
    );
    let e = Election::new(&c, everywhere(&all));
    assert_eq!(
        e.winner(ip("10.0.0.7")),
        Some(hash_sorted(&all, "10.0.0.7")[0])
    );
    assert_eq!(
        e.winner(ip("fd00::7")),
        Some(hash_sorted(&all, "fd00::7")[0])
    );
    assert_ne!(
        hash_sorted(&all, "10.0.0.7")[0],
        hash_sorted(&all, "fd00::7")[0]
    );
}

#[test]
fn members_without_node_objects_never_win_and_are_not_listed() {
    let c = cluster(
        vec![mk_node("a", &[])],
        vec![mk_pool("p", &["10.0.0.0/24"])],
        vec![mk_ad("ad", &[])],
        vec![mk_svc("default/web", &["10.0.0.1"])],
    );
    let mut members = everywhere(&["a", "stranger"]);
    members.reverse();
    let r = report(&c, members, "10.0.0.1");
    assert_eq!(r.winner.as_deref(), Some("a"));
    assert_eq!(r.candidates.len(), 1);
    assert!(r.excluded.is_empty());
    let none: Vec<Excluded> = Vec::new();
    assert_eq!(r.excluded, none);
}

#[test]
fn set_cluster_reports_exactly_the_moved_addresses() {
    let all = ["a", "b", "c"];
    let mut c = cluster(
        all.iter().map(|n| mk_node(n, &[])).collect(),
        vec![mk_pool("p", &["10.0.0.0/24"])],
        vec![mk_ad("ad", &[])],
        (1..=20)
            .map(|i| mk_svc(&format!("d/s{i}"), &[&format!("10.0.0.{i}")]))
            .collect(),
    );
    let mut e = Election::new(&c, everywhere(&all));
    assert!(e.set_cluster(&c).is_empty(), "same cluster, nothing moves");
    // Excluding node a moves exactly the addresses a held.
    let held: Vec<IpAddr> = e
        .winners()
        .filter(|(_, w)| *w == Some("a"))
        .map(|(i, _)| i)
        .collect();
    assert!(!held.is_empty());
    c.nodes[0]
        .labels
        .insert(EXCLUDE_FROM_EXTERNAL_LB.into(), "true".into());
    assert_eq!(e.set_cluster(&c), held);
    // Removing a Service reports its address as changed.
    c.services.pop();
    assert_eq!(e.set_cluster(&c), vec![ip("10.0.0.20")]);
}

#[test]
fn a_node_added_after_the_first_election_can_win() {
    // Pick an address where `b` sorts after `a`, so `b` lands at the end of
    // the cached (complete) order.
    let vip = (1..100)
        .map(|i| format!("10.0.0.{i}"))
        .find(|v| hash_sorted(&["a", "b"], v) == ["a", "b"])
        .unwrap();
    let svc = vec![mk_svc("default/web", &[vip.as_str()])];
    let pools = vec![mk_pool("p", &["10.0.0.0/24"])];
    let c1 = cluster(
        vec![mk_node("a", &[])],
        pools.clone(),
        vec![mk_ad("ad", &[])],
        svc.clone(),
    );
    // Walk the order for every tier so the cached order is used.
    let mut e = Election::tuned(&c1, everywhere(&["a"]), 0, 32);
    assert_eq!(e.winner(ip(&vip)), Some("a"));
    let c2 = cluster(
        vec![mk_node("a", &[]), mk_node("b", &[])],
        pools,
        vec![mk_ad("ad", &[])],
        svc,
    );
    e.set_cluster(&c2);
    e.upsert_member(everywhere(&["b"]).pop().unwrap());
    e.remove_member("a");
    assert_eq!(e.winner(ip(&vip)), Some("b"));
}

#[test]
fn set_members_equals_a_fresh_engine_and_reports_moves() {
    let nodes = vec![mk_node("a", &[]), mk_node("b", &[]), mk_node("c", &[])];
    let svcs = (1..=20)
        .map(|i| mk_svc(&format!("default/s{i}"), &[&format!("10.0.0.{i}")]))
        .collect();
    let c = cluster(
        nodes,
        vec![mk_pool("p", &["10.0.0.0/24"])],
        vec![mk_ad("ad", &[])],
        svcs,
    );
    let all = everywhere(&["a", "b", "c"]);
    let mut e = Election::new(&c, all.clone());
    let before: Vec<(IpAddr, Option<String>)> = e
        .winners()
        .map(|(i, w)| (i, w.map(str::to_string)))
        .collect();
    // "b" fails, "c" starts leaving.
    let mut view: Vec<Member> = all.iter().filter(|m| m.node != "b").cloned().collect();
    view.iter_mut().find(|m| m.node == "c").unwrap().leaving = true;
    let moved = e.set_members(&view);
    let fresh = Election::new(&c, view.clone());
    let after: Vec<(IpAddr, Option<String>)> = e
        .winners()
        .map(|(i, w)| (i, w.map(str::to_string)))
        .collect();
    let want: Vec<(IpAddr, Option<String>)> = fresh
        .winners()
        .map(|(i, w)| (i, w.map(str::to_string)))
        .collect();
    assert_eq!(after, want);
    let expect_moved: Vec<IpAddr> = before
        .iter()
        .zip(&after)
        .filter(|(x, y)| x.1 != y.1)
        .map(|(x, _)| x.0)
        .collect();
    assert!(!expect_moved.is_empty());
    assert_eq!(moved, expect_moved);
    assert!(after.iter().all(|(_, w)| w.as_deref() == Some("a")));
    // The same view again changes nothing.
    assert!(e.set_members(&view).is_empty());
}

#[test]
fn outranks_ignores_liveness_and_agrees_from_both_sides() {
    let nodes = vec![
        mk_node("a", &[("tier", "edge")]),
        mk_node("b", &[]),
        mk_node("c", &[("role", "x")]),
    ];
    let ad = mk_ad("ad", &[])
        .nodes(&[("kubernetes.io/os", "linux")])
        .prefer(10, &[("tier", "edge")]);
    let mut nodes = nodes;
    for n in nodes.iter_mut().take(2) {
        n.labels.insert("kubernetes.io/os".into(), "linux".into());
    }
    let c = cluster(
        nodes,
        vec![mk_pool("p", &["10.0.0.0/24"])],
        vec![ad],
        vec![mk_svc("d/s", &["10.0.0.1"])],
    );
    // Only "b" is live: "a" still outranks it, by its preference.
    let e = Election::new(&c, everywhere(&["b"]));
    let vip = ip("10.0.0.1");
    assert_eq!(e.winner(vip), Some("b"));
    assert_eq!(e.outranks(vip, "a", "b", false), Some(true));
    assert_eq!(e.outranks(vip, "b", "a", false), Some(false));
    // "c" is not eligible: anyone eligible outranks it.
    assert_eq!(e.outranks(vip, "b", "c", false), Some(true));
    assert_eq!(e.outranks(vip, "c", "b", false), Some(false));
    assert_eq!(e.outranks(ip("10.9.9.9"), "a", "b", false), None);
}

/// A drained node leaves a routed VIP to the nodes that route it too, and
/// keeps routing it while it is the only one; on a LAN it is the last
/// candidate. `explain` says why it is out.
#[test]
fn a_drained_node_routes_a_vip_only_while_no_other_node_does() {
    let nodes = vec![mk_node("a", &[]), mk_node("b", &[]), mk_node("c", &[])];
    let c = cluster(
        nodes,
        vec![mk_pool("p", &["10.1.0.100-10.1.0.200", "10.99.0.0/24"])],
        vec![mk_ad("ad", &[])],
        vec![
            mk_svc("default/lan", &["10.1.0.100"]),
            mk_svc("default/routed", &["10.99.0.5"]),
        ],
    );
    let drained = |m: Member| Member { drained: true, ..m };
    let routed = ip("10.99.0.5");
    let lan = ip("10.1.0.100");
    let members = vec![
        drained(member("a", &["10.1.0.0/24"])),
        member("b", &["10.1.0.0/24"]),
        member("c", &["10.2.0.0/24"]),
    ];
    let e = Election::new(&c, members);
    assert_eq!(
        e.virtual_nodes(routed),
        vec!["b", "c"],
        "a leaves it to b and c"
    );
    assert_eq!(e.duty("a", routed), None);
    let r = e.explain(routed).unwrap();
    assert_eq!(r.virtual_nodes, vec!["b", "c"]);
    assert_eq!(
        r.excluded
            .iter()
            .map(|x| (x.node.as_str(), x.reason))
            .collect::<Vec<_>>(),
        vec![("a", Reason::Drained)]
    );
    assert_eq!(e.winner(lan), Some("b"));
    let r = e.explain(lan).unwrap();
    assert_eq!(
        r.candidates
            .iter()
            .map(|c| (c.node.as_str(), c.drained))
            .collect::<Vec<_>>(),
        vec![("b", false), ("a", true)],
        "the drained candidate last"
    );
    // With liveness ignored too, as a node taking over from a silent owner
    // and two owners across a partition judge it: a drained node ranks
    // last, and still once gossip has lost it.
    // Among nodes that hear each other, as the election ranks; a drain is
    // not counted across a partition, where one side may not know of it.
    let mut e = e;
    assert_eq!(e.outranks(lan, "a", "b", true), Some(false));
    assert_eq!(e.outranks(lan, "b", "a", true), Some(true));
    e.remove_member("a");
    assert_eq!(
        e.outranks(lan, "a", "b", true),
        Some(false),
        "a drain as last seen"
    );
    assert_eq!(e.outranks(lan, "b", "a", true), Some(true));
    assert_eq!(
        e.outranks(lan, "a", "b", false),
        e.outranks(lan, "b", "a", false).map(|b| !b),
        "across a partition: by the cluster objects alone, and both agree"
    );

    // Everyone drained: every node routes it, the LAN one is a's or b's
    // by the hash as before.
    let all = vec![
        drained(member("a", &["10.1.0.0/24"])),
        drained(member("b", &["10.1.0.0/24"])),
        drained(member("c", &["10.2.0.0/24"])),
    ];
    let e = Election::new(&c, all);
    assert_eq!(e.virtual_nodes(routed), vec!["a", "b", "c"]);
    assert!(e.winner(lan).is_some());
    // Only a can route it (b runs no virtual mode): a keeps it.
    let e = Election::new(
        &c,
        vec![
            drained(member("a", &["10.1.0.0/24"])),
            Member {
                virtual_mode: false,
                ..member("b", &["10.1.0.0/24"])
            },
        ],
    );
    assert_eq!(e.virtual_nodes(routed), vec!["a"]);
    assert_eq!(e.duty("a", routed), Some(Duty::Virtual { ip: routed }));
}

/// A node whose gateway is lost on the interface it would hold a VIP on
/// ranks last for it, whatever its preference: other networks and the
/// other family are untouched, and when every candidate has lost its
/// gateway the usual order stands, so nothing moves. Nodes that hear each
/// other rank by it; across a partition it is not counted.
#[test]
fn a_lost_gateway_makes_a_node_the_last_resort_on_that_network_only() {
    let nodes = vec![mk_node("a", &[("pref", "a")]), mk_node("b", &[])];
    let c = cluster(
        nodes,
        vec![mk_pool("p", &["10.1.0.0/24", "fd00:1::/64", "10.2.0.0/24"])],
        vec![mk_ad("ad", &[]).prefer(100, &[("pref", "a")])],
        vec![mk_svc(
            "default/web",
            &["10.1.0.10", "fd00:1::10", "10.2.0.10"],
        )],
    );
    let (v4, v6, other) = (ip("10.1.0.10"), ip("fd00:1::10"), ip("10.2.0.10"));
    let on = |node: &str, lost: &[&str]| {
        let mut m = member(node, &["10.1.0.0/24", "fd00:1::/64", "10.2.0.0/24"]);
        m.on_link = m
            .on_link
            .iter()
            .map(|o| OnLink {
                upstream_lost: lost.contains(&o.prefix.to_string().as_str()),
                ..o.clone()
            })
            .collect();
        m
    };
    let e = Election::new(&c, vec![on("a", &[]), on("b", &[])]);
    for vip in [v4, v6, other] {
        assert_eq!(e.winner(vip), Some("a"), "preferred");
    }
    let e = Election::new(&c, vec![on("a", &["10.1.0.0/24"]), on("b", &[])]);
    assert_eq!(e.winner(v4), Some("b"), "a's gateway there is lost");
    assert_eq!(e.winner(v6), Some("a"), "the other family is not");
    assert_eq!(e.winner(other), Some("a"), "nor another network");
    assert!(e.upstream_lost(v4, "a") && !e.upstream_lost(v6, "a"));
    let r = e.explain(v4).unwrap();
    assert_eq!(
        r.candidates
            .iter()
            .map(|c| (c.node.as_str(), c.upstream_lost, c.drained))
            .collect::<Vec<_>>(),
        vec![("b", false, false), ("a", true, false)]
    );
    assert_eq!(e.outranks(v4, "b", "a", true), Some(true));
    assert_eq!(
        e.outranks(v4, "a", "b", false),
        Some(true),
        "across a partition, by the cluster objects alone"
    );
    // Both lost: the usual order, nothing moves.
    let e = Election::new(
        &c,
        vec![on("a", &["10.1.0.0/24"]), on("b", &["10.1.0.0/24"])],
    );
    assert_eq!(e.winner(v4), Some("a"));
}

/// A cordoned node is drained only for the addresses of an advertisement
/// that counts cordons: passed over while another node can serve them,
/// still the winner where none can, and untouched for the addresses of
/// any other advertisement. Both sides of a partition rank by it.
#[test]
fn a_cordon_drains_only_where_an_advertisement_says_so() {
    let nodes = |cordoned: &str| -> Vec<NodeInfo> {
        ["a", "b"]
            .iter()
            .map(|n| {
                let mut node = mk_node(n, &[("pref", n)]);
                node.cordoned = *n == cordoned;
                node
            })
            .collect()
    };
    // `counts` counts cordons; `ignores` does not. Both prefer node a.
    let prefer_a = || Preference {
        weight: 100,
        selector: sel(&[("pref", "a")]),
    };
    let mut counts = mk_ad("counts", &[]);
    counts.pools = vec!["counted".into()];
    counts.preferences = vec![prefer_a()];
    counts.drain_cordoned = true;
    let mut ignores = mk_ad("ignores", &[]);
    ignores.pools = vec!["plain".into()];
    ignores.preferences = vec![prefer_a()];
    let pools = vec![
        mk_pool("counted", &["10.0.0.0/25"]),
        mk_pool("plain", &["10.0.0.128/25"]),
    ];
    let svcs = vec![
        mk_svc("default/counted", &["10.0.0.1"]),
        mk_svc("default/plain", &["10.0.0.129"]),
    ];
    let members = vec![member("a", &["10.0.0.0/24"]), member("b", &["10.0.0.0/24"])];
    let elect = |cordoned: &str, members: Vec<Member>| {
        let c = cluster(
            nodes(cordoned),
            pools.clone(),
            vec![counts.clone(), ignores.clone()],
            svcs.clone(),
        );
        Election::new(&c, members)
    };
    let counted = ip("10.0.0.1");
    let plain = ip("10.0.0.129");

    let e = elect("", members.clone());
    assert_eq!(e.winner(counted), Some("a"));
    assert_eq!(e.winner(plain), Some("a"));

    let e = elect("a", members.clone());
    assert_eq!(e.winner(counted), Some("b"), "cordoned a is passed over");
    assert_eq!(e.winner(plain), Some("a"), "a cordon is not a drain here");
    assert_eq!(e.outranks(counted, "b", "a", false), Some(true));
    assert_eq!(e.outranks(plain, "a", "b", false), Some(true));
    let report = e
        .report_all()
        .into_iter()
        .find(|r| r.ip == counted)
        .unwrap();
    assert!(
        report.candidates.iter().any(|c| c.node == "a" && c.drained),
        "{report:?}"
    );

    // Alone, the cordoned node still serves: nothing is stranded.
    let e = elect("a", vec![member("a", &["10.0.0.0/24"])]);
    assert_eq!(e.winner(counted), Some("a"));
}

/// A sticky address stays with the member that holds it while that member
/// is a candidate, whatever the preferences say; it goes to the usual
/// winner when its holder is gone, drained, or no longer eligible, and
/// when its Service asks to be rebalanced. Of two holders (a partition
/// healed), the usual order keeps one. Addresses of an advertisement that
/// is not sticky ignore holders.
#[test]
fn a_sticky_address_stays_with_its_holder_while_it_is_a_candidate() {
    let nodes = vec![
        mk_node("a", &[("pref", "a"), ("zone", "x")]),
        mk_node("b", &[("zone", "x")]),
        mk_node("c", &[("zone", "y")]),
    ];
    let prefer_a = Preference {
        weight: 100,
        selector: sel(&[("pref", "a")]),
    };
    let mut sticky = mk_ad("sticky", &[]);
    sticky.pools = vec!["sticky".into()];
    sticky.preferences = vec![prefer_a.clone()];
    sticky.sticky = true;
    let mut plain = mk_ad("plain", &[]);
    plain.pools = vec!["plain".into()];
    plain.preferences = vec![prefer_a];
    let pools = vec![
        mk_pool("sticky", &["10.0.0.0/25"]),
        mk_pool("plain", &["10.0.0.128/25"]),
    ];
    let svcs = vec![
        mk_svc("default/sticky", &["10.0.0.1"]),
        mk_svc("default/plain", &["10.0.0.129"]),
    ];
    let all = || {
        vec![
            member("a", &["10.0.0.0/24"]),
            member("b", &["10.0.0.0/24"]),
            member("c", &["10.0.0.0/24"]),
        ]
    };
    let c = cluster(
        nodes.clone(),
        pools.clone(),
        vec![sticky.clone(), plain.clone()],
        svcs.clone(),
    );
    let (s, p) = (ip("10.0.0.1"), ip("10.0.0.129"));
    let mut e = Election::new(&c, all());
    assert_eq!(e.winner(s), Some("a"), "held by nobody: elected as usual");
    assert_eq!(
        e.set_holders([(s, "b"), (p, "b")]),
        vec![s],
        "only the sticky one moves"
    );
    assert_eq!(
        e.winner(s),
        Some("b"),
        "a preferred node does not take it back"
    );
    assert_eq!(e.winner(p), Some("a"), "not sticky: holders do not count");
    // On the wire: a node asking before it takes the VIP defers to the
    // one answering for it, of a sticky VIP even if it outranks it by
    // preference; the contest of two holders is by the usual order.
    assert_eq!(e.outranks(s, "a", "b", false), Some(true));
    assert_eq!(e.outranks_holding(s, "b", "a", false), Some(true));
    assert_eq!(e.outranks_holding(p, "b", "a", false), Some(false));
    assert_eq!(e.winner_without(s, |n| n == "c"), Some("b"));
    assert_eq!(
        e.winner_without(s, |n| n == "b"),
        Some("a"),
        "next in line as usual"
    );
    let mut runners = e.runners_up();
    assert_eq!(runners.remove("b"), Some(vec![(s, "a".into())]));
    assert!(matches!(e.duty("b", s), Some(Duty::Announce { .. })));
    assert_eq!(e.duty("a", s), None);
    // Two holders: the usual order among them.
    assert_eq!(e.set_holders([(s, "b"), (s, "a")]), vec![s]);
    assert_eq!(e.winner(s), Some("a"));
    assert_eq!(e.set_holders([(s, "c"), (s, "b")]), vec![s]);
    let bc = e.winner(s);
    assert!(bc == Some("b") || bc == Some("c"));
    // The holder gone from the membership: elected as usual among the rest.
    e.set_holders([(s, "b")]);
    e.remove_member("b");
    assert_eq!(e.winner(s), Some("a"));
    e.upsert_member(member("b", &["10.0.0.0/24"]));
    assert_eq!(e.winner(s), Some("b"), "back, and still shown holding it");
    // Drained: passed over while another can serve it.
    let mut drained = member("b", &["10.0.0.0/24"]);
    drained.drained = true;
    e.upsert_member(drained);
    assert_eq!(e.winner(s), Some("a"));
    e.upsert_member(member("b", &["10.0.0.0/24"]));
    assert_eq!(e.winner(s), Some("b"));
    // No longer eligible: only zone y may announce.
    let mut zone_y = sticky.clone();
    zone_y.node_selectors = vec![sel(&[("zone", "y")])];
    let moved = e.set_cluster(&cluster(
        nodes.clone(),
        pools.clone(),
        vec![zone_y, plain.clone()],
        svcs.clone(),
    ));
    assert!(moved.contains(&s));
    assert_eq!(e.winner(s), Some("c"));
    // Eligible again: the holder kept across cluster views counts again.
    e.set_cluster(&c);
    assert_eq!(e.winner(s), Some("b"));
    // Rebalance asked on the Service: placed as preferred.
    let mut asked = svcs.clone();
    asked[0].rebalance = true;
    e.set_cluster(&cluster(
        nodes.clone(),
        pools.clone(),
        vec![sticky.clone(), plain.clone()],
        asked,
    ));
    assert_eq!(e.winner(s), Some("a"), "rebalanced to the preferred node");
    e.set_holders([(s, "a")]);
    e.set_cluster(&c);
    assert_eq!(e.winner(s), Some("a"), "and stays there once it holds it");
}
