//! Writing what the allocator decided: Service status and pool annotation,
//! pool status, advertisement status. Every write is a JSON merge patch
//! under one field manager, sent only when something differs, so replaying
//! the same decision writes nothing.

use std::net::IpAddr;

use hostlb_api::annotations::{IP_ALLOCATED_FROM_POOL, SHARING_GRANTED};
use hostlb_api::v1::LAST_VALID_KEPT;
use hostlb_api::v1::conditions::{ADDRESSES_IN_USE, INVALID, OVERLAPS, READY};
use hostlb_api::{IPAddressPool, L2Advertisement};
use k8s_openapi::api::core::v1::Service;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, Time};
use kube::api::{Patch, PatchParams};
use kube::{Api, Client, ResourceExt};
use serde_json::{Value, json};
use tracing::{debug, warn};

use super::FIELD_MANAGER;
use crate::engine::{PoolReport, PoolState};
use crate::ledger::Answer;

fn params() -> PatchParams {
    PatchParams {
        field_manager: Some(FIELD_MANAGER.into()),
        ..Default::default()
    }
}

/// A merge patch of `name` (or of its status) that the server applies by
/// `deadline` or not at all: the `timeout` parameter bounds the request on
/// the server too, where the client giving up would not.
async fn patch_by<K>(
    client: &Client,
    api: &Api<K>,
    name: &str,
    status: bool,
    patch: &Value,
    deadline: tokio::time::Instant,
) -> Result<K, kube::Error>
where
    K: kube::Resource + Clone + serde::de::DeserializeOwned + std::fmt::Debug,
{
    let left = deadline.saturating_duration_since(tokio::time::Instant::now());
    if left.is_zero() {
        return Err(kube::Error::Service("no time left for the write".into()));
    }
    let request = kube::core::Request::new(api.resource_url());
    let patch = Patch::Merge(patch);
    let req = if status {
        request.patch_subresource("status", name, &params(), &patch)
    } else {
        request.patch(name, &params(), &patch)
    }
    .map_err(kube::Error::BuildRequest)?;
    let (mut parts, body) = req.into_parts();
    let uri = parts.uri.to_string();
    let sep = if uri.contains('?') { '&' } else { '?' };
    parts.uri = format!("{uri}{sep}timeout={}ms", left.as_millis().max(1))
        .parse()
        .map_err(|e: http::uri::InvalidUri| kube::Error::Service(e.into()))?;
    client
        .request::<K>(http::Request::from_parts(parts, body))
        .await
}

/// The Service carries our pool annotation: we wrote its addresses.
pub fn ours(svc: &Service) -> bool {
    svc.annotations().contains_key(IP_ALLOCATED_FROM_POOL)
}

/// The Service condition saying whether what the Service asks for
/// (addresses, pool, sharing) is applied: `False` while it keeps the
/// addresses it holds and its request is not met, with the reason.
pub const ADDRESS_REQUEST: &str = "hostlb.io/AddressRequest";

/// What a Service shows of our decision: its ingress addresses, our pool
/// and sharing-terms annotations, and why its request is not applied (our
/// condition).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Shown {
    pub ips: Vec<IpAddr>,
    pub pool: Option<String>,
    pub terms: Option<String>,
    pub pending: Option<String>,
}

fn service_conditions(svc: &Service) -> &[Condition] {
    svc.status
        .as_ref()
        .and_then(|s| s.conditions.as_deref())
        .unwrap_or_default()
}

impl Shown {
    pub fn of(svc: &Service) -> Shown {
        Shown {
            ips: crate::inputs::ingress_ips(svc),
            pool: svc.annotations().get(IP_ALLOCATED_FROM_POOL).cloned(),
            terms: crate::inputs::granted_terms(svc),
            pending: service_conditions(svc)
                .iter()
                .find(|c| c.type_ == ADDRESS_REQUEST && c.status == "False")
                .map(|c| c.message.clone()),
        }
    }

    /// `terms`: the Service's sharing terms now, recorded with the
    /// addresses they are held under.
    pub(super) fn of_answer(answer: Option<&Answer>, terms: Option<String>) -> Shown {
        match answer {
            Some(Ok(a)) => Shown {
                ips: a.ips.clone(),
                pool: Some(a.pool.clone()),
                terms: terms.filter(|_| !a.ips.is_empty()),
                pending: a.pending.as_ref().map(ToString::to_string),
            },
            _ => Shown::default(),
        }
    }
}

/// The Service's conditions with ours set to say `pending` and the sharing
/// `terms` (the condition present only while there are terms); the others
/// as they are.
fn with_our_conditions(
    svc: &Service,
    before: &Shown,
    pending: Option<&String>,
    terms: Option<&String>,
) -> Vec<Condition> {
    let existing = service_conditions(svc);
    let mut ours = Vec::new();
    // A condition is written once something was not applied, and then kept
    // up to date; Services that never had one do not get one. (`before`
    // may be newer than the cached `svc`.)
    let had_request =
        before.pending.is_some() || existing.iter().any(|c| c.type_ == ADDRESS_REQUEST);
    match pending {
        Some(why) => ours.push((ADDRESS_REQUEST, false, "NotApplied", why.clone())),
        None if had_request => ours.push((ADDRESS_REQUEST, true, "Applied", String::new())),
        None => {}
    }
    if let Some(t) = terms {
        ours.push((SHARING_GRANTED, true, "Granted", t.clone()));
    }
    let mut out: Vec<Condition> = existing
        .iter()
        .filter(|c| c.type_ != ADDRESS_REQUEST && c.type_ != SHARING_GRANTED)
        .cloned()
        .collect();
    out.extend(conditions(existing, &ours, None));
    out
}

/// Make the Service show `answer` (no answer or a failure: no address),
/// given that it shows `before` now (which may be newer than `svc`, when the
/// cache has not seen our last write yet). Returns what it shows afterwards
/// and the resourceVersion of the last write, if there was one.
pub async fn write_service(
    client: &Client,
    svc: &Service,
    before: &Shown,
    answer: Option<&Answer>,
    terms: Option<String>,
    deadline: tokio::time::Instant,
) -> Result<(Shown, Option<String>), kube::Error> {
    let want = Shown::of_answer(answer, terms);
    let api: Api<Service> = Api::namespaced(client.clone(), &svc.namespace().unwrap_or_default());
    let name = svc.name_any();
    let mut rv = None;
    // The pool goes before the addresses (readers take the addresses from
    // it); the sharing terms go with them, in the same status write.
    if before.pool != want.pool {
        let patch = json!({"metadata": {"annotations": {IP_ALLOCATED_FROM_POOL: want.pool}}});
        let after = patch_by(client, &api, &name, false, &patch, deadline).await?;
        rv = after.resource_version();
    }
    let mut status = serde_json::Map::new();
    if before.ips != want.ips {
        let ingress: Value = if want.ips.is_empty() {
            Value::Null
        } else {
            Value::Array(
                // ipMode VIP: the address is delivered to the node with its
                // destination unchanged, so kube-proxy may short-circuit
                // in-cluster traffic to it (GA in Kubernetes 1.32; older
                // servers drop the field). Written with the addresses only:
                // a server that drops it must not make every pass write.
                want.ips
                    .iter()
                    .map(|ip| json!({"ip": ip.to_string(), "ipMode": "VIP"}))
                    .collect(),
            )
        };
        status.insert("loadBalancer".into(), json!({"ingress": ingress}));
    }
    if before.pending != want.pending || before.terms != want.terms {
        let conds = with_our_conditions(svc, before, want.pending.as_ref(), want.terms.as_ref());
        status.insert("conditions".into(), json!(conds));
    }
    if !status.is_empty() {
        let patch = json!({ "status": status });
        let after = patch_by(client, &api, &name, true, &patch, deadline).await?;
        rv = after.resource_version();
        debug!(service = %format!("{}/{name}", svc.namespace().unwrap_or_default()), addresses = ?want.ips, pending = ?want.pending, "status written");
    }
    Ok((want, rv))
}

fn now() -> Time {
    Time(jiff::Timestamp::now())
}

/// Conditions with `lastTransitionTime` carried over while the status of a
/// condition does not change.
fn conditions(
    existing: &[Condition],
    wanted: &[(&str, bool, &str, String)],
    generation: Option<i64>,
) -> Vec<Condition> {
    wanted
        .iter()
        .map(|(t, ok, reason, message)| {
            let status = if *ok { "True" } else { "False" };
            let since = existing
                .iter()
                .find(|c| c.type_ == *t && c.status == status)
                .map(|c| c.last_transition_time.clone())
                .unwrap_or_else(now);
            Condition {
                type_: t.to_string(),
                status: status.into(),
                reason: reason.to_string(),
                message: message.clone(),
                last_transition_time: since,
                observed_generation: generation,
            }
        })
        .collect()
}

/// Conditions equal but for their transition times.
fn same_conditions(a: &[Condition], b: &[Condition]) -> bool {
    a.len() == b.len()
        && a.iter().zip(b).all(|(x, y)| {
            x.type_ == y.type_
                && x.status == y.status
                && x.reason == y.reason
                && x.message == y.message
                && x.observed_generation == y.observed_generation
        })
}

fn saturate(n: u128) -> i64 {
    i64::try_from(n).unwrap_or(i64::MAX)
}

/// `new` as a JSON merge patch over `old`: top-level keys that `new` no
/// longer has are set to null, so the stored copy is replaced, not merged.
fn replacing<T: serde::Serialize>(old: Option<&T>, new: Option<&T>) -> Value {
    let Some(new) = new else { return Value::Null };
    let mut value = serde_json::to_value(new).unwrap_or(Value::Null);
    if let (Some(Value::Object(old)), Value::Object(map)) =
        (old.and_then(|o| serde_json::to_value(o).ok()), &mut value)
    {
        for key in old.keys() {
            map.entry(key.clone()).or_insert(Value::Null);
        }
    }
    value
}

/// Write the pool's status when it differs from what the cache shows; the
/// problem if the pool became invalid by this write.
pub async fn write_pool(
    client: &Client,
    pool: &IPAddressPool,
    r: &PoolReport,
    in_use: &[(String, String, String)],
    deadline: tokio::time::Instant,
) -> Result<Option<String>, kube::Error> {
    let existing = pool.status.clone().unwrap_or_default();
    // The engine saw the last valid addresses; the edit is still invalid.
    let kept_state;
    let state = match pool.addresses_in_force() {
        (_, true) => {
            kept_state = PoolState::Invalid(format!(
                "{}{LAST_VALID_KEPT}",
                pool.address_problems().join("; ")
            ));
            &kept_state
        }
        _ => &r.state,
    };
    let (ready, invalid, overlaps) = match state {
        PoolState::Ready => (
            (
                READY,
                true,
                "Valid",
                "addresses are handed out from this pool".to_string(),
            ),
            (INVALID, false, "Valid", String::new()),
            (OVERLAPS, false, "NoOverlap", String::new()),
        ),
        PoolState::Invalid(m) => (
            (
                READY,
                false,
                "Invalid",
                format!("no new addresses from this pool: {m}"),
            ),
            (INVALID, true, "Invalid", m.clone()),
            (OVERLAPS, false, "NoOverlap", String::new()),
        ),
        PoolState::Overlaps(m) => (
            (
                READY,
                false,
                "Overlaps",
                format!("no new addresses from this pool: {m}"),
            ),
            (INVALID, false, "Valid", String::new()),
            (OVERLAPS, true, "Overlaps", m.clone()),
        ),
    };
    let mut ready = ready;
    if let (PoolState::Invalid(m), true) = (state, pool.addresses_in_force().1) {
        // The recorded addresses are what the pool hands out meanwhile.
        ready.3 = format!("this form is not applied: {m}");
    }
    let mut wanted = vec![ready, invalid, overlaps];
    if let Some(c) = in_use_condition(&existing.conditions, in_use) {
        wanted.push(c);
    }
    let conds = conditions(&existing.conditions, &wanted, pool.metadata.generation);
    let want = hostlb_api::v1::IPAddressPoolStatus {
        assigned_ipv4: saturate(r.assigned[0]),
        assigned_ipv6: saturate(r.assigned[1]),
        available_ipv4: saturate(r.available[0]),
        available_ipv6: saturate(r.available[1]),
        conditions: conds,
        last_valid_addresses: if pool.address_problems().is_empty() {
            Some(pool.spec.addresses.clone())
        } else {
            existing.last_valid_addresses.clone()
        },
    };
    let unchanged = existing.assigned_ipv4 == want.assigned_ipv4
        && existing.assigned_ipv6 == want.assigned_ipv6
        && existing.available_ipv4 == want.available_ipv4
        && existing.available_ipv6 == want.available_ipv6
        && same_conditions(&existing.conditions, &want.conditions)
        && existing.last_valid_addresses == want.last_valid_addresses;
    if unchanged {
        return Ok(None);
    }
    let newly = match state {
        PoolState::Invalid(m) => newly_invalid(&existing.conditions, INVALID, m),
        PoolState::Overlaps(m) => newly_invalid(&existing.conditions, OVERLAPS, m),
        PoolState::Ready => None,
    };
    if let PoolState::Invalid(m) | PoolState::Overlaps(m) = state {
        warn!(pool = %r.name, problem = %m, "pool not used for new addresses");
    }
    let api: Api<IPAddressPool> =
        Api::namespaced(client.clone(), &pool.namespace().unwrap_or_default());
    let patch = json!({"status": want});
    patch_by(client, &api, &r.name, true, &patch, deadline).await?;
    Ok(newly)
}

/// `AddressesInUse`: `True` while agents found hosts that are no hostlb
/// nodes answering for addresses of the pool (`address`, `node`, `mac`),
/// naming the first few; `False` once none is left, for a pool that had
/// some; absent on pools that never had any.
fn in_use_condition(
    existing: &[Condition],
    in_use: &[(String, String, String)],
) -> Option<(&'static str, bool, &'static str, String)> {
    const NAMED: usize = 8;
    if in_use.is_empty() {
        return existing
            .iter()
            .any(|c| c.type_ == ADDRESSES_IN_USE)
            .then(|| (ADDRESSES_IN_USE, false, "NoneInUse", String::new()));
    }
    let mut named: Vec<String> = in_use
        .iter()
        .take(NAMED)
        .map(|(address, node, mac)| format!("{address} (MAC {mac}, asked by {node})"))
        .collect();
    if in_use.len() > NAMED {
        named.push(format!("{} more", in_use.len() - NAMED));
    }
    Some((
        ADDRESSES_IN_USE,
        true,
        "AnotherHostAnswers",
        format!(
            "hosts that are no hostlb nodes answer for {}; the agents do not take these addresses until they stop (an address configured by hand, or a DHCP lease?)",
            named.join(", ")
        ),
    ))
}

/// The problem an `Invalid` condition reports that `existing` did not
/// already report: it deserves one Warning Event, a repeat does not.
fn newly_invalid(existing: &[Condition], kind: &str, problem: &str) -> Option<String> {
    let known = existing
        .iter()
        .any(|c| c.type_ == kind && c.status == "True" && c.message == problem);
    (!known).then(|| problem.to_string())
}

/// Write the advertisement's conditions when they differ from the cache;
/// the problem if it became invalid by this write.
pub async fn write_advertisement(
    client: &Client,
    ad: &L2Advertisement,
    deadline: tokio::time::Instant,
) -> Result<Option<String>, kube::Error> {
    let existing = ad.status.clone().unwrap_or_default();
    let verdict = ad.spec.validate();
    let wanted = match &verdict {
        Ok(()) => [
            (
                READY,
                true,
                "Valid",
                "the advertisement is in use".to_string(),
            ),
            (INVALID, false, "Valid", String::new()),
        ],
        Err(m) => [
            (
                READY,
                false,
                "Invalid",
                if existing.last_valid_spec.is_some() {
                    format!("this form is not applied: {m}{LAST_VALID_KEPT}")
                } else {
                    format!("the advertisement is not used: {m}")
                },
            ),
            (INVALID, true, "Invalid", m.clone()),
        ],
    };
    let conds = conditions(&existing.conditions, &wanted, ad.metadata.generation);
    // Recorded for the agents: the form in force while a later edit is
    // invalid.
    let last_valid = match verdict {
        Ok(()) => Some(&ad.spec),
        Err(_) => existing.last_valid_spec.as_ref(),
    };
    if same_conditions(&existing.conditions, &conds)
        && last_valid == existing.last_valid_spec.as_ref()
    {
        return Ok(None);
    }
    let newly = verdict
        .as_ref()
        .err()
        .and_then(|m| newly_invalid(&existing.conditions, INVALID, m));
    if let Err(m) = &verdict {
        warn!(advertisement = %ad.name_any(), problem = %m, "advertisement is invalid");
    }
    let api: Api<L2Advertisement> =
        Api::namespaced(client.clone(), &ad.namespace().unwrap_or_default());
    let patch = json!({"status": {
        "conditions": conds,
        "lastValidSpec": replacing(existing.last_valid_spec.as_ref(), last_valid),
    }});
    patch_by(client, &api, &ad.name_any(), true, &patch, deadline).await?;
    Ok(newly)
}
