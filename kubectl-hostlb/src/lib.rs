//! `kubectl hostlb`: what the fleet does, read from the Kubernetes API
//! alone, so an operator sees from one shell what each agent only shows on
//! its own host.
//!
//! [`Fleet`] is every object the views need, listed once; [`status`],
//! [`explain`] and [`check`] are pure functions of it (and of the time, to
//! tell a stale agent record from a fresh one), tested on fixtures and
//! against the test API server. The election is the agent's own code
//! (`lbnodeagent::election`, as `lbnodeagent simulate` uses it), with the
//! membership the agents' `NodeAgent` records publish.

pub mod check;
pub mod drain;
pub mod explain;
pub mod rebalance;
pub mod status;

use hostlb_api::{IPAddressPool, L2Advertisement, NodeAgent, Scope};
use k8s_openapi::api::core::v1::{Node, Service};
use k8s_openapi::api::discovery::v1::EndpointSlice;
use kube::api::ListParams;
use kube::{Api, Client};
use lbnodeagent::election::{Cluster, Election};
use lbnodeagent::simulate::columns;
use serde::Serialize;

/// Every object the views read.
#[derive(Clone, Debug, Default)]
pub struct Fleet {
    pub scope: Scope,
    pub services: Vec<Service>,
    pub slices: Vec<EndpointSlice>,
    pub nodes: Vec<Node>,
    pub pools: Vec<IPAddressPool>,
    pub advertisements: Vec<L2Advertisement>,
    pub agents: Vec<NodeAgent>,
    /// When the objects were read: records are judged fresh against it.
    pub now: jiff::Timestamp,
}

impl Fleet {
    /// Lists everything, once.
    pub async fn load(client: &Client, scope: &Scope) -> anyhow::Result<Fleet> {
        let lp = ListParams::default();
        let ns = &scope.namespace;
        let services = Api::<Service>::all(client.clone());
        let slices = Api::<EndpointSlice>::all(client.clone());
        let nodes = Api::<Node>::all(client.clone());
        let pools = Api::<IPAddressPool>::namespaced(client.clone(), ns);
        let advertisements = Api::<L2Advertisement>::namespaced(client.clone(), ns);
        let agents = Api::<NodeAgent>::all(client.clone());
        let (services, slices, nodes, pools, advertisements, agents) = tokio::try_join!(
            services.list(&lp),
            slices.list(&lp),
            nodes.list(&lp),
            pools.list(&lp),
            advertisements.list(&lp),
            agents.list(&lp),
        )?;
        Ok(Fleet {
            scope: scope.clone(),
            services: services.items,
            slices: slices.items,
            nodes: nodes.items,
            pools: pools.items,
            advertisements: advertisements.items,
            agents: agents.items,
            now: jiff::Timestamp::now(),
        })
    }

    /// The election's input, as every agent builds it, and the objects it
    /// leaves out.
    pub fn cluster(&self) -> (Cluster, Vec<hostlb_api::snapshot::ObjectError>) {
        lbnodeagent::inputs::cluster(
            &self.scope,
            &self.nodes,
            &self.pools,
            &self.advertisements,
            &lbnodeagent::inputs::ServiceRecord::of_all(&self.services),
            &lbnodeagent::inputs::SliceEndpoints::of_all(&self.slices),
        )
    }

    /// The election over the nodes whose agents run and stand, as their
    /// records say, with the holders of sticky addresses as the announcing
    /// annotations name them (the agents read gossip for it, which says
    /// the same once the annotations caught up).
    pub fn election(&self) -> Election {
        let (cluster, _) = self.cluster();
        let members = lbnodeagent::agent::record::members_of(&self.agents, self.now);
        let mut election = Election::new(&cluster, members);
        let held: Vec<(std::net::IpAddr, String)> = self
            .load_balancers()
            .flat_map(|svc| {
                status::addresses(svc).into_iter().filter_map(|ip| {
                    let (node, _) = status::announcing(svc, hostlb_api::Family::of(ip))?;
                    (!node.is_empty()).then_some((ip, node))
                })
            })
            .collect();
        election.set_holders(held.iter().map(|(ip, n)| (*ip, n.as_str())));
        election
    }

    pub fn agent(&self, node: &str) -> Option<&NodeAgent> {
        self.agents
            .iter()
            .find(|a| a.metadata.name.as_deref() == Some(node))
    }

    /// Whether `node`'s agent runs, by its record.
    pub fn runs(&self, node: &str) -> bool {
        self.agent(node)
            .is_some_and(|a| lbnodeagent::agent::record::is_fresh(a, self.now))
    }

    /// New VIPs an agent did not take because a host that is no hostlb
    /// node answers for them, that no running agent holds (see
    /// [`hostlb_api::v1::addresses_in_use`]).
    pub fn not_taken(&self) -> std::collections::BTreeMap<String, (String, String)> {
        hostlb_api::v1::addresses_in_use(&self.agents, self.now)
    }

    /// The LoadBalancer Services hostlb handles.
    pub fn load_balancers(&self) -> impl Iterator<Item = &Service> {
        self.services.iter().filter(|s| self.scope.handles(s))
    }
}

/// How the views print: kubectl's `-o`.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, clap::ValueEnum)]
pub enum Output {
    #[default]
    Table,
    Wide,
    Json,
    Yaml,
}

/// A view as JSON or YAML; `None` for the table forms.
pub fn structured<T: Serialize>(doc: &T, output: Output) -> Option<String> {
    match output {
        Output::Json => {
            let mut s = serde_json::to_string_pretty(doc).expect("plain data serializes");
            s.push('\n');
            Some(s)
        }
        Output::Yaml => Some(serde_saphyr::to_string(doc).expect("plain data serializes")),
        Output::Table | Output::Wide => None,
    }
}

/// A table with a header row, as kubectl prints one.
fn table(header: &[&str], rows: Vec<Vec<String>>) -> String {
    let mut all = vec![header.iter().map(|h| h.to_string()).collect()];
    all.extend(rows);
    columns(&all, "")
}

/// How long ago `t` was, as kubectl prints ages.
fn age(
    now: jiff::Timestamp,
    t: Option<&k8s_openapi::apimachinery::pkg::apis::meta::v1::Time>,
) -> String {
    let Some(t) = t else {
        return "-".into();
    };
    let secs = now.duration_since(t.0).as_secs().max(0);
    match secs {
        s if s < 120 => format!("{s}s"),
        s if s < 7200 => format!("{}m", s / 60),
        s if s < 172_800 => format!("{}h", s / 3600),
        s => format!("{}d", s / 86_400),
    }
}
