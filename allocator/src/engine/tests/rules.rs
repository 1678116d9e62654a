//! One table of cases per rule of SPEC §4.

use super::*;

#[test]
fn lowest_free_first_in_the_order_written() {
    let mut a = with_pools(&[pool(
        "p",
        1,
        &["10.0.1.0/31", "10.0.0.5-10.0.0.6", "10.0.0.1"],
    )]);
    let got: Vec<Result<Vec<String>, String>> = (0..6)
        .map(|i| alloc(&mut a, &svc(&format!("s{i}"), i)))
        .collect();
    assert_eq!(
        got,
        vec![
            Ok(vec!["10.0.1.0".to_string()]),
            Ok(vec!["10.0.1.1".to_string()]),
            Ok(vec!["10.0.0.5".to_string()]),
            Ok(vec!["10.0.0.6".to_string()]),
            Ok(vec!["10.0.0.1".to_string()]),
            Err("no available addresses in pool p".to_string()),
        ]
    );
    // Releasing frees the address for the next Service, lowest first.
    a.release("default/s1");
    a.release("default/s3");
    assert_eq!(alloc(&mut a, &svc("t", 10)), Ok(vec!["10.0.1.1".into()]));
    assert_eq!(alloc(&mut a, &svc("u", 11)), Ok(vec!["10.0.0.6".into()]));
}

#[test]
fn avoid_buggy_ips_skips_dot_zero_and_dot_255() {
    let mut p = pool("p", 1, &["10.0.0.254-10.0.1.1"]);
    p.avoid_buggy_ips = true;
    let mut a = with_pools(&[p]);
    let got: Vec<_> = (0..3)
        .map(|i| alloc(&mut a, &svc(&format!("s{i}"), i)))
        .collect();
    assert_eq!(got[0], Ok(vec!["10.0.0.254".into()]));
    assert_eq!(got[1], Ok(vec!["10.0.1.1".into()]));
    assert_eq!(got[2], Err("no available addresses in pool p".into()));
    // Asking for a buggy address in such a pool is refused with the reason.
    assert_eq!(
        alloc(&mut a, &svc("x", 9).request(&["10.0.0.255"])),
        Err("10.0.0.255 ends in .0 or .255 and pool p has avoidBuggyIPs".into())
    );
}

#[test]
fn families_from_the_policy() {
    let pools = [
        pool("dual", 1, &["10.0.0.0/30", "fd00::/126"]),
        pool("v4only", 2, &["10.9.0.0/30"]),
    ];
    let mut a = with_pools(&pools);
    let cases: Vec<(ServiceRequest, Result<Vec<&str>, &str>)> = vec![
        (svc("v4", 1), Ok(vec!["10.0.0.0"])),
        (svc("v6", 2).v6(), Ok(vec!["fd00::"])),
        (
            svc("prefer", 3).policy(FamilyPolicy::PreferDualStack),
            Ok(vec!["10.0.0.1", "fd00::1"]),
        ),
        (
            svc("prefer6", 4).v6().policy(FamilyPolicy::PreferDualStack),
            Ok(vec!["fd00::2", "10.0.0.2"]),
        ),
        (
            svc("require", 5).policy(FamilyPolicy::RequireDualStack),
            Ok(vec!["10.0.0.3", "fd00::3"]),
        ),
        (
            svc("require-more", 6).policy(FamilyPolicy::RequireDualStack),
            Err("no available addresses in pools dual, v4only"),
        ),
        (
            svc("require-v4only", 7)
                .policy(FamilyPolicy::RequireDualStack)
                .in_pool("v4only"),
            Err("pool v4only has no IPv6 addresses (RequireDualStack needs one)"),
        ),
        (
            svc("prefer-v4only", 8)
                .policy(FamilyPolicy::PreferDualStack)
                .in_pool("v4only"),
            Ok(vec!["10.9.0.0"]),
        ),
        (
            svc("v6-from-v4only", 9).v6().in_pool("v4only"),
            Err("pool v4only has no IPv6 addresses (SingleStack needs one)"),
        ),
    ];
    for (s, want) in cases {
        let want = want
            .map(|v| v.iter().map(|x| x.to_string()).collect::<Vec<_>>())
            .map_err(str::to_string);
        assert_eq!(alloc(&mut a, &s), want, "{}", s.key);
    }
}

#[test]
fn requested_addresses() {
    let mut manual = pool("manual", 2, &["10.0.5.0/24"]);
    manual.auto_assign = false;
    let mut a = with_pools(&[pool("auto", 1, &["10.0.0.0/24", "fd00::/120"]), manual]);
    // Given even from a pool without autoAssign.
    assert_eq!(
        alloc(&mut a, &svc("a", 1).request(&["10.0.5.7"])),
        Ok(vec!["10.0.5.7".into()])
    );
    assert_eq!(a.allocation("default/a").unwrap().pool, "manual");
    // Taken by an older Service without sharing.
    assert_eq!(
        alloc(&mut a, &svc("b", 2).request(&["10.0.5.7"])),
        Err("10.0.5.7 is in use by default/a: it does not allow sharing (no hostlb.io/allow-shared-ip)".into())
    );
    assert_eq!(
        alloc(&mut a, &svc("c", 3).request(&["192.168.0.1"])),
        Err("requested address 192.168.0.1 is not in any IPAddressPool".into())
    );
    assert_eq!(
        alloc(
            &mut a,
            &svc("d", 4)
                .request(&["10.0.0.9", "10.0.5.9"])
                .policy(FamilyPolicy::PreferDualStack)
        ),
        Err("requested addresses 10.0.0.9 and 10.0.5.9 are in different pools".into())
    );
    assert_eq!(
        alloc(&mut a, &svc("e", 5).request(&["fd00::9"])),
        Err("the Service is IPv4 SingleStack, but fd00::9 is IPv6".into())
    );
    assert_eq!(
        alloc(
            &mut a,
            &svc("f", 6)
                .request(&["fd00::9", "10.0.0.9"])
                .policy(FamilyPolicy::RequireDualStack)
        ),
        Ok(vec!["10.0.0.9".into(), "fd00::9".into()]),
        "primary family first"
    );
    assert_eq!(
        alloc(
            &mut a,
            &svc("g", 7).request(&["10.0.0.10"]).in_pool("manual")
        ),
        Err("requested address 10.0.0.10 is in pool auto, not in the requested pool manual".into())
    );
    let mut bad = svc("h", 8);
    bad.request_error = Some("hostlb.io/loadBalancerIPs: \"10.0.0.x\" is not an IP address".into());
    assert_eq!(
        alloc(&mut a, &bad),
        Err("hostlb.io/loadBalancerIPs: \"10.0.0.x\" is not an IP address".into())
    );
    // Changing the request moves the Service to the new address.
    let moved = svc("a", 1)
        .request(&["10.0.5.8"])
        .holding(&["10.0.5.7"], "manual");
    assert_eq!(alloc(&mut a, &moved), Ok(vec!["10.0.5.8".into()]));
    assert!(a.holders_of(ip("10.0.5.7")).is_empty());
}

#[test]
fn requested_pool() {
    let mut manual = pool("manual", 2, &["10.0.5.0/30"]);
    manual.auto_assign = false;
    let mut broken = pool("broken", 3, &["10.0.6.0/30", "nonsense"]);
    broken.auto_assign = true;
    let mut a = with_pools(&[pool("auto", 1, &["10.0.0.0/30"]), manual, broken]);
    assert_eq!(
        alloc(&mut a, &svc("a", 1).in_pool("manual")),
        Ok(vec!["10.0.5.0".into()])
    );
    assert_eq!(
        alloc(&mut a, &svc("b", 2).in_pool("nope")),
        Err("pool nope does not exist".into())
    );
    assert_eq!(
        alloc(&mut a, &svc("c", 3).in_pool("broken")),
        Err("pool broken cannot be used: spec.addresses[1]: invalid address \"nonsense\": \"nonsense\" is not an IP address (write a CIDR such as 10.0.0.0/24, a range such as 10.0.0.10-10.0.0.20, or a single address)".into())
    );
    // Auto-assignment never uses the pool without autoAssign nor the broken one.
    for i in 0..4 {
        assert!(
            alloc(&mut a, &svc(&format!("auto{i}"), 10 + i)).unwrap()[0].starts_with("10.0.0.")
        );
    }
    assert_eq!(
        alloc(&mut a, &svc("auto5", 20)),
        Err("no available addresses in pool auto".into())
    );
}

#[test]
fn service_allocation_scopes_and_priorities() {
    let scoped = |name: &str, created: i64, addr: &str, prio: Option<i32>, ns: &[&str]| {
        let mut p = pool(name, created, &[addr]);
        p.service_allocation = Some(AllocationSpec {
            priority: prio,
            namespaces: ns.iter().map(|s| s.to_string()).collect(),
            ..Default::default()
        });
        p
    };
    let mut by_label = pool("team-a", 6, &["10.6.0.0/30"]);
    by_label.service_allocation = Some(AllocationSpec {
        priority: Some(1),
        namespace_selectors: vec![hostlb_api::LabelSelector::from_labels([("team", "a")])],
        ..Default::default()
    });
    let mut by_svc = pool("exposed", 7, &["10.7.0.0/30"]);
    by_svc.service_selectors_for_test(&[("expose", "public")]);
    let mut a = with_pools(&[
        pool("global", 1, &["10.1.0.0/30"]),
        scoped("shop-low", 2, "10.2.0.0/30", Some(50), &["shop"]),
        scoped("shop-high", 3, "10.3.0.0/30", Some(10), &["shop"]),
        scoped("shop-unset", 4, "10.4.0.0/30", None, &["shop"]),
        by_label,
        by_svc,
    ]);
    a.set_namespace("team-ns", [("team".to_string(), "a".to_string())].into());
    // Lower priority value first; then unset; then pools without serviceAllocation.
    let shop = |n: &str, t: i64| svc(n, t).ns("shop");
    let got: Vec<String> = (0..13)
        .map(|i| {
            alloc(&mut a, &shop(&format!("s{i}"), i))
                .map(|v| v[0].clone())
                .unwrap_or_else(|e| e)
        })
        .collect();
    let prefix: Vec<&str> = got.iter().map(|g| &g[..7]).collect();
    assert_eq!(
        prefix,
        vec![
            "10.3.0.", "10.3.0.", "10.3.0.", "10.3.0.", "10.2.0.", "10.2.0.", "10.2.0.", "10.2.0.",
            "10.4.0.", "10.4.0.", "10.4.0.", "10.4.0.", "10.1.0."
        ]
    );
    // Other namespaces only reach the global pool.
    assert!(alloc(&mut a, &svc("o", 20).ns("other")).unwrap()[0].starts_with("10.1.0."));
    // Namespace labels select a pool.
    assert!(alloc(&mut a, &svc("t", 21).ns("team-ns")).unwrap()[0].starts_with("10.6.0."));
    // Service labels select a pool.
    assert!(
        alloc(&mut a, &svc("p", 22).label("expose", "public")).unwrap()[0].starts_with("10.7.0.")
    );
    // A pool reserved for others cannot be asked for.
    assert_eq!(
        alloc(&mut a, &svc("q", 23).in_pool("shop-high")),
        Err(
            "pool shop-high does not serve this Service (its serviceAllocation excludes it)".into()
        )
    );
    // Losing the namespace label moves the Service out of the scoped pool.
    let held = a.allocation("team-ns/t").unwrap();
    a.set_namespace("team-ns", Labels::new());
    let moved = svc("t", 21)
        .ns("team-ns")
        .holding(&[&held.ips[0].to_string()], &held.pool);
    assert!(alloc(&mut a, &moved).unwrap()[0].starts_with("10.1.0."));
}

impl PoolSpec {
    fn service_selectors_for_test(&mut self, labels: &[(&str, &str)]) {
        self.service_allocation = Some(AllocationSpec {
            priority: Some(1),
            service_selectors: vec![hostlb_api::LabelSelector::from_labels(
                labels.iter().copied(),
            )],
            ..Default::default()
        });
    }
}

#[test]
fn sharing_keys_ports_and_traffic_policy() {
    let mut a = with_pools(&[pool("p", 1, &["10.0.0.0/28"])]);
    let dns_tcp = svc("dns-tcp", 1).share("dns").ports(&[("TCP", 53)]);
    let dns_udp = svc("dns-udp", 2).share("dns").ports(&[("UDP", 53)]);
    assert_eq!(alloc(&mut a, &dns_tcp), Ok(vec!["10.0.0.0".into()]));
    assert_eq!(
        alloc(&mut a, &dns_udp),
        Ok(vec!["10.0.0.0".into()]),
        "same key, no port clash: shared"
    );
    let clash = svc("dns-tcp-2", 3).share("dns").ports(&[("TCP", 53)]);
    assert_eq!(
        alloc(&mut a, &clash),
        Ok(vec!["10.0.0.1".into()]),
        "port clash: the next address"
    );
    let other_key = svc("other", 4).share("web").ports(&[("UDP", 54)]);
    assert_eq!(alloc(&mut a, &other_key), Ok(vec!["10.0.0.2".into()]));
    // Local traffic policy shares only with the same pods.
    let l1 = svc("l1", 5).share("k").ports(&[("TCP", 1)]).local("app=x");
    let l2 = svc("l2", 6).share("k").ports(&[("TCP", 2)]).local("app=x");
    let l3 = svc("l3", 7).share("k").ports(&[("TCP", 3)]).local("app=y");
    let c4 = svc("c4", 8).share("k").ports(&[("TCP", 4)]);
    assert_eq!(alloc(&mut a, &l1), Ok(vec!["10.0.0.3".into()]));
    assert_eq!(alloc(&mut a, &l2), Ok(vec!["10.0.0.3".into()]));
    assert_eq!(alloc(&mut a, &l3), Ok(vec!["10.0.0.4".into()]));
    assert_eq!(alloc(&mut a, &c4), Ok(vec!["10.0.0.5".into()]));
    // Asking for a shared address: allowed with the key, refused without.
    assert_eq!(
        alloc(
            &mut a,
            &svc("ask", 9)
                .share("dns")
                .ports(&[("TCP", 80)])
                .request(&["10.0.0.0"])
        ),
        Ok(vec!["10.0.0.0".into()])
    );
    assert_eq!(
        alloc(&mut a, &svc("ask2", 10).ports(&[("TCP", 81)]).request(&["10.0.0.0"])),
        Err("10.0.0.0 is in use by default/ask: this Service does not allow sharing (no hostlb.io/allow-shared-ip)".into())
    );
    assert_eq!(
        alloc(
            &mut a,
            &svc("ask3", 11)
                .share("dns")
                .ports(&[("UDP", 53)])
                .request(&["10.0.0.0"])
        ),
        Err("10.0.0.0 is in use by default/ask: port UDP/53 is used by default/dns-udp".into())
    );
    // The address stays held while any sharer remains.
    a.release("default/dns-tcp");
    a.release("default/dns-udp");
    assert_eq!(
        a.holders_of(ip("10.0.0.0")),
        vec!["default/ask".to_string()]
    );
    a.release("default/ask");
    assert_eq!(alloc(&mut a, &svc("next", 12)), Ok(vec!["10.0.0.0".into()]));
}

/// A sharing key is its namespace's own: a tenant that copies another
/// tenant's key gets an address of its own, and asking for the other's
/// address by name is refused, saying why. The victim's later edit is
/// never a reason for it to lose its address. A pool with
/// `shareAcrossNamespaces` shares across namespaces, as MetalLB does.
#[test]
fn a_sharing_key_does_not_cross_namespaces_unless_the_pool_says_so() {
    let mut a = with_pools(&[pool("p", 1, &["10.0.0.0/28"])]);
    let victim = svc("web", 1).ns("shop").share("k").ports(&[("TCP", 443)]);
    let copycat = svc("spy", 2).ns("evil").share("k").ports(&[("TCP", 80)]);
    assert_eq!(alloc(&mut a, &victim), Ok(vec!["10.0.0.0".into()]));
    assert_eq!(
        alloc(&mut a, &copycat),
        Ok(vec!["10.0.0.1".into()]),
        "the same key in another namespace: an address of its own"
    );
    let asking = svc("spy2", 3)
        .ns("evil")
        .share("k")
        .ports(&[("TCP", 81)])
        .request(&["10.0.0.0"]);
    assert_eq!(
        alloc(&mut a, &asking),
        Err("10.0.0.0 is in use by shop/web: it is held by a Service of namespace \"shop\", and pool p does not share addresses across namespaces (spec.shareAcrossNamespaces)".into())
    );
    // The victim edits its ports to ones the copycat uses: nothing of the
    // copycat's is on its address, so it keeps it.
    let edited = victim
        .clone()
        .ports(&[("TCP", 80)])
        .holding(&["10.0.0.0"], "p");
    assert_eq!(alloc(&mut a, &edited), Ok(vec!["10.0.0.0".into()]));
    // Within one namespace the key shares as before.
    let sibling = svc("api", 4).ns("shop").share("k").ports(&[("TCP", 8443)]);
    assert_eq!(alloc(&mut a, &sibling), Ok(vec!["10.0.0.0".into()]));

    let mut shared = pool("m", 1, &["10.0.1.0/28"]);
    shared.share_across_namespaces = true;
    let mut b = with_pools(&[shared]);
    let one = svc("one", 1).ns("a").share("k").ports(&[("TCP", 1)]);
    let two = svc("two", 2).ns("b").share("k").ports(&[("TCP", 2)]);
    assert_eq!(alloc(&mut b, &one), Ok(vec!["10.0.1.0".into()]));
    assert_eq!(
        alloc(&mut b, &two),
        Ok(vec!["10.0.1.0".into()]),
        "a pool that shares across namespaces"
    );
}

/// A Local Service without a selector has hand-made endpoints nobody here
/// can compare: it shares with no Service, Cluster or Local, selector or not.
#[test]
fn a_local_service_without_a_selector_shares_with_none() {
    let mut a = with_pools(&[pool("p", 1, &["10.0.0.0/29"])]);
    let cluster = svc("cluster", 1).share("k").ports(&[("TCP", 1)]);
    assert_eq!(alloc(&mut a, &cluster), Ok(vec!["10.0.0.0".into()]));
    let bare = svc("bare", 2).share("k").ports(&[("TCP", 2)]).local("");
    assert_eq!(alloc(&mut a, &bare), Ok(vec!["10.0.0.1".into()]));
    let bare2 = svc("bare2", 3).share("k").ports(&[("TCP", 3)]).local("");
    assert_eq!(alloc(&mut a, &bare2), Ok(vec!["10.0.0.2".into()]));
    let selected = svc("selected", 4)
        .share("k")
        .ports(&[("TCP", 4)])
        .local("app=x");
    assert_eq!(alloc(&mut a, &selected), Ok(vec!["10.0.0.3".into()]));
    assert_eq!(
        alloc(
            &mut a,
            &svc("ask", 5)
                .share("k")
                .ports(&[("TCP", 5)])
                .local("")
                .request(&["10.0.0.0"])
        ),
        Err("10.0.0.0 is in use by default/cluster: a Service with externalTrafficPolicy: Local and no selector shares with none (its endpoints cannot be compared)".into())
    );
}

#[test]
fn held_addresses_are_kept_while_valid() {
    let mut a = with_pools(&[pool("p", 1, &["10.0.0.0/24"])]);
    let s = svc("a", 1).holding(&["10.0.0.77"], "p");
    assert_eq!(
        alloc(&mut a, &s),
        Ok(vec!["10.0.0.77".into()]),
        "an address already in status is kept"
    );
    assert_eq!(
        alloc(&mut a, &s),
        Ok(vec!["10.0.0.77".into()]),
        "idempotent"
    );
    // A higher-priority pool appearing does not move it.
    let mut better = pool("better", 2, &["10.1.0.0/24"]);
    better.service_allocation = Some(AllocationSpec {
        priority: Some(1),
        ..Default::default()
    });
    a.set_pools(&[pool("p", 1, &["10.0.0.0/24"]), better]);
    assert_eq!(alloc(&mut a, &s), Ok(vec!["10.0.0.77".into()]));
    // Outside every pool: replaced.
    let stray = svc("b", 2).holding(&["192.168.1.1"], "p");
    assert_eq!(alloc(&mut a, &stray), Ok(vec!["10.1.0.0".into()]));
    // The pool deleted: the address moves.
    a.set_pools(&[pool("other", 3, &["10.2.0.0/24"])]);
    assert_eq!(alloc(&mut a, &s), Ok(vec!["10.2.0.0".into()]));
    // Policy changes adjust families, keeping what still fits.
    a.set_pools(&[pool("dual", 4, &["10.3.0.0/24", "fd00::/120"])]);
    let single = svc("c", 3).holding(&["10.3.0.9"], "dual");
    assert_eq!(alloc(&mut a, &single), Ok(vec!["10.3.0.9".into()]));
    let dual = single.clone().policy(FamilyPolicy::RequireDualStack);
    assert_eq!(
        alloc(&mut a, &dual),
        Ok(vec!["10.3.0.9".into(), "fd00::".into()])
    );
    let back = svc("c", 3).holding(&["10.3.0.9", "fd00::"], "dual");
    assert_eq!(alloc(&mut a, &back), Ok(vec!["10.3.0.9".into()]));
    assert!(
        a.holders_of(ip("fd00::")).is_empty(),
        "the dropped family is released"
    );
}

#[test]
fn the_older_service_keeps_a_contested_address() {
    let mut a = with_pools(&[pool("p", 1, &["10.0.0.0/24"])]);
    let older = svc("older", 1).holding(&["10.0.0.5"], "p");
    let younger = svc("younger", 2).holding(&["10.0.0.5"], "p");
    // The younger is seen first, as after a restart in any order.
    assert_eq!(alloc(&mut a, &younger), Ok(vec!["10.0.0.5".into()]));
    let out = a.reconcile(&older, true);
    assert_eq!(out.result.unwrap().unwrap().ips, ips(&["10.0.0.5"]));
    assert_eq!(out.evicted, vec!["default/younger".to_string()]);
    assert!(a.allocation("default/younger").is_none());
    // The younger then gets a new address.
    assert_eq!(alloc(&mut a, &younger), Ok(vec!["10.0.0.0".into()]));
    // And cannot take it back: asking for it keeps what it holds.
    let out = a.reconcile(&svc("younger", 2).request(&["10.0.0.5"]), true);
    let kept = out.result.unwrap().unwrap();
    assert_eq!(kept.ips, ips(&["10.0.0.0"]));
    assert_eq!(
        kept.pending.unwrap().to_string(),
        "10.0.0.5 is in use by default/older: it does not allow sharing (no hostlb.io/allow-shared-ip)"
    );
}

#[test]
fn overlapping_and_invalid_pools_do_not_harm_others() {
    let mut a = with_pools(&[
        pool("first", 1, &["10.0.0.0/30"]),
        pool("overlap", 2, &["10.0.0.2/31", "10.9.0.0/30"]),
        pool("typo", 3, &["10.8.0.0/30", "10.8.0.999"]),
    ]);
    let states: Vec<(String, bool)> = a
        .pools()
        .iter()
        .map(|p| (p.name.clone(), p.usable()))
        .collect();
    assert_eq!(
        states,
        vec![
            ("first".into(), true),
            ("overlap".into(), false),
            ("typo".into(), false)
        ]
    );
    for i in 0..4 {
        assert!(alloc(&mut a, &svc(&format!("s{i}"), i)).unwrap()[0].starts_with("10.0.0."));
    }
    assert_eq!(
        alloc(&mut a, &svc("s4", 4)),
        Err("no available addresses in pool first".into())
    );
    // An address held from the invalid pool's valid part is kept.
    assert_eq!(
        alloc(&mut a, &svc("held", 5).holding(&["10.8.0.1"], "typo")),
        Ok(vec!["10.8.0.1".into()])
    );
}

#[test]
fn pool_counts() {
    let mut p = pool(
        "p",
        1,
        &["10.0.0.0/24", "10.0.0.100-10.0.1.9", "fd00::/120"],
    );
    p.avoid_buggy_ips = true;
    let mut a = with_pools(&[p, pool("q", 2, &["10.5.0.0/30"])]);
    alloc(&mut a, &svc("a", 1)).unwrap();
    alloc(&mut a, &svc("b", 2).share("k")).unwrap();
    alloc(&mut a, &svc("c", 3).share("k").ports(&[("UDP", 1)])).unwrap();
    alloc(
        &mut a,
        &svc("d", 4).v6().policy(FamilyPolicy::PreferDualStack),
    )
    .unwrap();
    let r = a.report();
    let p = r.iter().find(|x| x.name == "p").unwrap();
    // Capacity v4: 10.0.0.0-10.0.1.9 = 266 less .0, .255, 1.0 = 263.
    assert_eq!(p.assigned, [3, 1], "a shared address counts once");
    assert_eq!(p.available, [263 - 3, 256 - 1]);
    assert_eq!(p.state, PoolState::Ready);
    let q = r.iter().find(|x| x.name == "q").unwrap();
    assert_eq!((q.assigned, q.available), ([0, 0], [4, 0]));
}

fn kept(a: &mut Allocator, s: &ServiceRequest) -> (Vec<String>, Option<String>) {
    let x = a.reconcile(s, true).result.unwrap().unwrap();
    (
        x.ips.iter().map(|i| i.to_string()).collect(),
        x.pending.map(|e| e.to_string()),
    )
}

/// An edit never takes a serving address away: a request that cannot be
/// read, a pool that is gone, an address that is taken leave the Service
/// with what it holds and the reason; a request that can be met moves it.
#[test]
fn an_edit_that_cannot_be_met_keeps_the_address() {
    let mut a = with_pools(&[
        pool("p", 1, &["10.0.0.0/29"]),
        pool("q", 2, &["10.1.0.0/29"]),
    ]);
    let web = svc("web", 1).holding(&["10.0.0.3"], "p");
    assert_eq!(kept(&mut a, &web), (vec!["10.0.0.3".into()], None));
    let mut typo = web.clone();
    typo.request_error =
        Some("hostlb.io/loadBalancerIPs: \"10.0.0.x\" is not an IP address".into());
    assert_eq!(
        kept(&mut a, &typo),
        (
            vec!["10.0.0.3".into()],
            Some("hostlb.io/loadBalancerIPs: \"10.0.0.x\" is not an IP address".into())
        )
    );
    let gone = web.clone().in_pool("deleted");
    assert_eq!(
        kept(&mut a, &gone),
        (
            vec!["10.0.0.3".into()],
            Some("pool deleted does not exist".into())
        )
    );
    assert_eq!(alloc(&mut a, &svc("other", 2)), Ok(vec!["10.0.0.0".into()]));
    let taken = web.clone().request(&["10.0.0.0"]);
    assert_eq!(
        kept(&mut a, &taken),
        (
            vec!["10.0.0.3".into()],
            Some("10.0.0.0 is in use by default/other: it does not allow sharing (no hostlb.io/allow-shared-ip)".into())
        )
    );
    // Requests that can be met are acted on.
    assert_eq!(
        kept(&mut a, &web.clone().request(&["10.0.0.5"])),
        (vec!["10.0.0.5".into()], None)
    );
    assert!(
        a.holders_of(ip("10.0.0.3")).is_empty(),
        "the old address is free"
    );
    let moved = svc("web", 1).holding(&["10.0.0.5"], "p").in_pool("q");
    assert_eq!(kept(&mut a, &moved), (vec!["10.1.0.0".into()], None));
    // Without a status or anything held, an unreadable request is an error.
    let mut fresh = svc("fresh", 3);
    fresh.request_error = Some("bad".into());
    assert_eq!(alloc(&mut a, &fresh), Err("bad".into()));
}

/// A Service that changes its sharing key, its Local selector or its ports
/// while it shares an address is the one refused, whatever the ages: the
/// others keep the address, and it gets another one as any Service would.
#[test]
fn a_sharing_edit_refuses_the_edited_service_not_the_others() {
    let mut a = with_pools(&[pool("p", 1, &["10.0.0.0/29"])]);
    let old = svc("old", 1).share("k").ports(&[("TCP", 1)]);
    let young = svc("young", 2).share("k").ports(&[("TCP", 2)]);
    assert_eq!(alloc(&mut a, &old), Ok(vec!["10.0.0.0".into()]));
    assert_eq!(alloc(&mut a, &young), Ok(vec!["10.0.0.0".into()]));
    // The older one changes its key: refused, though older.
    let out = a.reconcile(
        &old.clone().share("other").holding(&["10.0.0.0"], "p"),
        true,
    );
    assert!(out.evicted.is_empty());
    assert_eq!(
        out.refused.unwrap().to_string(),
        "10.0.0.0 stays with default/young, which shares it: sharing key \"other\" differs from \"k\""
    );
    assert_eq!(out.result.unwrap().unwrap().ips, ips(&["10.0.0.1"]));
    assert_eq!(
        a.holders_of(ip("10.0.0.0")),
        vec!["default/young".to_string()]
    );
    // The same for a Local selector and for a port.
    let l1 = svc("l1", 5).share("l").ports(&[("TCP", 1)]).local("app=x");
    let l2 = svc("l2", 6).share("l").ports(&[("TCP", 2)]).local("app=x");
    assert_eq!(alloc(&mut a, &l1), Ok(vec!["10.0.0.2".into()]));
    assert_eq!(alloc(&mut a, &l2), Ok(vec!["10.0.0.2".into()]));
    let out = a.reconcile(&l1.clone().local("app=y").holding(&["10.0.0.2"], "p"), true);
    assert!(
        out.refused
            .unwrap()
            .to_string()
            .contains("the same pod selector")
    );
    assert_eq!(a.holders_of(ip("10.0.0.2")), vec!["default/l2".to_string()]);
    let p1 = svc("p1", 7).share("q").ports(&[("TCP", 1)]);
    let p2 = svc("p2", 8).share("q").ports(&[("TCP", 2)]);
    assert_eq!(alloc(&mut a, &p1), Ok(vec!["10.0.0.4".into()]));
    assert_eq!(alloc(&mut a, &p2), Ok(vec!["10.0.0.4".into()]));
    let out = a.reconcile(
        &p1.clone().ports(&[("TCP", 2)]).holding(&["10.0.0.4"], "p"),
        true,
    );
    assert_eq!(
        out.refused.unwrap().to_string(),
        "10.0.0.4 stays with default/p2, which shares it: port TCP/2 is used by default/p2"
    );
    assert_eq!(a.holders_of(ip("10.0.0.4")), vec!["default/p2".to_string()]);
    // A sole holder changes freely.
    let out = a.reconcile(&p2.clone().share("z").holding(&["10.0.0.4"], "p"), true);
    assert_eq!(
        (out.refused, out.result.unwrap().unwrap().ips),
        (None, ips(&["10.0.0.4"]))
    );
}
