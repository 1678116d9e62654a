//! Rules the allocator and every agent must apply identically. Were they
//! written twice, a drift between the copies would let the allocator think
//! an address belongs to one pool while the agents announce it under the
//! advertisements of another, or pick a different "oldest" Service.

use std::net::IpAddr;

/// The sort key of "oldest first": creation time (objects without one sort
/// last), then name, so every process breaks ties the same way.
pub fn age_key(created: Option<i64>, name: &str) -> (i64, &str) {
    (created.unwrap_or(i64::MAX), name)
}

/// Which pool holds `ips` (SPEC §5.1): the pool named by the Service's
/// `ip-allocated-from-pool` annotation when it contains every address, else
/// the first pool of `pools` that does. `pools` must be oldest first (see
/// [`age_key`]), so where pools overlap the older one owns the addresses,
/// as the allocator decided when it handed them out.
///
/// A stale annotation (the named pool was edited and no longer contains the
/// address) is ignored rather than trusted: otherwise the agents would elect
/// with the advertisements of a pool the address has left.
pub fn pool_holding<P>(
    pools: &[P],
    named: Option<&str>,
    ips: &[IpAddr],
    name: impl Fn(&P) -> &str,
    contains: impl Fn(&P, IpAddr) -> bool,
) -> Option<usize> {
    let holds_all = |p: &P| !ips.is_empty() && ips.iter().all(|ip| contains(p, *ip));
    named
        .and_then(|n| pools.iter().position(|p| name(p) == n))
        .filter(|&i| holds_all(&pools[i]))
        .or_else(|| pools.iter().position(holds_all))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::AddressRange;

    struct P(&'static str, AddressRange);

    fn pools() -> Vec<P> {
        vec![
            P("old", "10.0.0.0/24".parse().unwrap()),
            P("new", "10.0.0.128/25".parse().unwrap()),
            P("v6", "fd00::/64".parse().unwrap()),
        ]
    }

    fn find(named: Option<&str>, ips: &[&str]) -> Option<&'static str> {
        let ps = pools();
        let ips: Vec<IpAddr> = ips.iter().map(|s| s.parse().unwrap()).collect();
        pool_holding(&ps, named, &ips, |p| p.0, |p, ip| p.1.contains(ip)).map(|i| ps[i].0)
    }

    #[test]
    fn the_named_pool_wins_only_while_it_holds_the_address() {
        assert_eq!(find(Some("new"), &["10.0.0.200"]), Some("new"));
        // Stale annotation: "new" no longer holds .5, the first holder does.
        assert_eq!(find(Some("new"), &["10.0.0.5"]), Some("old"));
        // A pool that is gone.
        assert_eq!(find(Some("gone"), &["10.0.0.200"]), Some("old"));
        assert_eq!(find(None, &["10.0.0.200"]), Some("old"));
    }

    #[test]
    fn every_address_must_be_in_the_pool() {
        assert_eq!(find(Some("old"), &["10.0.0.1", "fd00::1"]), None);
        assert_eq!(find(None, &["fd00::1"]), Some("v6"));
        assert_eq!(find(None, &["10.9.0.1"]), None);
        assert_eq!(find(Some("old"), &[]), None);
    }

    #[test]
    fn oldest_first_puts_unknown_ages_last_and_breaks_ties_by_name() {
        let mut v = vec![(None, "a"), (Some(5), "z"), (Some(5), "b"), (Some(1), "y")];
        v.sort_by(|a, b| age_key(a.0, a.1).cmp(&age_key(b.0, b.1)));
        assert_eq!(
            v,
            vec![(Some(1), "y"), (Some(5), "b"), (Some(5), "z"), (None, "a")]
        );
    }
}
