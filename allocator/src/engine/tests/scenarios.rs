//! The scenarios of the pool-configuration design
//! (`seeds/metallb-pool-configuration-design.txt`).

use super::*;

/// `ipaddresspool-sample3`: mixed families, a CIDR written with host bits,
/// `autoAssign: false` and `avoidBuggyIPs: true`.
#[test]
fn sample3_mixed_families_manual_and_buggy() {
    let mut p = pool(
        "ipaddresspool-sample3",
        1,
        &["2002:2:2::1-2002:2:2::100", "172.20.0.100/24"],
    );
    p.auto_assign = false;
    p.avoid_buggy_ips = true;
    let mut a = with_pools(&[p]);
    assert_eq!(
        alloc(&mut a, &svc("auto", 1)),
        Err("no IPAddressPool serves this Service (none with autoAssign admits it)".into())
    );
    assert_eq!(
        alloc(
            &mut a,
            &svc("dual", 2)
                .policy(FamilyPolicy::RequireDualStack)
                .in_pool("ipaddresspool-sample3")
        ),
        Ok(vec!["172.20.0.1".into(), "2002:2:2::1".into()]),
        "172.20.0.100/24 is the whole /24; .0 is avoided"
    );
    let r = &a.report()[0];
    assert_eq!(r.available, [254 - 1, 256 - 1]);
}

fn reserved(name: &str, created: i64, addr: &str, priority: Option<i32>) -> PoolSpec {
    let mut p = pool(name, created, &[addr]);
    p.service_allocation = Some(AllocationSpec {
        priority,
        namespaces: vec!["namespaceA".into(), "namespaceB".into()],
        service_selectors: vec![hostlb_api::LabelSelector::from_labels([("tenant", "foo")])],
        ..Default::default()
    });
    p
}

/// "Using a given IPAddressPool only for a subset of services": the pool
/// serves Services of namespaceA/namespaceB labelled tenant=foo, and only
/// them; it is preferred over a pool without selectors even when that one is
/// older, so such Services never land in the general pool by accident.
#[test]
fn reserved_pool_for_namespaces_and_service_labels() {
    let mut a = with_pools(&[
        pool("general", 1, &["10.0.0.0/24"]),
        reserved("tenant-foo", 2, "10.50.0.0/24", Some(50)),
    ]);
    let foo = |ns: &str, n: &str, t: i64| svc(n, t).ns(ns).label("tenant", "foo");
    assert_eq!(
        alloc(&mut a, &foo("namespaceA", "a", 1)),
        Ok(vec!["10.50.0.0".into()])
    );
    assert_eq!(
        alloc(&mut a, &foo("namespaceB", "b", 2)),
        Ok(vec!["10.50.0.1".into()])
    );
    assert_eq!(
        alloc(&mut a, &foo("namespaceC", "c", 3)),
        Ok(vec!["10.0.0.0".into()]),
        "other namespace"
    );
    assert_eq!(
        alloc(&mut a, &svc("d", 4).ns("namespaceA")),
        Ok(vec!["10.0.0.1".into()]),
        "no tenant label"
    );
}

/// "The controller will use the pool with lowest value of priority in case of
/// multiple matches"; "a pool with no priority set will be used only if the
/// pools with priority can't be used"; equal priorities are decided by age,
/// then name, so the choice is deterministic.
#[test]
fn priority_order_then_unset_then_general() {
    let mut a = with_pools(&[
        reserved("prio-50", 1, "10.50.0.0/31", Some(50)),
        reserved("prio-10", 2, "10.10.0.0/31", Some(10)),
        reserved("no-prio", 3, "10.99.0.0/31", None),
        reserved("prio-10-younger", 4, "10.11.0.0/31", Some(10)),
        pool("general", 0, &["10.0.0.0/31"]),
    ]);
    let got: Vec<String> = (0..11)
        .map(|i| {
            alloc(
                &mut a,
                &svc(&format!("s{i}"), i)
                    .ns("namespaceA")
                    .label("tenant", "foo"),
            )
            .map(|v| v[0].clone())
            .unwrap_or_else(|e| e)
        })
        .collect();
    assert_eq!(
        got,
        vec![
            "10.10.0.0",
            "10.10.0.1",
            "10.11.0.0",
            "10.11.0.1",
            "10.50.0.0",
            "10.50.0.1",
            "10.99.0.0",
            "10.99.0.1",
            "10.0.0.0",
            "10.0.0.1",
            "no available addresses in pools prio-10, prio-10-younger, prio-50, no-prio, general"
        ]
    );
}

/// "Announcing the IP from a subset of nodes" and "no announcement" are the
/// agent's business; for the allocator an unannounced pool is an ordinary
/// pool, and `autoAssign: false` keeps it for Services that ask for it.
#[test]
fn static_only_pool_is_used_by_request() {
    let mut p = pool("static", 1, &["192.0.2.0/29"]);
    p.auto_assign = false;
    let mut a = with_pools(&[p, pool("dynamic", 2, &["198.51.100.0/29"])]);
    assert_eq!(
        alloc(&mut a, &svc("web", 1)),
        Ok(vec!["198.51.100.0".into()])
    );
    assert_eq!(
        alloc(&mut a, &svc("dns", 2).request(&["192.0.2.5"])),
        Ok(vec!["192.0.2.5".into()])
    );
    assert_eq!(
        alloc(&mut a, &svc("api", 3).in_pool("static")),
        Ok(vec!["192.0.2.0".into()])
    );
}
