//! The allocation engine (SPEC §4): which addresses each LoadBalancer
//! Service gets. Pure and synchronous: the controller feeds it pools,
//! namespace labels and Service requests, and writes what it answers.
//!
//! One [`Allocator`] owns every decision: which address is taken by whom
//! (with the sharing rules), which pool each Service's addresses came from,
//! and the per-pool counts. [`Allocator::reconcile`] is idempotent: an address
//! a Service already holds is kept while it stays valid, so replaying every
//! Service after a restart rebuilds the same state.

mod auto;
pub mod ipset;
pub mod pools;
mod request;
mod requested;
mod sharing;

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::net::IpAddr;

use hostlb_api::Family;
use hostlb_api::address::to_u128;
use hostlb_api::rules::pool_holding;

use ipset::UsedSet;
use pools::family_index;
pub use pools::{AllocationSpec, Labels, Pool, PoolSpec, PoolState};
pub use request::{AllocError, Backend, FamilyPolicy, Port, ServiceRequest};

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Assigned {
    pub pool: String,
    /// Primary family first.
    pub ips: Vec<IpAddr>,
    /// What the Service asks for and does not get, while it keeps `ips`:
    /// an edit never takes a serving address away (a request that cannot be
    /// read or met, a pool that is gone).
    pub pending: Option<AllocError>,
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Outcome {
    /// `Ok(None)`: nothing held and new allocation was not allowed.
    pub result: Result<Option<Assigned>, AllocError>,
    /// Younger Services that lost an address to this one: reconcile them.
    pub evicted: Vec<String>,
    /// This Service's edit no longer fit an address it shared, so it was
    /// refused that address (the others keep it): news for an Event, not a
    /// state, as the Service holds what it was given instead.
    pub refused: Option<AllocError>,
}

/// Counts and state of one pool, for its status.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PoolReport {
    pub name: String,
    pub state: PoolState,
    /// Addresses held by Services that were allocated from this pool.
    pub assigned: [u128; 2],
    /// Addresses of the pool nobody holds.
    pub available: [u128; 2],
}

#[derive(Clone, Debug)]
struct Holding {
    /// The address's terms: what every holder shares it on.
    sharing: Option<String>,
    backend: Backend,
    /// Holders with their ports.
    services: BTreeMap<String, Vec<Port>>,
}

#[derive(Clone, Debug)]
struct Alloc {
    pool: String,
    ips: Vec<IpAddr>,
}

/// What a Service can keep of what it holds.
struct Keep {
    pool: usize,
    ips: Vec<IpAddr>,
    /// Younger Services to take the addresses from (after a restart).
    losers: Vec<String>,
}

/// A Service's request against what it can keep.
enum Change {
    /// Asks for nothing else.
    None,
    /// Cannot be read or names a pool that does not exist.
    Invalid(AllocError),
    /// Other addresses (these, or empty for another pool).
    Valid(Vec<IpAddr>),
}

pub struct Allocator {
    pools: Vec<Pool>,
    by_name: HashMap<String, usize>,
    namespaces: HashMap<String, Labels>,
    used: [UsedSet; 2],
    holders: HashMap<IpAddr, Holding>,
    /// Sharing key → addresses held under it.
    shared: HashMap<String, BTreeSet<IpAddr>>,
    allocs: HashMap<String, Alloc>,
    /// Rank of the Services holding addresses in contests (see
    /// [`ServiceRequest::rank`]).
    ages: HashMap<String, (bool, i64, String)>,
}

impl Default for Allocator {
    fn default() -> Self {
        Allocator::new()
    }
}

fn family_of(ip: IpAddr) -> Family {
    Family::of(ip)
}

impl Allocator {
    pub fn new() -> Self {
        Allocator {
            pools: Vec::new(),
            by_name: HashMap::new(),
            namespaces: HashMap::new(),
            used: [UsedSet::new(Family::V4), UsedSet::new(Family::V6)],
            holders: HashMap::new(),
            shared: HashMap::new(),
            allocs: HashMap::new(),
            ages: HashMap::new(),
        }
    }

    /// Replace the pools. Addresses already held stay held; reconcile every
    /// Service afterwards to apply the new pools to them.
    pub fn set_pools(&mut self, specs: &[PoolSpec]) {
        self.pools = pools::compile(specs);
        self.by_name = self
            .pools
            .iter()
            .enumerate()
            .map(|(i, p)| (p.name.clone(), i))
            .collect();
    }

    pub fn pools(&self) -> &[Pool] {
        &self.pools
    }

    pub fn set_namespace(&mut self, name: &str, labels: Labels) {
        self.namespaces.insert(name.to_string(), labels);
    }

    pub fn remove_namespace(&mut self, name: &str) {
        self.namespaces.remove(name);
    }

    pub fn knows_namespace(&self, name: &str) -> bool {
        self.namespaces.contains_key(name)
    }

    /// What a Service holds, if anything.
    pub fn allocation(&self, key: &str) -> Option<Assigned> {
        self.allocs.get(key).map(|a| Assigned {
            pool: a.pool.clone(),
            ips: a.ips.clone(),
            pending: None,
        })
    }

    /// Services holding `ip`.
    pub fn holders_of(&self, ip: IpAddr) -> Vec<String> {
        self.holders
            .get(&ip)
            .map(|h| h.services.keys().cloned().collect())
            .unwrap_or_default()
    }

    pub fn allocated_count(&self) -> usize {
        self.allocs.len()
    }

    /// Let go of everything a Service holds (deleted, no longer a handled
    /// LoadBalancer).
    pub fn release(&mut self, key: &str) -> bool {
        let Some(alloc) = self.allocs.remove(key) else {
            return false;
        };
        self.ages.remove(key);
        for ip in alloc.ips {
            let Some(h) = self.holders.get_mut(&ip) else {
                continue;
            };
            h.services.remove(key);
            if h.services.is_empty() {
                let h = self.holders.remove(&ip).expect("present");
                self.used[family_index(family_of(ip))].remove(to_u128(ip));
                if let Some(k) = h.sharing
                    && let Some(set) = self.shared.get_mut(&k)
                {
                    set.remove(&ip);
                    if set.is_empty() {
                        self.shared.remove(&k);
                    }
                }
            }
        }
        true
    }

    fn assign(&mut self, svc: &ServiceRequest, pool: &str, ips: &[IpAddr]) {
        self.release(&svc.key);
        for &ip in ips {
            let h = self.holders.entry(ip).or_insert_with(|| Holding {
                sharing: svc.sharing_key.clone(),
                backend: svc.backend.clone(),
                services: BTreeMap::new(),
            });
            if h.services.is_empty() {
                h.sharing = svc.sharing_key.clone();
                h.backend = svc.backend.clone();
            }
            h.services.insert(svc.key.clone(), svc.ports.clone());
            self.used[family_index(family_of(ip))].insert(to_u128(ip));
            if let Some(k) = &svc.sharing_key {
                self.shared.entry(k.clone()).or_default().insert(ip);
            }
        }
        self.allocs.insert(
            svc.key.clone(),
            Alloc {
                pool: pool.to_string(),
                ips: ips.to_vec(),
            },
        );
        let (edited, t, k) = svc.rank();
        self.ages
            .insert(svc.key.clone(), (edited, t, k.to_string()));
    }

    /// The pool that holds `ip` (the oldest that contains it), by name.
    pub fn pool_holding(&self, ip: IpAddr) -> Option<&str> {
        self.pool_of(&[ip], None)
            .map(|i| self.pools[i].name.as_str())
    }

    /// The pool addresses `ips` belong to: the one named by the Service's
    /// annotation when it holds them all, else the oldest one that does.
    fn pool_of(&self, ips: &[IpAddr], hint: Option<&str>) -> Option<usize> {
        pool_holding(&self.pools, hint, ips, |p| &p.name, Pool::contains)
    }

    fn admits(&self, p: &Pool, svc: &ServiceRequest) -> bool {
        p.admits(
            &svc.namespace,
            self.namespaces.get(&svc.namespace),
            &svc.labels,
        )
    }

    /// Decide the Service's addresses: keep what it holds while valid, else
    /// allocate (when `allow_new`). Idempotent.
    ///
    /// What it holds is taken away only when it cannot be held any more (its
    /// pool or namespace no longer admit it, an older Service claims it
    /// after a restart), never for an edit of the Service itself: a request
    /// for other addresses or another pool moves it only once the new
    /// request is met, and until then (or while the request cannot even be
    /// read) it keeps what it holds, with the reason in `pending`.
    pub fn reconcile(&mut self, svc: &ServiceRequest, allow_new: bool) -> Outcome {
        let mut evicted = Vec::new();
        let request = self.check_requested(svc);
        let held = self.held(svc);
        let mut refused = None;
        if !held.is_empty() {
            let named: &[IpAddr] = request.as_deref().unwrap_or(&[]);
            let keep = self.check_keep(svc, &held, named, allow_new, true);
            if let Err(e @ AllocError::ChangeRefused { .. }) = &keep {
                refused = Some(e.clone());
            }
            if let Ok(keep) = keep {
                let pool_name = self.pools[keep.pool].name.clone();
                let mut pending = None;
                let moved = match self.request_change(svc, &keep, &pool_name, &request) {
                    Change::None => None,
                    Change::Invalid(e) => {
                        pending.get_or_insert(e);
                        None
                    }
                    Change::Valid(_) if !allow_new => None,
                    Change::Valid(requested) => match self.allocate_requested(svc, &requested) {
                        Ok(m) => Some(m),
                        Err(e) => {
                            pending.get_or_insert(e);
                            None
                        }
                    },
                };
                let (pool, ips, losers) = moved.unwrap_or((keep.pool, keep.ips, keep.losers));
                self.evict(&losers);
                evicted.extend(losers);
                let name = self.pools[pool].name.clone();
                self.assign(svc, &name, &ips);
                return Outcome {
                    result: Ok(Some(Assigned {
                        pool: name,
                        ips,
                        pending,
                    })),
                    evicted,
                    refused: None,
                };
            }
        }
        self.release(&svc.key);
        let requested = match request {
            Ok(r) => r,
            Err(e) => {
                return Outcome {
                    result: Err(e),
                    evicted,
                    refused,
                };
            }
        };
        if !allow_new {
            return Outcome {
                result: Ok(None),
                evicted,
                refused,
            };
        }
        // A Service refused the address it shared gets a new one as any
        // Service would, and is told why it moved.
        let result = match self.allocate_requested(svc, &requested) {
            Ok((pool, ips, losers)) => {
                self.evict(&losers);
                evicted.extend(losers);
                let name = self.pools[pool].name.clone();
                self.assign(svc, &name, &ips);
                Ok(Some(Assigned {
                    pool: name,
                    ips,
                    pending: None,
                }))
            }
            Err(e) => Err(e),
        };
        Outcome {
            result,
            evicted,
            refused,
        }
    }

    /// The addresses the Service holds: its status, else what it was given
    /// here and has not shown yet.
    fn held(&self, svc: &ServiceRequest) -> Vec<IpAddr> {
        let mut held: Vec<IpAddr> = Vec::new();
        for ip in &svc.current {
            if !held.contains(ip) {
                held.push(*ip);
            }
        }
        if held.is_empty()
            && let Some(a) = self.allocs.get(&svc.key)
        {
            held = a.ips.clone();
        }
        held
    }

    /// Hold what the Service holds without judging it against its namespace
    /// (not known yet) or its request, so that nobody else is given those
    /// addresses before it can be judged. Takes nothing from anyone: an
    /// address held by another Service that cannot share stays theirs.
    /// Returns whether anything is held.
    pub fn reserve(&mut self, svc: &ServiceRequest) -> bool {
        let held = self.held(svc);
        if held.is_empty() {
            return false;
        }
        match self.check_keep(svc, &held, &[], false, false) {
            Ok(keep) if keep.losers.is_empty() => {
                let name = self.pools[keep.pool].name.clone();
                self.assign(svc, &name, &keep.ips);
                true
            }
            _ => {
                self.release(&svc.key);
                false
            }
        }
    }

    /// Per-pool state and counts, for pool status.
    pub fn report(&self) -> Vec<PoolReport> {
        let mut held: HashMap<&str, BTreeSet<IpAddr>> = HashMap::new();
        for a in self.allocs.values() {
            held.entry(a.pool.as_str())
                .or_default()
                .extend(a.ips.iter().copied());
        }
        self.pools
            .iter()
            .map(|p| {
                let mut assigned = [0u128; 2];
                for ip in held.get(p.name.as_str()).into_iter().flatten() {
                    assigned[family_index(family_of(*ip))] += 1;
                }
                let mut available = [0u128; 2];
                for f in [Family::V4, Family::V6] {
                    let i = family_index(f);
                    let set = &self.used[i];
                    let used: u128 = p.spans[i]
                        .iter()
                        .map(|&(lo, hi)| {
                            if p.avoid_buggy_ips {
                                set.count_in_skipping_buggy(lo, hi)
                            } else {
                                set.count_in(lo, hi)
                            }
                        })
                        .sum();
                    // Nothing is available from a pool that hands nothing out.
                    available[i] = if p.usable() {
                        p.capacity[i].saturating_sub(used)
                    } else {
                        0
                    };
                }
                PoolReport {
                    name: p.name.clone(),
                    state: p.state.clone(),
                    assigned,
                    available,
                }
            })
            .collect()
    }
}

#[cfg(test)]
mod tests;
