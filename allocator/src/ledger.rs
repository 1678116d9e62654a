//! The allocator's whole picture: every handled Service with the engine's
//! answer for it, kept consistent as Services, pools and namespaces change.
//!
//! Both the controller and `allocator plan` drive allocation through this
//! one type, so what `plan` prints is what the controller does. It decides
//! the order things happen in: on a rebuild every Service keeps what it
//! holds before any new address is handed out (oldest first), and a Service
//! waiting for an address is retried whenever addresses are freed.

use std::collections::{BTreeMap, BTreeSet};

use hostlb_api::rules::age_key;

use crate::engine::{
    AllocError, Allocator, Assigned, Labels, PoolReport, PoolSpec, ServiceRequest,
};

pub type Answer = Result<Assigned, AllocError>;

#[derive(Default)]
pub struct Ledger {
    engine: Allocator,
    services: BTreeMap<String, ServiceRequest>,
    answers: BTreeMap<String, Answer>,
    /// Services still waiting for an address (or one of their families),
    /// oldest first: what [`Ledger::settle`] retries.
    waiting: BTreeSet<(i64, String)>,
    /// What was decided for Services whose status does not show it yet:
    /// the addresses and pool they hold from then on.
    decided: BTreeMap<String, (Vec<std::net::IpAddr>, Option<String>)>,
    /// Services refused an address they shared (their edit no longer fit
    /// it), not reported yet.
    refusals: BTreeMap<String, AllocError>,
    /// Leave Services alone until their namespace is known: namespace
    /// selectors cannot be judged without its labels, and judging them on
    /// none could take away an address the Service rightly holds.
    require_namespaces: bool,
}

fn age(s: &ServiceRequest) -> (i64, String) {
    let (t, k) = age_key(s.created, &s.key);
    (t, k.to_string())
}

impl Ledger {
    pub fn new() -> Self {
        Ledger::default()
    }

    /// A ledger for a live cluster, where a Service may be seen before its
    /// namespace: such Services wait, untouched, until the namespace is set.
    pub fn requiring_namespaces() -> Self {
        Ledger {
            require_namespaces: true,
            ..Ledger::default()
        }
    }

    /// The Service is in the ledger but nothing was decided for it yet (its
    /// namespace is not known): its status must be left as it is.
    pub fn undecided(&self, key: &str) -> bool {
        self.services.contains_key(key) && !self.answers.contains_key(key)
    }

    /// The refusals since the last call, to report.
    pub fn take_refusals(&mut self) -> BTreeMap<String, AllocError> {
        std::mem::take(&mut self.refusals)
    }

    pub fn answer(&self, key: &str) -> Option<&Answer> {
        self.answers.get(key)
    }

    /// Every Service with its answer, oldest first.
    pub fn answers(&self) -> Vec<(&ServiceRequest, &Answer)> {
        let mut v: Vec<(&ServiceRequest, &Answer)> = self
            .services
            .values()
            .filter_map(|s| self.answers.get(&s.key).map(|a| (s, a)))
            .collect();
        v.sort_by_key(|(s, _)| age(s));
        v
    }

    pub fn report(&self) -> Vec<PoolReport> {
        self.engine.report()
    }

    pub fn pools(&self) -> &[crate::engine::Pool] {
        self.engine.pools()
    }

    /// The pool that holds `ip`, by name.
    pub fn pool_holding(&self, ip: std::net::IpAddr) -> Option<&str> {
        self.engine.pool_holding(ip)
    }

    /// Services holding `ip`.
    pub fn holders_of(&self, ip: std::net::IpAddr) -> Vec<String> {
        self.engine.holders_of(ip)
    }

    pub fn len(&self) -> usize {
        self.services.len()
    }

    pub fn is_empty(&self) -> bool {
        self.services.is_empty()
    }

    fn by_age(&self, filter: impl Fn(&ServiceRequest) -> bool) -> Vec<String> {
        let mut v: Vec<&ServiceRequest> = self.services.values().filter(|s| filter(s)).collect();
        v.sort_by_key(|s| age(s));
        v.into_iter().map(|s| s.key.clone()).collect()
    }

    /// Reconcile one Service; record the answer; follow evictions. Returns
    /// whether any address was freed on the way.
    fn run(&mut self, key: &str, allow_new: bool, changed: &mut BTreeSet<String>) -> bool {
        let mut freed = false;
        let mut queue = vec![key.to_string()];
        while let Some(k) = queue.pop() {
            let Some(stored) = self.services.get(&k) else {
                continue;
            };
            let decided;
            let req = match self.decided.get(&k) {
                Some((ips, pool)) => {
                    let mut r = stored.clone();
                    r.current = ips.clone();
                    r.current_pool = pool.clone();
                    decided = r;
                    &decided
                }
                None => stored,
            };
            if self.require_namespaces && !self.engine.knows_namespace(&req.namespace) {
                // Undecided, but what its status holds is nobody else's.
                self.engine.reserve(req);
                continue;
            }
            let before = self.engine.allocation(&k);
            let out = self.engine.reconcile(req, allow_new);
            if let Some(r) = out.refused {
                self.refusals.insert(k.clone(), r);
                changed.insert(k.clone());
            }
            let answer = match out.result {
                Ok(Some(a)) => Ok(a),
                Ok(None) => continue,
                Err(e) => Err(e),
            };
            let after = self.engine.allocation(&k);
            if before.as_ref().is_some_and(|b| {
                after
                    .as_ref()
                    .is_none_or(|a| b.ips.iter().any(|ip| !a.ips.contains(ip)))
            }) {
                freed = true;
            }
            // A Service keeping its addresses while its request is not met
            // waits too: the request may be met once something changes.
            let waits = match &answer {
                Ok(a) => a.pending.is_some() || a.ips.len() < wanted_families(req),
                Err(_) => true,
            };
            let slot = age(req);
            if waits {
                self.waiting.insert(slot);
            } else {
                self.waiting.remove(&slot);
            }
            // Changed when the answer moved, or when the Service does not
            // show it (its status was edited or lost): either needs a write.
            // A Service holding addresses also shows the sharing terms they
            // are held under (an accepted edit of its terms is recorded).
            let shown = match &answer {
                Ok(a) => {
                    a.ips == stored.current
                        && stored.current_pool.as_ref() == Some(&a.pool)
                        && (a.ips.is_empty() || stored.granted_terms == stored.sharing_terms())
                }
                Err(_) => stored.current.is_empty() && stored.current_pool.is_none(),
            };
            // Until its status shows the answer (it is written next), the
            // Service holds what was decided: settling and other changes
            // start from that, not from the status this replaced.
            if shown {
                self.decided.remove(&k);
            } else {
                let (ips, pool) = match &answer {
                    Ok(a) => (a.ips.clone(), Some(a.pool.clone())),
                    Err(_) => (Vec::new(), None),
                };
                self.decided.insert(k.clone(), (ips, pool));
            }
            if self.answers.get(&k) != Some(&answer) || !shown {
                changed.insert(k.clone());
                self.answers.insert(k.clone(), answer);
            }
            for e in out.evicted {
                freed = true;
                self.answers.remove(&e);
                changed.insert(e.clone());
                queue.push(e);
            }
        }
        freed
    }

    /// Retry, oldest first, the Services still waiting for an address or for
    /// one of their families, until nothing changes.
    fn settle(&mut self, changed: &mut BTreeSet<String>) {
        for _ in 0..64 {
            let waiting: Vec<String> = self.waiting.iter().map(|(_, k)| k.clone()).collect();
            if waiting.is_empty() {
                return;
            }
            // Progress is an answer that moved; a Service merely not showing
            // its answer yet is written, not retried.
            let mut progress = false;
            for k in waiting {
                let before = self.answers.get(&k).cloned();
                self.run(&k, true, changed);
                progress |= self.answers.get(&k) != before.as_ref();
            }
            if !progress {
                return;
            }
        }
    }

    /// Everything from scratch, as after a restart: every Service first keeps
    /// what its status holds, and only then are new addresses handed out.
    /// Of two claimants of one address, the one whose sharing terms still
    /// match what it was given under goes first, so an edited Service is
    /// refused as it would have been live; where that does not tell them
    /// apart, the older goes first.
    pub fn rebuild(&mut self) -> BTreeSet<String> {
        let mut changed = BTreeSet::new();
        let mut order: Vec<&ServiceRequest> = self.services.values().collect();
        order.sort_by(|a, b| a.rank().cmp(&b.rank()));
        let order: Vec<String> = order.into_iter().map(|s| s.key.clone()).collect();
        for allow_new in [false, true] {
            for k in order.clone() {
                self.run(&k, allow_new, &mut changed);
            }
        }
        self.settle(&mut changed);
        changed
    }

    /// Add or update a Service and give it its addresses.
    pub fn upsert(&mut self, req: ServiceRequest) -> BTreeSet<String> {
        let key = req.key.clone();
        // A new shareable address can serve Services waiting with that key.
        let shares = req.sharing_key.is_some();
        self.decided.remove(&key);
        if let Some(old) = self.services.insert(key.clone(), req) {
            self.waiting.remove(&age(&old));
        }
        let mut changed = BTreeSet::new();
        let freed = self.run(&key, true, &mut changed);
        if freed || (shares && self.answers.get(&key).is_some_and(|a| a.is_ok())) {
            self.settle(&mut changed);
        }
        changed
    }

    /// Add or update a Service without allocating: used while the caches
    /// fill, before [`Ledger::rebuild`].
    pub fn insert(&mut self, req: ServiceRequest) {
        self.decided.remove(&req.key);
        if let Some(old) = self.services.insert(req.key.clone(), req) {
            self.waiting.remove(&age(&old));
        }
    }

    /// A Service is gone or no longer handled: free its addresses.
    pub fn remove(&mut self, key: &str) -> BTreeSet<String> {
        let mut changed = BTreeSet::new();
        self.decided.remove(key);
        if let Some(req) = self.services.remove(key) {
            self.waiting.remove(&age(&req));
        }
        if self.answers.remove(key).is_some() {
            changed.insert(key.to_string());
        }
        if self.engine.release(key) {
            self.settle(&mut changed);
        }
        changed
    }

    /// New pools: every Service is checked against them.
    pub fn set_pools(&mut self, specs: &[PoolSpec]) -> BTreeSet<String> {
        self.engine.set_pools(specs);
        self.rerun(|_| true)
    }

    /// A namespace's labels changed: its Services are checked again.
    pub fn set_namespace(&mut self, name: &str, labels: Labels) -> BTreeSet<String> {
        self.engine.set_namespace(name, labels);
        self.rerun(|s| s.namespace == name)
    }

    pub fn remove_namespace(&mut self, name: &str) -> BTreeSet<String> {
        self.engine.remove_namespace(name);
        self.rerun(|s| s.namespace == name)
    }

    /// Set pools and namespaces without reconciling, before a rebuild.
    pub fn load(
        &mut self,
        pools: &[PoolSpec],
        namespaces: impl IntoIterator<Item = (String, Labels)>,
    ) {
        self.engine.set_pools(pools);
        for (n, l) in namespaces {
            self.engine.set_namespace(&n, l);
        }
    }

    fn rerun(&mut self, filter: impl Fn(&ServiceRequest) -> bool) -> BTreeSet<String> {
        let mut changed = BTreeSet::new();
        for k in self.by_age(filter) {
            self.run(&k, true, &mut changed);
        }
        self.settle(&mut changed);
        changed
    }
}

fn wanted_families(s: &ServiceRequest) -> usize {
    if !s.requested.is_empty() && s.policy != crate::engine::FamilyPolicy::SingleStack {
        s.requested.len()
    } else {
        s.wanted().len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pool(name: &str, addrs: &[&str]) -> PoolSpec {
        PoolSpec {
            name: name.into(),
            created: Some(1),
            addresses: addrs.iter().map(|s| s.to_string()).collect(),
            auto_assign: true,
            ..Default::default()
        }
    }

    fn svc(name: &str, created: i64) -> ServiceRequest {
        ServiceRequest {
            key: format!("d/{name}"),
            namespace: "d".into(),
            created: Some(created),
            ..Default::default()
        }
    }

    #[test]
    fn a_waiting_service_gets_the_address_freed_by_another() {
        let mut l = Ledger::new();
        l.set_pools(&[pool("p", &["10.0.0.1"])]);
        assert_eq!(l.upsert(svc("a", 1)), BTreeSet::from(["d/a".to_string()]));
        let changed = l.upsert(svc("b", 2));
        assert!(changed.contains("d/b"));
        assert_eq!(
            l.answer("d/b").unwrap().as_ref().unwrap_err().to_string(),
            "no available addresses in pool p"
        );
        let changed = l.remove("d/a");
        assert_eq!(
            changed,
            BTreeSet::from(["d/a".to_string(), "d/b".to_string()])
        );
        assert_eq!(
            l.answer("d/b").unwrap().as_ref().unwrap().ips[0].to_string(),
            "10.0.0.1"
        );
    }

    #[test]
    fn rebuild_keeps_statuses_before_allocating() {
        let mut l = Ledger::new();
        l.load(&[pool("p", &["10.0.0.0/30"])], []);
        // A young Service without status would take .0 if it went first.
        l.insert(svc("new", 5));
        let mut held = svc("held", 9);
        held.current = vec!["10.0.0.0".parse().unwrap()];
        l.insert(held);
        l.rebuild();
        assert_eq!(
            l.answer("d/held").unwrap().as_ref().unwrap().ips[0].to_string(),
            "10.0.0.0"
        );
        assert_eq!(
            l.answer("d/new").unwrap().as_ref().unwrap().ips[0].to_string(),
            "10.0.0.1"
        );
    }

    fn ip(s: &str) -> std::net::IpAddr {
        s.parse().unwrap()
    }

    #[test]
    fn asking_for_a_held_address_never_takes_it() {
        let mut l = Ledger::new();
        l.set_pools(&[pool("p", &["10.0.0.0/30"])]);
        let mut young = svc("young", 9);
        young.requested = vec![ip("10.0.0.2")];
        l.upsert(young);
        // An older Service asking for the same address gets an error, and the
        // holder keeps it: only addresses already in status are contested.
        let mut old = svc("old", 1);
        old.requested = vec![ip("10.0.0.2")];
        let changed = l.upsert(old);
        assert_eq!(changed, BTreeSet::from(["d/old".to_string()]));
        assert_eq!(
            l.answer("d/old").unwrap().as_ref().unwrap_err().to_string(),
            "10.0.0.2 is in use by d/young: it does not allow sharing (no hostlb.io/allow-shared-ip)"
        );
        assert_eq!(
            l.answer("d/young").unwrap().as_ref().unwrap().ips,
            vec![ip("10.0.0.2")]
        );
    }

    #[test]
    fn prefer_dual_stack_on_a_single_stack_cluster_wants_one_family() {
        let mut l = Ledger::new();
        l.set_pools(&[pool("p", &["10.0.0.0/30", "fd00::/126"])]);
        let mut s = svc("s", 1);
        s.policy = crate::engine::FamilyPolicy::PreferDualStack;
        s.primary = Some(hostlb_api::Family::V4);
        s.families = vec![hostlb_api::Family::V4];
        l.upsert(s.clone());
        assert_eq!(
            l.answer("d/s").unwrap().as_ref().unwrap().ips,
            vec![ip("10.0.0.0")]
        );
        assert!(l.waiting.is_empty(), "one family is all it wants");
        // With both families listed it gets both.
        s.families = vec![hostlb_api::Family::V4, hostlb_api::Family::V6];
        l.upsert(s);
        assert_eq!(
            l.answer("d/s").unwrap().as_ref().unwrap().ips,
            vec![ip("10.0.0.0"), ip("fd00::")]
        );
    }

    #[test]
    fn a_service_waits_for_its_namespace_untouched() {
        let mut l = Ledger::requiring_namespaces();
        l.set_pools(&[pool("p", &["10.0.0.0/30"])]);
        let mut s = svc("s", 1);
        s.current = vec![ip("10.0.0.3")];
        assert!(l.upsert(s).is_empty());
        assert!(l.undecided("d/s"));
        let changed = l.set_namespace("d", Labels::new());
        assert_eq!(changed, BTreeSet::from(["d/s".to_string()]));
        assert!(!l.undecided("d/s"));
        assert_eq!(
            l.answer("d/s").unwrap().as_ref().unwrap().ips,
            vec![ip("10.0.0.3")]
        );
    }

    #[test]
    fn a_rebuild_reserves_addresses_of_services_whose_namespace_is_unknown() {
        let mut l = Ledger::requiring_namespaces();
        l.load(
            &[pool("p", &["10.0.0.0/30"])],
            [("d".to_string(), Labels::new())],
        );
        let mut early = svc("early", 1);
        early.namespace = "later".into();
        early.key = "later/early".into();
        early.current = vec![ip("10.0.0.0")];
        l.insert(early);
        l.insert(svc("new", 5));
        l.rebuild();
        assert!(l.undecided("later/early"));
        assert_eq!(
            l.answer("d/new").unwrap().as_ref().unwrap().ips,
            vec![ip("10.0.0.1")],
            "the address in the undecided Service's status is not handed out"
        );
        assert_eq!(
            l.holders_of(ip("10.0.0.0")),
            vec!["later/early".to_string()]
        );
        // Once the namespace is known the Service is judged as usual.
        l.set_namespace("later", Labels::new());
        assert_eq!(
            l.answer("later/early").unwrap().as_ref().unwrap().ips,
            vec![ip("10.0.0.0")]
        );
    }

    /// A request that cannot be met yet keeps the Service where it is, and
    /// is acted on as soon as the address it asks for is freed.
    #[test]
    fn an_unmet_request_waits_in_place_and_is_met_when_freed() {
        let mut l = Ledger::new();
        l.set_pools(&[pool("p", &["10.0.0.0/30"])]);
        l.upsert(svc("a", 1));
        l.upsert(svc("b", 2));
        let mut b = svc("b", 2);
        b.current = vec![ip("10.0.0.1")];
        b.current_pool = Some("p".into());
        b.requested = vec![ip("10.0.0.0")];
        l.upsert(b);
        let kept = l.answer("d/b").unwrap().clone().unwrap();
        assert_eq!(kept.ips, vec![ip("10.0.0.1")]);
        assert!(kept.pending.is_some());
        let changed = l.remove("d/a");
        assert!(changed.contains("d/b"));
        let moved = l.answer("d/b").unwrap().clone().unwrap();
        assert_eq!((moved.ips, moved.pending), (vec![ip("10.0.0.0")], None));
        assert!(l.holders_of(ip("10.0.0.1")).is_empty());
    }

    /// An older Service refused the address it shared moves; until its new
    /// status is written, checking everything again (new pools) starts from
    /// what was decided, so its old status does not evict the younger.
    #[test]
    fn a_refused_older_service_does_not_evict_on_a_later_check() {
        let mut l = Ledger::new();
        l.set_pools(&[pool("p", &["10.0.0.0/30"])]);
        let mut old = svc("old", 1);
        old.sharing_key = Some("k".into());
        old.ports = vec![crate::engine::Port {
            protocol: "TCP".into(),
            port: 1,
        }];
        let mut young = svc("young", 2);
        young.sharing_key = Some("k".into());
        for s in [&mut old, &mut young] {
            l.upsert(s.clone());
            s.current = vec![ip("10.0.0.0")];
            s.current_pool = Some("p".into());
            l.upsert(s.clone());
        }
        old.sharing_key = Some("other".into());
        l.upsert(old);
        assert_eq!(l.holders_of(ip("10.0.0.0")), vec!["d/young".to_string()]);
        l.set_pools(&[pool("p", &["10.0.0.0/30"])]);
        assert_eq!(l.holders_of(ip("10.0.0.0")), vec!["d/young".to_string()]);
        assert_eq!(
            l.answer("d/old").unwrap().as_ref().unwrap().ips,
            vec![ip("10.0.0.1")]
        );
    }

    /// Nobody knows who changed after a restart: of two Services holding
    /// one address on terms that no longer match, the older keeps it.
    #[test]
    fn after_a_restart_the_older_keeps_an_address_its_sharers_no_longer_share() {
        let mut l = Ledger::new();
        l.set_pools(&[pool("p", &["10.0.0.0/30"])]);
        let mut old = svc("old", 1);
        old.sharing_key = Some("k".into());
        old.ports = vec![crate::engine::Port {
            protocol: "TCP".into(),
            port: 1,
        }];
        let mut young = svc("young", 2);
        young.sharing_key = Some("k".into());
        l.upsert(old.clone());
        l.upsert(young.clone());
        let shown = |l: &Ledger, mut s: ServiceRequest| {
            let a = l.answer(&s.key).unwrap().clone().unwrap();
            s.current = a.ips;
            s.current_pool = Some(a.pool);
            s
        };
        let (old, young) = (shown(&l, old), shown(&l, young));
        assert_eq!(old.current, young.current);
        // The younger changes its key: it is refused and moves, the older
        // keeps the address.
        let mut edited = young.clone();
        edited.sharing_key = Some("other".into());
        let changed = l.upsert(edited.clone());
        assert_eq!(changed, BTreeSet::from(["d/young".to_string()]));
        assert!(l.take_refusals().contains_key("d/young"));
        assert_eq!(l.holders_of(ip("10.0.0.0")), vec!["d/old".to_string()]);
        assert_eq!(
            l.answer("d/young").unwrap().as_ref().unwrap().ips,
            vec![ip("10.0.0.1")],
        );
        // A restart before the new status was written: both statuses claim
        // the address. The edited one is made the older, so age alone would
        // give it the address.
        let restart = |old: &ServiceRequest, edited: &ServiceRequest| {
            let mut r = Ledger::new();
            r.load(&[pool("p", &["10.0.0.0/30"])], []);
            let mut young_first = edited.clone();
            young_first.created = Some(0);
            young_first.key = "d/a-young".into();
            r.insert(old.clone());
            r.insert(young_first);
            r.rebuild();
            (
                r.holders_of(ip("10.0.0.0")),
                r.answer("d/old").unwrap().as_ref().unwrap().ips.clone(),
            )
        };
        // Without a record of what the address was given under, nobody
        // knows who changed, so the older keeps it.
        assert_eq!(
            restart(&old, &edited),
            (vec!["d/a-young".to_string()], vec![ip("10.0.0.1")])
        );
        // With the terms each was given under (the allocator records them
        // in the hostlb.io/SharingGranted condition), the edited one is refused, as it
        // was live.
        let granted = |mut s: ServiceRequest, from: &ServiceRequest| {
            s.granted_terms = from.sharing_terms();
            s
        };
        let old = granted(old.clone(), &old);
        let edited = granted(edited, &young);
        assert!(edited.edited_since_grant() && !old.edited_since_grant());
        assert_eq!(
            restart(&old, &edited),
            (vec!["d/old".to_string()], vec![ip("10.0.0.0")])
        );
    }

    /// An accepted edit of a sharer's terms (a new port that still fits)
    /// keeps its address, and is written: the record must follow, or a
    /// restart would take the Service for an edited one.
    #[test]
    fn an_accepted_edit_of_sharing_terms_is_written() {
        let mut l = Ledger::new();
        l.set_pools(&[pool("p", &["10.0.0.0/30"])]);
        let mut s = svc("s", 1);
        s.sharing_key = Some("k".into());
        l.upsert(s.clone());
        let a = l.answer("d/s").unwrap().clone().unwrap();
        s.current = a.ips.clone();
        s.current_pool = Some(a.pool.clone());
        s.granted_terms = s.sharing_terms();
        assert!(l.upsert(s.clone()).is_empty(), "recorded: nothing to write");
        s.ports = vec![crate::engine::Port {
            protocol: "TCP".into(),
            port: 81,
        }];
        assert_eq!(l.upsert(s), BTreeSet::from(["d/s".to_string()]));
        assert_eq!(l.answer("d/s").unwrap().as_ref().unwrap(), &a);
    }

    #[test]
    fn a_service_not_showing_its_unchanged_answer_is_written_again() {
        let mut l = Ledger::new();
        l.set_pools(&[pool("p", &["10.0.0.0/30"])]);
        let mut s = svc("s", 1);
        l.upsert(s.clone());
        let a = l.answer("d/s").unwrap().clone().unwrap();
        s.current = a.ips.clone();
        s.current_pool = Some(a.pool.clone());
        assert!(
            l.upsert(s.clone()).is_empty(),
            "shown as decided: nothing to write"
        );
        // Someone cleared the status: same answer, but it must be written.
        s.current.clear();
        assert_eq!(l.upsert(s), BTreeSet::from(["d/s".to_string()]));
        assert_eq!(l.answer("d/s").unwrap().as_ref().unwrap(), &a);
    }
}
