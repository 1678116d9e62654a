//! The allocation engine (SPEC §4): which addresses each LoadBalancer
//! Service gets. Pure and synchronous: the controller feeds it pools,
//! namespace labels and Service requests, and writes what it answers.
//!
//! One [`Allocator`] owns every decision: which address is taken by whom
//! (with the sharing rules), which pool each Service's addresses came from,
//! and the per-pool counts. [`Allocator::reconcile`] is idempotent: an address
//! a Service already holds is kept while it stays valid, so replaying every
//! Service after a restart rebuilds the same state.

pub mod ipset;
pub mod pools;

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::net::IpAddr;

use hostlb_api::Family;
use hostlb_api::address::{from_u128, to_u128};
use hostlb_api::rules::{age_key, pool_holding};

use ipset::{UsedSet, is_buggy};
use pools::family_index;
pub use pools::{AllocationSpec, Labels, Pool, PoolSpec, PoolState};

#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum FamilyPolicy {
    #[default]
    SingleStack,
    PreferDualStack,
    RequireDualStack,
}

#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Port {
    pub protocol: String,
    pub port: i32,
}

impl std::fmt::Display for Port {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}/{}", self.protocol, self.port)
    }
}

/// Where a Service's traffic goes, as far as sharing an address goes:
/// Services on one address are announced from one node, so with
/// `externalTrafficPolicy: Local` they must have their endpoints on the same
/// nodes.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub enum Backend {
    /// `externalTrafficPolicy: Cluster`: every node forwards.
    #[default]
    Cluster,
    /// `Local` with this pod selector (`k=v` pairs, sorted, comma-separated):
    /// the same selector means the same pods.
    Local(String),
    /// `Local` without a selector: its endpoints are set by hand, in
    /// EndpointSlices the allocator does not watch, so nothing can show they
    /// are another Service's. It shares with no Service.
    LocalUnselected,
}

impl Backend {
    fn shares_with(&self, other: &Backend) -> bool {
        match (self, other) {
            (Backend::Cluster, Backend::Cluster) => true,
            (Backend::Local(a), Backend::Local(b)) => a == b,
            _ => false,
        }
    }
}

/// A Service as the engine sees it.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct ServiceRequest {
    /// `namespace/name`.
    pub key: String,
    pub namespace: String,
    pub labels: Labels,
    /// Creation time in seconds; the older Service keeps a contested address.
    pub created: Option<i64>,
    pub primary: Option<Family>,
    pub policy: FamilyPolicy,
    /// `spec.ipFamilies` as the API server filled it in: on a single-stack
    /// cluster PreferDualStack lists one family, and only that one is wanted.
    pub families: Vec<Family>,
    /// Addresses asked for (`hostlb.io/loadBalancerIPs` or
    /// `spec.loadBalancerIP`).
    pub requested: Vec<IpAddr>,
    /// Why the requested addresses could not be read, if they could not.
    pub request_error: Option<String>,
    /// `hostlb.io/address-pool`.
    pub requested_pool: Option<String>,
    /// `hostlb.io/allow-shared-ip`.
    pub sharing_key: Option<String>,
    /// Where its traffic goes: sharing needs the same.
    pub backend: Backend,
    pub ports: Vec<Port>,
    /// Addresses in `status.loadBalancer.ingress`.
    pub current: Vec<IpAddr>,
    /// `hostlb.io/ip-allocated-from-pool`.
    pub current_pool: Option<String>,
    /// `hostlb.io/allocated-sharing`: the [`ServiceRequest::sharing_terms`]
    /// its shared address was given under.
    pub granted_terms: Option<String>,
}

impl ServiceRequest {
    /// What sharing an address depends on, as one string: the key, the
    /// ports and where the traffic goes. `None` without a sharing key.
    pub fn sharing_terms(&self) -> Option<String> {
        let key = self.sharing_key.as_ref()?;
        let mut ports: Vec<String> = self.ports.iter().map(ToString::to_string).collect();
        ports.sort();
        let backend = match &self.backend {
            Backend::Cluster => "Cluster".to_string(),
            Backend::Local(selector) => format!("Local({selector})"),
            Backend::LocalUnselected => "Local".to_string(),
        };
        Some(format!(
            "key={key} ports={} traffic={backend}",
            ports.join(",")
        ))
    }

    /// Its sharing terms changed since its address was given: of two
    /// Services found claiming one address, this is the one that moved.
    pub fn edited_since_grant(&self) -> bool {
        self.granted_terms.is_some() && self.granted_terms != self.sharing_terms()
    }

    /// Who wins a contest over an address found in two statuses (after a
    /// restart, or in `plan`): a Service still on the terms it was given
    /// the address under before one that changed them, as live; then the
    /// older.
    pub(crate) fn rank(&self) -> (bool, i64, &str) {
        let (t, k) = self.age();
        (self.edited_since_grant(), t, k)
    }

    fn age(&self) -> (i64, &str) {
        age_key(self.created, &self.key)
    }

    fn primary(&self) -> Family {
        self.primary.unwrap_or(Family::V4)
    }

    /// The families to allocate, primary first.
    pub(crate) fn wanted(&self) -> Vec<Family> {
        let p = self.primary();
        let other = if p == Family::V4 {
            Family::V6
        } else {
            Family::V4
        };
        match self.policy {
            FamilyPolicy::SingleStack => vec![p],
            FamilyPolicy::PreferDualStack if self.families.len() == 1 => vec![p],
            _ => vec![p, other],
        }
    }
}

/// Why a Service got no address, in words a person can act on.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum AllocError {
    #[error("{0}")]
    BadRequest(String),
    #[error("requested address {0} is not in any IPAddressPool")]
    NotInPool(IpAddr),
    #[error("requested addresses {0} and {1} are in different pools")]
    DifferentPools(IpAddr, IpAddr),
    #[error("requested address {ip} is in pool {pool}, not in the requested pool {requested}")]
    NotInRequestedPool {
        ip: IpAddr,
        pool: String,
        requested: String,
    },
    #[error("pool {0} does not exist")]
    UnknownPool(String),
    #[error("pool {pool} cannot be used: {why}")]
    PoolUnusable { pool: String, why: String },
    #[error("pool {0} does not serve this Service (its serviceAllocation excludes it)")]
    NotAdmitted(String),
    #[error("{ip} is in use by {holder}: {why}")]
    InUse {
        ip: IpAddr,
        holder: String,
        why: String,
    },
    #[error("{ip} ends in .0 or .255 and pool {pool} has avoidBuggyIPs")]
    Buggy { ip: IpAddr, pool: String },
    #[error("the Service is {wanted}, but {ip} is {got}")]
    WrongFamily {
        ip: IpAddr,
        wanted: String,
        got: Family,
    },
    #[error("pool {pool} has no {family} addresses ({policy:?} needs one)")]
    NoFamily {
        pool: String,
        family: Family,
        policy: FamilyPolicy,
    },
    #[error("no available addresses in pool {0}")]
    Exhausted(String),
    #[error("no available {family} addresses in pool {pool}")]
    ExhaustedFamily { pool: String, family: Family },
    #[error("no available addresses in pools {0}")]
    ExhaustedAll(String),
    #[error("no IPAddressPool serves this Service (none with autoAssign admits it)")]
    NoPool,
    #[error("{ip} stays with {holder}, which shares it: {why}")]
    ChangeRefused {
        ip: IpAddr,
        holder: String,
        why: String,
    },
}

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

/// Why `svc` cannot share an address held on these terms, if it cannot.
fn terms_conflict(
    sharing: &Option<String>,
    backend: &Backend,
    svc: &ServiceRequest,
) -> Option<String> {
    Some(match (sharing, &svc.sharing_key) {
        (None, _) => "it does not allow sharing (no hostlb.io/allow-shared-ip)".to_string(),
        (_, None) => "this Service does not allow sharing (no hostlb.io/allow-shared-ip)".to_string(),
        (Some(a), Some(b)) if a != b => format!("sharing key {b:?} differs from {a:?}"),
        _ if [backend, &svc.backend].contains(&&Backend::LocalUnselected) => {
            "a Service with externalTrafficPolicy: Local and no selector shares with none (its endpoints cannot be compared)".to_string()
        }
        _ if !backend.shares_with(&svc.backend) => {
            "shared addresses need externalTrafficPolicy: Cluster on all Services, or the same pod selector".to_string()
        }
        _ => return None,
    })
}

/// The first of `others` using a port `svc` uses, and the words for it.
fn port_clash(svc: &ServiceRequest, others: &[(&String, &Vec<Port>)]) -> Option<(String, String)> {
    others.iter().find_map(|(k, ports)| {
        svc.ports
            .iter()
            .find(|p| ports.contains(p))
            .map(|p| ((*k).clone(), format!("port {p} is used by {k}")))
    })
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

    /// Whether `svc` may hold `ip` next to its current holders; `Err` names
    /// the holder and the rule broken.
    fn shareable(&self, svc: &ServiceRequest, ip: IpAddr) -> Result<(), (String, String)> {
        let Some(h) = self.holders.get(&ip) else {
            return Ok(());
        };
        let others: Vec<(&String, &Vec<Port>)> =
            h.services.iter().filter(|(k, _)| **k != svc.key).collect();
        let Some((first, _)) = others.first() else {
            return Ok(());
        };
        let holder = (*first).clone();
        if let Some(why) = terms_conflict(&h.sharing, &h.backend, svc) {
            return Err((holder, why));
        }
        match port_clash(svc, &others) {
            Some((_, why)) => Err((holder, why)),
            None => Ok(()),
        }
    }

    /// The Services that must give `ip` up for `svc`, when `svc` is older
    /// than all of them; otherwise why it cannot have it.
    fn contest(&self, svc: &ServiceRequest, ip: IpAddr) -> Result<Vec<String>, AllocError> {
        match self.shareable(svc, ip) {
            Ok(()) => Ok(Vec::new()),
            Err((holder, why)) => {
                let h = &self.holders[&ip];
                let others: Vec<&String> = h.services.keys().filter(|k| **k != svc.key).collect();
                let mine = svc.rank();
                let older_than_all = others.iter().all(|k| {
                    self.ages.get(*k).is_some_and(|(edited, t, name)| {
                        (mine.0, mine.1, mine.2) < (*edited, *t, name.as_str())
                    })
                });
                if older_than_all {
                    Ok(others.into_iter().cloned().collect())
                } else {
                    Err(AllocError::InUse { ip, holder, why })
                }
            }
        }
    }

    fn evict(&mut self, keys: &[String]) {
        for k in keys {
            self.release(k);
        }
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

    /// New addresses as the Service asks for them: the addresses it names,
    /// else from the pool it names, else from the pools that admit it.
    fn allocate_requested(
        &self,
        svc: &ServiceRequest,
        requested: &[IpAddr],
    ) -> Result<(usize, Vec<IpAddr>, Vec<String>), AllocError> {
        if !requested.is_empty() {
            return self.assign_requested(svc, requested);
        }
        let (pool, ips) = if let Some(name) = &svc.requested_pool {
            let Some(&i) = self.by_name.get(name) else {
                return Err(AllocError::UnknownPool(name.clone()));
            };
            let p = &self.pools[i];
            if let PoolState::Invalid(why) | PoolState::Overlaps(why) = &p.state {
                return Err(AllocError::PoolUnusable {
                    pool: name.clone(),
                    why: why.clone(),
                });
            }
            if !self.admits(p, svc) {
                return Err(AllocError::NotAdmitted(name.clone()));
            }
            (i, self.allocate_in(svc, i)?)
        } else {
            self.allocate_auto(svc)?
        };
        Ok((pool, ips, Vec::new()))
    }

    /// How the Service's request (addresses, pool) stands against what it
    /// can keep.
    fn request_change(
        &self,
        svc: &ServiceRequest,
        keep: &Keep,
        pool: &str,
        request: &Result<Vec<IpAddr>, AllocError>,
    ) -> Change {
        let requested = match request {
            Ok(r) => r,
            Err(e) => return Change::Invalid(e.clone()),
        };
        if let Some(name) = &svc.requested_pool
            && !self.by_name.contains_key(name)
        {
            return Change::Invalid(AllocError::UnknownPool(name.clone()));
        }
        let same_ips = requested.is_empty()
            || requested.iter().collect::<BTreeSet<_>>() == keep.ips.iter().collect();
        let same_pool = svc.requested_pool.as_deref().is_none_or(|r| r == pool);
        if same_ips && same_pool {
            Change::None
        } else {
            Change::Valid(requested.clone())
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

    /// Requested addresses, checked against the Service's families.
    fn check_requested(&self, svc: &ServiceRequest) -> Result<Vec<IpAddr>, AllocError> {
        if let Some(e) = &svc.request_error {
            return Err(AllocError::BadRequest(e.clone()));
        }
        let ips = svc.requested.clone();
        let wanted = svc.wanted();
        for ip in &ips {
            let f = family_of(*ip);
            if !wanted.contains(&f) {
                return Err(AllocError::WrongFamily {
                    ip: *ip,
                    wanted: format!("{} {:?}", svc.primary(), svc.policy),
                    got: f,
                });
            }
        }
        if svc.policy == FamilyPolicy::RequireDualStack && ips.len() == 1 {
            return Err(AllocError::BadRequest(
                "ipFamilyPolicy RequireDualStack needs one requested address per family".into(),
            ));
        }
        Ok(ips)
    }

    /// Whether the Service can keep `held` (its request aside, see
    /// [`Allocator::request_change`]): the pool, the addresses to hold
    /// (families adjusted to its policy, none added when it names its
    /// addresses in `requested`) and the younger Services to evict. Without
    /// `judge`, only whether the
    /// addresses can be held at all, not whether the Service's namespace
    /// still wants them.
    fn check_keep(
        &self,
        svc: &ServiceRequest,
        held: &[IpAddr],
        requested: &[IpAddr],
        allow_new: bool,
        judge: bool,
    ) -> Result<Keep, AllocError> {
        let wanted = svc.wanted();
        // Keep the wanted families only, one address each.
        let mut ips: Vec<IpAddr> = Vec::new();
        for f in &wanted {
            if let Some(ip) = held.iter().find(|ip| family_of(**ip) == *f) {
                ips.push(*ip);
            }
        }
        if ips.is_empty()
            || (svc.policy == FamilyPolicy::SingleStack && family_of(ips[0]) != svc.primary())
        {
            return Err(AllocError::BadRequest(
                "held addresses do not match the Service's families".into(),
            ));
        }
        let pool = self
            .pool_of(&ips, svc.current_pool.as_deref())
            .ok_or(AllocError::NotInPool(ips[0]))?;
        let p = &self.pools[pool];
        if judge && !self.admits(p, svc) {
            return Err(AllocError::NotAdmitted(p.name.clone()));
        }
        let mut losers = Vec::new();
        for ip in &ips {
            if p.avoid_buggy_ips && is_buggy(family_of(*ip), to_u128(*ip)) {
                return Err(AllocError::Buggy {
                    ip: *ip,
                    pool: p.name.clone(),
                });
            }
            let member = self
                .holders
                .get(ip)
                .is_some_and(|h| h.services.contains_key(&svc.key));
            if !member {
                // Claimed from the status alone (after a restart): nobody
                // can know who changed, so the older Service wins.
                losers.extend(self.contest(svc, *ip)?);
            } else if let Err((holder, why)) = self.shareable(svc, *ip) {
                // It shares the address and its edit no longer fits the
                // others: it is the one refused, whatever the ages.
                return Err(AllocError::ChangeRefused {
                    ip: *ip,
                    holder,
                    why,
                });
            }
        }
        // Families the policy wants and the pool can still give, unless the
        // Service named its addresses.
        for f in &wanted {
            if !judge || !requested.is_empty() || ips.iter().any(|ip| family_of(*ip) == *f) {
                continue;
            }
            let added = if allow_new && p.usable() && p.has_family(*f) {
                self.pick(svc, p, *f)
            } else {
                None
            };
            match added {
                Some(ip) => ips.push(ip),
                None if svc.policy == FamilyPolicy::RequireDualStack => {
                    return Err(AllocError::NoFamily {
                        pool: p.name.clone(),
                        family: *f,
                        policy: svc.policy,
                    });
                }
                None => {}
            }
        }
        ips.sort_by_key(|ip| family_of(*ip) != svc.primary());
        losers.sort();
        losers.dedup();
        Ok(Keep { pool, ips, losers })
    }

    fn assign_requested(
        &self,
        svc: &ServiceRequest,
        requested: &[IpAddr],
    ) -> Result<(usize, Vec<IpAddr>, Vec<String>), AllocError> {
        let mut pool: Option<usize> = None;
        for ip in requested {
            let i = self
                .pool_of(&[*ip], svc.requested_pool.as_deref())
                .ok_or(AllocError::NotInPool(*ip))?;
            match pool {
                Some(j) if j != i => {
                    return Err(AllocError::DifferentPools(requested[0], *ip));
                }
                _ => pool = Some(i),
            }
        }
        let i = pool.expect("at least one requested address");
        let p = &self.pools[i];
        if let Some(r) = &svc.requested_pool
            && *r != p.name
        {
            return Err(AllocError::NotInRequestedPool {
                ip: requested[0],
                pool: p.name.clone(),
                requested: r.clone(),
            });
        }
        if let PoolState::Invalid(why) | PoolState::Overlaps(why) = &p.state {
            return Err(AllocError::PoolUnusable {
                pool: p.name.clone(),
                why: why.clone(),
            });
        }
        if !self.admits(p, svc) {
            return Err(AllocError::NotAdmitted(p.name.clone()));
        }
        for ip in requested {
            if p.avoid_buggy_ips && is_buggy(family_of(*ip), to_u128(*ip)) {
                return Err(AllocError::Buggy {
                    ip: *ip,
                    pool: p.name.clone(),
                });
            }
            // A request only gets a free or shareable address: asking for an
            // address never takes it from the Service holding it, whatever
            // their ages (that contest is for addresses already in status).
            if let Err((holder, why)) = self.shareable(svc, *ip) {
                return Err(AllocError::InUse {
                    ip: *ip,
                    holder,
                    why,
                });
            }
        }
        let mut ips = requested.to_vec();
        ips.sort_by_key(|ip| family_of(*ip) != svc.primary());
        Ok((i, ips, Vec::new()))
    }

    /// The lowest address of family `f` in pool `p` that `svc` may take:
    /// free, or shared under its key; ranges in the order written.
    fn pick(&self, svc: &ServiceRequest, p: &Pool, f: Family) -> Option<IpAddr> {
        let used = &self.used[family_index(f)];
        for r in p.ranges.iter().filter(|r| r.family() == f) {
            let (lo, hi) = r.bounds();
            let free = used
                .first_free(lo, hi, p.avoid_buggy_ips)
                .map(|x| from_u128(f, x));
            let shared = svc.sharing_key.as_ref().and_then(|k| {
                self.shared
                    .get(k)?
                    .range(r.first()..=r.last())
                    .copied()
                    .find(|ip| {
                        !(p.avoid_buggy_ips && is_buggy(f, to_u128(*ip)))
                            && self.shareable(svc, *ip).is_ok()
                    })
            });
            let best = match (free, shared) {
                (Some(a), Some(b)) => Some(a.min(b)),
                (a, b) => a.or(b),
            };
            if best.is_some() {
                return best;
            }
        }
        None
    }

    /// Addresses for every wanted family from pool `i`. The primary family
    /// is always required (a PreferDualStack Service that cannot get it here
    /// tries the next pool); the other only with RequireDualStack.
    fn allocate_in(&self, svc: &ServiceRequest, i: usize) -> Result<Vec<IpAddr>, AllocError> {
        let p = &self.pools[i];
        let mut ips = Vec::new();
        for (n, f) in svc.wanted().into_iter().enumerate() {
            let required = n == 0 || svc.policy == FamilyPolicy::RequireDualStack;
            if !p.has_family(f) {
                if required {
                    return Err(AllocError::NoFamily {
                        pool: p.name.clone(),
                        family: f,
                        policy: svc.policy,
                    });
                }
                continue;
            }
            match self.pick(svc, p, f) {
                Some(ip) => ips.push(ip),
                None if !required => {}
                None if n > 0 => {
                    return Err(AllocError::ExhaustedFamily {
                        pool: p.name.clone(),
                        family: f,
                    });
                }
                None => return Err(AllocError::Exhausted(p.name.clone())),
            }
        }
        Ok(ips)
    }

    fn allocate_auto(&self, svc: &ServiceRequest) -> Result<(usize, Vec<IpAddr>), AllocError> {
        let mut candidates: Vec<usize> = (0..self.pools.len())
            .filter(|&i| {
                let p = &self.pools[i];
                p.usable() && p.auto_assign && self.admits(p, svc)
            })
            .collect();
        candidates.sort_by(|a, b| self.pools[*a].order_key().cmp(&self.pools[*b].order_key()));
        let mut last = None;
        for &i in &candidates {
            match self.allocate_in(svc, i) {
                Ok(ips) => return Ok((i, ips)),
                Err(e) => last = Some(e),
            }
        }
        match (candidates.len(), last) {
            (0, _) | (_, None) => Err(AllocError::NoPool),
            (1, Some(e)) => Err(e),
            (_, Some(_)) => Err(AllocError::ExhaustedAll(
                candidates
                    .iter()
                    .map(|i| self.pools[*i].name.as_str())
                    .collect::<Vec<_>>()
                    .join(", "),
            )),
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
