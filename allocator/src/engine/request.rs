//! What a Service asks of the allocator, and why a request is refused.

use std::net::IpAddr;

use hostlb_api::Family;
use hostlb_api::rules::age_key;

use super::pools::Labels;

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
    pub(super) fn shares_with(&self, other: &Backend) -> bool {
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
    /// The `hostlb.io/SharingGranted` status condition: the [`ServiceRequest::sharing_terms`]
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

    pub(super) fn age(&self) -> (i64, &str) {
        age_key(self.created, &self.key)
    }

    pub(super) fn primary(&self) -> Family {
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

impl std::fmt::Display for Port {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}/{}", self.protocol, self.port)
    }
}
