//! `kubectl hostlb explain svc/NAME`: the election for each address of a
//! Service, computed as every agent computes it (the same code) from the
//! live objects and the membership the agents' records publish; whether
//! the node that says it announces (the annotation) agrees, and where it
//! does not, what would explain it.

use hostlb_api::Family;
use k8s_openapi::api::core::v1::Service;
use lbnodeagent::agent::status::VipDoc;
use lbnodeagent::election::VipReport;
use lbnodeagent::simulate::render_vip;
use serde::Serialize;

use crate::status::{addresses, announcing, routed};
use crate::{Fleet, Output};

#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct ExplainDoc {
    pub service: String,
    /// The nodes the election counts as members: agents running and
    /// standing, by their records.
    pub members: Vec<String>,
    /// Nodes in maintenance and why (drained by their record, or out of
    /// service by the taint): each elected after every node that is not.
    pub maintenance: Vec<String>,
    pub addresses: Vec<AddressDoc>,
}

#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct AddressDoc {
    /// The election in full, for the table.
    #[serde(skip)]
    pub report: VipReport,
    pub election: VipDoc,
    /// `NODE,IFACE` of the announcing annotation, if any.
    pub announced_by: Option<String>,
    /// The virtual announcing annotation (`NODE,NODE,...`), if any.
    pub routed_by: Option<String>,
    /// Whether it names the nodes the computation puts the address on
    /// virtual interfaces of.
    pub routed_agrees: bool,
    pub agrees: bool,
    /// What would explain a disagreement, most likely first.
    pub why: Vec<String>,
    /// What the agents' firewall lets reach the address (`80/tcp`, ...;
    /// ICMP too), from every Service sharing it; `None` when it is a
    /// Node's own address, which the firewall leaves alone.
    pub open: Option<Vec<String>>,
}

#[derive(Debug, thiserror::Error)]
pub enum ExplainError {
    #[error("{0}: expected svc/NAME (or service/NAME)")]
    Target(String),
    #[error("no Service {0} in namespace {1}")]
    NotFound(String, String),
    #[error("Service {0} is not a LoadBalancer that hostlb handles")]
    NotOurs(String),
}

/// `svc/NAME`, `service/NAME` or `services/NAME`: the name.
pub fn service_name(target: &str) -> Result<&str, ExplainError> {
    match target.split_once('/') {
        Some(("svc" | "service" | "services", name)) if !name.is_empty() => Ok(name),
        _ => Err(ExplainError::Target(target.to_string())),
    }
}

/// The LoadBalancer Service `namespace/name` that hostlb handles, or why
/// there is none.
pub fn handled<'a>(
    fleet: &'a Fleet,
    namespace: &str,
    name: &str,
) -> Result<&'a Service, ExplainError> {
    let svc = fleet
        .services
        .iter()
        .find(|s| {
            s.metadata.namespace.as_deref() == Some(namespace)
                && s.metadata.name.as_deref() == Some(name)
        })
        .ok_or_else(|| ExplainError::NotFound(name.into(), namespace.into()))?;
    if !fleet.scope.handles(svc) {
        return Err(ExplainError::NotOurs(format!("{namespace}/{name}")));
    }
    Ok(svc)
}

pub fn explain(fleet: &Fleet, namespace: &str, name: &str) -> Result<ExplainDoc, ExplainError> {
    let svc = handled(fleet, namespace, name)?;
    let election = fleet.election();
    let firewall = lbnodeagent::model::Firewall::of(&fleet.cluster().0);
    let mut members: Vec<String> = lbnodeagent::agent::record::members_of(&fleet.agents, fleet.now)
        .into_iter()
        .map(|m| m.node.to_string())
        .collect();
    members.sort();
    let addresses = addresses(svc)
        .into_iter()
        .filter_map(|ip| {
            let report = election.explain(ip)?;
            let announced = announcing(svc, Family::of(ip));
            let agrees = match (&report.winner, &announced) {
                (Some(w), Some((n, _))) => w == n,
                (None, None) => true,
                _ => false,
            };
            let routed_by = routed(svc, Family::of(ip));
            let computed = (!report.virtual_nodes.is_empty())
                .then(|| hostlb_api::annotations::virtual_value(&report.virtual_nodes));
            let routed_agrees = routed_by == computed;
            let mut why = if agrees {
                Vec::new()
            } else {
                reasons(
                    fleet,
                    report.winner.as_deref(),
                    announced.as_ref().map(|(n, _)| n.as_str()),
                )
            };
            if !routed_agrees {
                why.push(
                    "the virtual annotation is written by the first live member by name: it may not have caught up yet, or the members it sees differ from the records'".into(),
                );
            }
            let open = firewall.vips.contains(&ip).then(|| {
                firewall
                    .open
                    .iter()
                    .filter(|(at, _)| *at == ip)
                    .map(|(_, p)| format!("{}/{}", p.port, p.protocol.as_str()))
                    .collect()
            });
            Some(AddressDoc {
                open,
                election: VipDoc::from_report(&report),
                report,
                announced_by: announced.map(|(n, i)| format!("{n},{i}")),
                agrees,
                routed_by,
                routed_agrees,
                why,
            })
        })
        .collect();
    Ok(ExplainDoc {
        service: format!("{namespace}/{name}"),
        members,
        maintenance: maintenance(fleet),
        addresses,
    })
}

/// Each node in maintenance, and why: the out-of-service taint (its agent
/// drains it while the taint is there), its record's drain, or a cordon
/// where advertisements count it (named, as the cordon drains only their
/// addresses).
fn maintenance(fleet: &Fleet) -> Vec<String> {
    let mut counting: Vec<&str> = fleet
        .advertisements
        .iter()
        .filter(|a| a.spec.drain_cordoned_nodes)
        .filter_map(|a| a.metadata.name.as_deref())
        .collect();
    counting.sort();
    let mut out: Vec<String> = fleet
        .nodes
        .iter()
        .filter_map(|n| {
            let name = n.metadata.name.as_deref()?;
            let drained = fleet.agent(name).is_some_and(|a| a.spec.drain);
            if hostlb_api::annotations::out_of_service(n) {
                Some(format!(
                    "{name}: out of service (taint {}): drained, elected after every node that is not",
                    hostlb_api::annotations::OUT_OF_SERVICE_TAINT
                ))
            } else if drained {
                Some(format!(
                    "{name}: drained (kubectl hostlb drain): elected after every node that is not"
                ))
            } else if hostlb_api::annotations::cordoned(n) {
                Some(if counting.is_empty() {
                    format!("{name}: cordoned; no advertisement counts a cordon, so it serves as before")
                } else {
                    format!(
                        "{name}: cordoned: drained for the addresses of {} (drainCordonedNodes), elected after every node that is not",
                        counting.join(", ")
                    )
                })
            } else {
                None
            }
        })
        .collect();
    out.sort();
    out
}

/// What would explain `announcer` saying it announces where the
/// computation elects `winner`.
fn reasons(fleet: &Fleet, winner: Option<&str>, announcer: Option<&str>) -> Vec<String> {
    let mut out = Vec::new();
    let status = |n: &str| fleet.agent(n).and_then(|a| a.status.clone());
    if let Some(a) = announcer {
        match status(a) {
            _ if fleet.agent(a).is_none() => out.push(format!(
                "{a} has no agent record: the annotation may be left from before, or its agent cannot write records"
            )),
            Some(s) if s.state == lbnodeagent::agent::record::STOPPED => out.push(format!(
                "{a}'s agent stopped: the annotation is left over; a running agent clears it once nobody announces"
            )),
            Some(_) if !fleet.runs(a) => out.push(format!(
                "{a}'s agent has not written its record for minutes: it may be dead (its host still answering until its addresses lapse) or unable to reach the API"
            )),
            Some(s) if s.gossip_isolated => out.push(format!(
                "{a}'s gossip is isolated: it reaches no other agent and acts as if partitioned"
            )),
            _ => {}
        }
    }
    if let Some(w) = winner {
        match status(w) {
            None => out.push(format!("{w} has no agent record")),
            Some(s) if s.gossip_isolated => out.push(format!(
                "{w}'s gossip is isolated: the others may not see it as a member"
            )),
            Some(s) if s.state != lbnodeagent::agent::record::READY => out.push(format!(
                "{w} is {}: {}",
                s.state,
                s.reason.unwrap_or_default()
            )),
            _ => {}
        }
        if let Some(a) = announcer.and_then(|a| status(a).map(|s| (a, s))) {
            let (a, s) = a;
            let truncated = s.member_names.len() as i64 != s.members;
            if !truncated && !s.member_names.iter().any(|m| m == w) {
                out.push(format!(
                    "{a} does not see {w} among its gossip members ({} of them): a partition, or membership not yet converged",
                    s.members
                ));
            }
        }
    } else {
        out.push(
            "by the objects and the records nobody may announce it (see the excluded nodes), yet a node says it does: its view of the cluster may be older, or the annotation is left over"
                .into(),
        );
    }
    if announcer.is_none() {
        out.push(
            "no node says it announces: the winner's agent may still be taking it, or cannot write the annotation (check its record's state and the API server)"
                .into(),
        );
    }
    let hashes: std::collections::BTreeSet<&str> = fleet
        .agents
        .iter()
        .filter(|a| fleet.runs(a.metadata.name.as_deref().unwrap_or("")))
        .filter_map(|a| a.status.as_ref().map(|s| s.members_hash.as_str()))
        .filter(|h| !h.is_empty())
        .collect();
    if hashes.len() > 1 {
        out.push(
            "the running agents see different gossip members (stale membership, or a partition): `kubectl hostlb check` says which"
                .into(),
        );
    }
    if out.is_empty() {
        out.push(
            "a move in progress (the annotation follows within seconds), or agents whose views of the cluster differ"
                .into(),
        );
    }
    out
}

pub fn render(doc: &ExplainDoc, output: Output) -> String {
    if let Some(s) = crate::structured(doc, output) {
        return s;
    }
    let mut out = format!(
        "service {}\nmembers (agents running, by their records): {}\n",
        doc.service,
        if doc.members.is_empty() {
            "none".to_string()
        } else {
            doc.members.join(", ")
        }
    );
    if !doc.maintenance.is_empty() {
        out.push_str("maintenance:\n");
        for m in &doc.maintenance {
            out.push_str(&format!("  - {m}\n"));
        }
    }
    if doc.addresses.is_empty() {
        out.push_str("\nno address yet\n");
    }
    for a in &doc.addresses {
        out.push('\n');
        render_vip(&mut out, &a.report);
        match (&a.announced_by, a.agrees) {
            (Some(by), true) => out.push_str(&format!("  announced by: {by} (agrees)\n")),
            (by, false) => {
                out.push_str(&format!(
                    "  announced by: {} (DISAGREES with the computation)\n",
                    by.as_deref().unwrap_or("nobody")
                ));
                for w in &a.why {
                    out.push_str(&format!("    - {w}\n"));
                }
            }
            (None, true) => out.push_str("  announced by: nobody (agrees: no winner)\n"),
        }
        match &a.open {
            Some(open) if open.is_empty() => out
                .push_str("  firewall: only ICMP reaches it (no Service sharing it has a port)\n"),
            Some(open) => out.push_str(&format!(
                "  firewall: only {} and ICMP reach it on its hosts\n",
                open.join(", ")
            )),
            None => out.push_str(
                "  firewall: none (it is a Node's own address, which the agents never close)\n",
            ),
        }
        if a.routed_by.is_some() || !a.report.virtual_nodes.is_empty() {
            out.push_str(&format!(
                "  routed by: {} ({})\n",
                a.routed_by.as_deref().unwrap_or("nobody"),
                if a.routed_agrees {
                    "agrees"
                } else {
                    "DISAGREES with the computation"
                }
            ));
            if !a.routed_agrees && a.agrees {
                for w in &a.why {
                    out.push_str(&format!("    - {w}\n"));
                }
            }
        }
    }
    out
}
