//! `kubectl hostlb check`: the configuration and the fleet linted, like
//! `lbnodeagent check` for one host. Errors make the command exit 1:
//! overlapping pools, advertisements that select no pool or no node,
//! objects the agents leave out, addresses in no pool, agents whose gossip
//! is isolated or that see different members. Warnings do not: selectors
//! that match nothing, Services without an address, nodes without an
//! agent, agents not ready or not heard from.

use std::collections::BTreeMap;

use hostlb_api::{IPAddressPool, Selector};
use serde::Serialize;

use crate::status::{addresses, pool_of, pools_by_age, ranges};
use crate::{Fleet, Output, table};

#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Severity {
    Error,
    Warning,
}

#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Serialize)]
pub struct Finding {
    pub severity: Severity,
    /// `Kind/name` or `Kind/namespace/name`.
    pub object: String,
    pub message: String,
}

fn error(object: String, message: String) -> Finding {
    Finding {
        severity: Severity::Error,
        object,
        message,
    }
}

fn warning(object: String, message: String) -> Finding {
    Finding {
        severity: Severity::Warning,
        object,
        message,
    }
}

fn name_of(meta: &k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta) -> String {
    meta.name.clone().unwrap_or_default()
}

pub fn check(fleet: &Fleet) -> Vec<Finding> {
    let mut out = Vec::new();
    pools(fleet, &mut out);
    advertisements(fleet, &mut out);
    services(fleet, &mut out);
    agents(fleet, &mut out);
    out.sort();
    out.dedup();
    out
}

fn pools(fleet: &Fleet, out: &mut Vec<Finding>) {
    let pools = pools_by_age(fleet);
    for (i, p) in pools.iter().enumerate() {
        for q in &pools[..i] {
            let overlap = ranges(p)
                .iter()
                .find(|a| ranges(q).iter().any(|b| a.overlaps(b)))
                .cloned();
            if let Some(r) = overlap {
                out.push(error(
                    format!("IPAddressPool/{}", name_of(&p.metadata)),
                    format!(
                        "overlaps the older pool {} ({}): the addresses they share are {}'s, and this pool's advertisements do not apply to them",
                        name_of(&q.metadata),
                        r,
                        name_of(&q.metadata)
                    ),
                ));
            }
        }
    }
}

fn labels_of(
    meta: &k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta,
) -> BTreeMap<String, String> {
    meta.labels.clone().unwrap_or_default()
}

fn advertisements(fleet: &Fleet, out: &mut Vec<Finding>) {
    let (_, errors) = fleet.cluster();
    for e in &errors {
        out.push(error(
            e.object.clone(),
            format!("left out by every agent: {}", e.message),
        ));
    }
    let nodes: Vec<BTreeMap<String, String>> =
        fleet.nodes.iter().map(|n| labels_of(&n.metadata)).collect();
    let pool_names: Vec<(String, BTreeMap<String, String>)> = fleet
        .pools
        .iter()
        .map(|p: &IPAddressPool| (name_of(&p.metadata), labels_of(&p.metadata)))
        .collect();
    let services: Vec<BTreeMap<String, String>> = fleet
        .load_balancers()
        .map(|s| labels_of(&s.metadata))
        .collect();
    for ad in &fleet.advertisements {
        let object = format!("L2Advertisement/{}", name_of(&ad.metadata));
        let Ok((spec, _)) = ad.spec_in_force() else {
            continue;
        };
        let compile = |list: &[hostlb_api::LabelSelector]| -> Vec<Selector> {
            list.iter()
                .filter_map(|s| Selector::parse(s).ok())
                .collect()
        };
        let pool_selectors = compile(&spec.ip_address_pool_selectors);
        let every_pool =
            spec.ip_address_pools.is_empty() && spec.ip_address_pool_selectors.is_empty();
        for named in &spec.ip_address_pools {
            if !pool_names.iter().any(|(n, _)| n == named) {
                out.push(error(
                    object.clone(),
                    format!("names the pool {named}, which does not exist"),
                ));
            }
        }
        let selected = pool_names.iter().any(|(n, labels)| {
            every_pool
                || spec.ip_address_pools.contains(n)
                || pool_selectors.iter().any(|s| s.matches(labels))
        });
        if !selected {
            out.push(error(
                object.clone(),
                "selects no pool: it announces nothing".into(),
            ));
        }
        for (i, s) in pool_selectors.iter().enumerate() {
            if !pool_names.iter().any(|(_, l)| s.matches(l)) {
                out.push(warning(
                    object.clone(),
                    format!("spec.ipAddressPoolSelectors[{i}] matches no pool"),
                ));
            }
        }
        let node_selectors = compile(&spec.node_selectors);
        if !node_selectors.is_empty()
            && !nodes
                .iter()
                .any(|l| node_selectors.iter().any(|s| s.matches(l)))
        {
            out.push(error(
                object.clone(),
                "spec.nodeSelectors match no Node: its pools' addresses have no node to announce them".into(),
            ));
        }
        let service_selectors = compile(&spec.service_selectors);
        for (i, s) in service_selectors.iter().enumerate() {
            if !services.iter().any(|l| s.matches(l)) {
                out.push(warning(
                    object.clone(),
                    format!("spec.serviceSelectors[{i}] matches no LoadBalancer Service"),
                ));
            }
        }
        for (i, p) in spec.preferred_node_selectors.iter().enumerate() {
            if let Ok(s) = Selector::parse(&p.preference)
                && !nodes.iter().any(|l| s.matches(l))
            {
                out.push(warning(
                    object.clone(),
                    format!(
                        "spec.preferredNodeSelectors[{i}] matches no Node: no node is preferred"
                    ),
                ));
            }
        }
    }
}

fn services(fleet: &Fleet, out: &mut Vec<Finding>) {
    for s in fleet.load_balancers() {
        let object = format!(
            "Service/{}/{}",
            s.metadata.namespace.clone().unwrap_or_default(),
            name_of(&s.metadata)
        );
        let ips = addresses(s);
        if ips.is_empty() {
            out.push(warning(
                object,
                "has no address: no pool serves it, the pools are full, or the allocator is not running (its Events say which)".into(),
            ));
        } else if pool_of(fleet, s).is_none() {
            out.push(error(
                object,
                format!(
                    "{} is in no pool: no advertisement applies, and no agent announces it",
                    ips.iter()
                        .map(|i| i.to_string())
                        .collect::<Vec<_>>()
                        .join(",")
                ),
            ));
        }
    }
}

fn agents(fleet: &Fleet, out: &mut Vec<Finding>) {
    for n in &fleet.nodes {
        let node = name_of(&n.metadata);
        if fleet.agent(&node).is_none() {
            out.push(warning(
                format!("Node/{node}"),
                "has no NodeAgent record: no agent runs there, or it cannot write to the API"
                    .into(),
            ));
        }
    }
    // New VIPs a stranger answered for, which nobody holds yet.
    for (address, (node, mac)) in fleet.not_taken() {
        out.push(error(
            format!("NodeAgent/{node}"),
            format!(
                "did not take {address}: the host with MAC {mac} answers for it and is no hostlb node (an address configured by hand, or a DHCP lease?); remove it there, or take the address out of the pool"
            ),
        ));
    }
    let mut by_members: BTreeMap<String, Vec<String>> = BTreeMap::new();
    for a in &fleet.agents {
        let node = name_of(&a.metadata);
        let object = format!("NodeAgent/{node}");
        let st = a.status.clone().unwrap_or_default();
        if st.state == lbnodeagent::agent::record::STOPPED {
            out.push(warning(object, "the agent was stopped".into()));
            continue;
        }
        if !fleet.runs(&node) {
            out.push(warning(
                object,
                "not written for three minutes or more: the agent is down, or cannot reach the API"
                    .into(),
            ));
            continue;
        }
        if st.gossip_isolated {
            out.push(error(
                object.clone(),
                "gossip is isolated: it reaches no other agent (check UDP 7934 between the hosts, the gossip key and cluster id)".into(),
            ));
        } else if st.state != lbnodeagent::agent::record::READY {
            out.push(warning(
                object.clone(),
                format!("{}: {}", st.state, st.reason.clone().unwrap_or_default()),
            ));
        }
        for o in &st.invalid_objects {
            out.push(error(object.clone(), format!("leaves out {o}")));
        }
        if !st.members_hash.is_empty() {
            by_members
                .entry(format!("{} members ({})", st.members, st.members_hash))
                .or_default()
                .push(node);
        }
    }
    if by_members.len() > 1 {
        let groups: Vec<String> = by_members
            .iter()
            .map(|(k, nodes)| {
                let verb = if nodes.len() == 1 { "sees" } else { "see" };
                format!("{} {verb} {k}", nodes.join(", "))
            })
            .collect();
        out.push(error(
            "NodeAgent/*".into(),
            format!(
                "the agents disagree on gossip membership (a partition, or a change still spreading): {}",
                groups.join("; ")
            ),
        ));
    }
}

pub fn render(findings: &[Finding], output: Output) -> String {
    if let Some(s) = crate::structured(&findings, output) {
        return s;
    }
    if findings.is_empty() {
        return "ok: nothing to report\n".into();
    }
    let errors = findings
        .iter()
        .filter(|f| f.severity == Severity::Error)
        .count();
    let mut out = table(
        &["SEVERITY", "OBJECT", "PROBLEM"],
        findings
            .iter()
            .map(|f| {
                vec![
                    match f.severity {
                        Severity::Error => "error".into(),
                        Severity::Warning => "warning".into(),
                    },
                    f.object.clone(),
                    f.message.clone(),
                ]
            })
            .collect(),
    );
    out.push_str(&format!(
        "{errors} errors, {} warnings\n",
        findings.len() - errors
    ));
    out
}

/// Whether `check` found something wrong (its exit status).
/// The identity `check` tries the Service policy as: any name in the
/// agents' namespace is an agent to the policy and to RBAC's grant.
pub const PROBE_IDENTITY: &str = "system:serviceaccount:hostlb-agents:hostlb-check";
/// Its groups, as the API server gives a ServiceAccount's token.
pub const PROBE_GROUPS: [&str; 3] = [
    "system:serviceaccounts",
    "system:serviceaccounts:hostlb-agents",
    "system:authenticated",
];

/// What the dry run as an agent (see `lbnodeagent::agent::admission`) says
/// for the fleet: an error when the policy is not in force, a warning when
/// it cannot be told.
pub fn policy(answer: &lbnodeagent::agent::admission::Policy) -> Option<Finding> {
    use lbnodeagent::agent::admission::Policy;
    let object = "ValidatingAdmissionPolicy/hostlb-agent-services".to_string();
    match answer {
        Policy::InForce => None,
        Policy::NotInForce => Some(error(
            object,
            "not in force: an agent's credential can rewrite any Service (a dry-run patch of a Service's labels as an agent was accepted); apply deploy/agent/policy.yaml (policy-v1beta1.yaml on Kubernetes 1.28 and 1.29, with the ValidatingAdmissionPolicy feature gate and API on)".into(),
        )),
        Policy::NoPatchRight(why) => Some(warning(
            object,
            format!("agents may not patch Services, so they cannot write their announcing annotations (deploy/agent/rbac.yaml): {why}"),
        )),
        Policy::Unknown(why) => Some(warning(
            object,
            format!("could not tell whether it is in force: {why} (check needs the right to impersonate {PROBE_IDENTITY})"),
        )),
    }
}

pub fn failed(findings: &[Finding]) -> bool {
    findings.iter().any(|f| f.severity == Severity::Error)
}
