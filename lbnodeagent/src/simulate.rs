//! `lbnodeagent simulate`: the election computed offline from YAML dumps, so an
//! operator can check a configuration or ask "what if node-a goes down?".
//!
//! Live members are all Nodes minus `--down`. Without `--on-link` a node is
//! on-link for every address (one L2 segment), on its announce interface and
//! on every interface an advertisement names, so an advertisement that lists
//! `interfaces` finds them; `--on-link NODE=CIDR` gives the
//! node exactly the listed prefixes on its announce interface,
//! `NODE=CIDR@IFACE` a prefix on a named interface, and `NODE=none` no
//! on-link prefix at all. A node's announce (default-route) interface is
//! the one `--default-interface` names, else the interface of its first
//! `--on-link` entry: what an advertisement without `interfaces` announces
//! on, whether it is written `@eth0` or left out.

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::path::PathBuf;

use hostlb_api::Prefix;
use hostlb_api::snapshot::{ObjectError, Snapshot, SnapshotError};
use serde::Serialize;

use crate::election::{Election, Member, NodeName, OnLink, VipReport};
use crate::inputs::{self, Scope};

#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, clap::ValueEnum)]
pub enum Output {
    #[default]
    Table,
    Json,
}

#[derive(Clone, Debug, Default)]
pub struct Options {
    pub files: Vec<PathBuf>,
    pub down: Vec<String>,
    pub on_link: Vec<String>,
    /// `IFACE` (every node) or `NODE=IFACE`: the default-route interface.
    pub default_interface: Vec<String>,
    pub output: Output,
    pub scope: Scope,
}

#[derive(Debug, thiserror::Error)]
pub enum SimulateError {
    #[error(transparent)]
    Snapshot(#[from] SnapshotError),
    #[error("--down {0}: no Node of that name in the input")]
    UnknownDown(String),
    #[error("--on-link {arg}: {reason}")]
    OnLink { arg: String, reason: String },
    #[error("--default-interface {arg}: {reason}")]
    DefaultInterface { arg: String, reason: String },
}

/// Run the simulation and render it.
pub fn run(opts: &Options) -> Result<String, SimulateError> {
    let mut snap = Snapshot::default();
    for f in &opts.files {
        snap.add_file(f)?;
    }
    let (cluster, conversion_errors) = inputs::cluster(
        &opts.scope,
        &snap.nodes,
        &snap.pools,
        &snap.advertisements,
        &inputs::ServiceRecord::of_all(&snap.services),
        &inputs::SliceEndpoints::of_all(&snap.endpoint_slices),
    );
    let mut errors = snap.errors.clone();
    errors.extend(conversion_errors);

    let node_names: Vec<&str> = cluster.nodes.iter().map(|n| n.name.as_str()).collect();
    for d in &opts.down {
        if !node_names.contains(&d.as_str()) {
            return Err(SimulateError::UnknownDown(d.clone()));
        }
    }
    let defaults = parse_default_interfaces(&opts.default_interface, &node_names)?;
    let on_link = parse_on_link(&opts.on_link, &node_names, &defaults)?;
    let mut ad_interfaces: Vec<&str> = cluster
        .advertisements
        .iter()
        .flat_map(|a| a.interfaces.iter().map(String::as_str))
        .collect();
    ad_interfaces.sort_unstable();
    ad_interfaces.dedup();
    let one_segment = everything(&ad_interfaces);
    let members: Vec<Member> = node_names
        .iter()
        .filter(|n| !opts.down.iter().any(|d| d == *n))
        .map(|n| Member {
            node: NodeName::from(&**n),
            leaving: false,
            drained: false,
            virtual_mode: true,
            on_link: on_link
                .get(*n)
                .cloned()
                .unwrap_or_else(|| one_segment.clone())
                .into(),
        })
        .collect();
    let reports = Election::new(&cluster, members).report_all();
    Ok(match opts.output {
        Output::Json => json(&reports, &errors),
        Output::Table => table(&reports, &errors, opts),
    })
}

/// Every address on-link on the announce interface (named "") and on each
/// of `interfaces`.
fn everything(interfaces: &[&str]) -> Vec<OnLink> {
    let announce = std::iter::once(("", true));
    let listed = interfaces.iter().map(|i| (*i, false));
    announce
        .chain(listed)
        .flat_map(|(interface, announce)| {
            ["0.0.0.0/0", "::/0"].map(|p| OnLink {
                prefix: p.parse().expect("constant prefix"),
                interface: interface.to_string(),
                announce,
                upstream_lost: false,
            })
        })
        .collect()
}

/// `--default-interface` values: by node, with `""` for every node.
fn parse_default_interfaces(
    args: &[String],
    nodes: &[&str],
) -> Result<BTreeMap<String, String>, SimulateError> {
    let mut out = BTreeMap::new();
    for arg in args {
        let bad = |reason: String| SimulateError::DefaultInterface {
            arg: arg.clone(),
            reason,
        };
        let (node, iface) = arg.split_once('=').unwrap_or(("", arg));
        if iface.is_empty() {
            return Err(bad("expected IFACE or NODE=IFACE".into()));
        }
        if !node.is_empty() && !nodes.contains(&node) {
            return Err(bad(format!("no Node named {node:?} in the input")));
        }
        out.insert(node.to_string(), iface.to_string());
    }
    Ok(out)
}

fn parse_on_link(
    args: &[String],
    nodes: &[&str],
    defaults: &BTreeMap<String, String>,
) -> Result<BTreeMap<String, Vec<OnLink>>, SimulateError> {
    let mut entries: BTreeMap<String, Vec<(Prefix, Option<String>)>> = BTreeMap::new();
    for arg in args {
        let bad = |reason: String| SimulateError::OnLink {
            arg: arg.clone(),
            reason,
        };
        let (node, rest) = arg
            .split_once('=')
            .ok_or_else(|| bad("expected NODE=CIDR, NODE=CIDR@IFACE or NODE=none".into()))?;
        if !nodes.contains(&node) {
            return Err(bad(format!("no Node named {node:?} in the input")));
        }
        let list = entries.entry(node.to_string()).or_default();
        if rest == "none" {
            continue;
        }
        let (cidr, iface) = match rest.split_once('@') {
            Some((c, i)) if !i.is_empty() => (c, Some(i)),
            Some(_) => return Err(bad("empty interface name after @".into())),
            None => (rest, None),
        };
        let prefix: Prefix = cidr
            .parse()
            .map_err(|e: hostlb_api::AddressError| bad(e.reason))?;
        list.push((prefix, iface.map(str::to_string)));
    }
    let mut out = BTreeMap::new();
    for (node, list) in entries {
        // The default-route interface: named, else the first entry's.
        let default = defaults
            .get(&node)
            .or_else(|| defaults.get(""))
            .cloned()
            .or_else(|| list.first().and_then(|(_, i)| i.clone()));
        let on_link = list
            .into_iter()
            .map(|(prefix, iface)| {
                let announce = iface.is_none() || iface == default;
                OnLink {
                    prefix,
                    interface: iface.or_else(|| default.clone()).unwrap_or_default(),
                    announce,
                    upstream_lost: false,
                }
            })
            .collect();
        out.insert(node, on_link);
    }
    Ok(out)
}

#[derive(Serialize)]
struct JsonOut<'a> {
    vips: Vec<JsonVip<'a>>,
    errors: &'a [ObjectError],
}

#[derive(Serialize)]
struct JsonVip<'a> {
    ip: String,
    services: &'a [String],
    winner: Option<&'a str>,
    candidates: Vec<JsonCandidate<'a>>,
    #[serde(rename = "virtual")]
    virtual_nodes: &'a [String],
    excluded: Vec<JsonExcluded<'a>>,
}

#[derive(Serialize)]
struct JsonCandidate<'a> {
    node: &'a str,
    score: u32,
}

#[derive(Serialize)]
struct JsonExcluded<'a> {
    node: &'a str,
    reason: &'static str,
}

fn json(reports: &[VipReport], errors: &[ObjectError]) -> String {
    let out = JsonOut {
        vips: reports
            .iter()
            .map(|r| JsonVip {
                ip: r.ip.to_string(),
                services: &r.services,
                winner: r.winner.as_deref(),
                candidates: r
                    .candidates
                    .iter()
                    .map(|c| JsonCandidate {
                        node: &c.node,
                        score: c.score,
                    })
                    .collect(),
                virtual_nodes: &r.virtual_nodes,
                excluded: r
                    .excluded
                    .iter()
                    .map(|x| JsonExcluded {
                        node: &x.node,
                        reason: x.reason.as_str(),
                    })
                    .collect(),
            })
            .collect(),
        errors,
    };
    let mut s = serde_json::to_string(&out).expect("plain data always serializes");
    s.push('\n');
    s
}

/// Rows padded to column widths.
pub fn columns(rows: &[Vec<String>], indent: &str) -> String {
    let widths: Vec<usize> = (0..rows[0].len())
        .map(|i| rows.iter().map(|r| r[i].len()).max().unwrap_or(0))
        .collect();
    let mut out = String::new();
    for r in rows {
        let mut line = indent.to_string();
        for (i, cell) in r.iter().enumerate() {
            if i + 1 == r.len() {
                line.push_str(cell);
            } else {
                let _ = write!(line, "{cell:<w$}  ", w = widths[i]);
            }
        }
        out.push_str(line.trim_end());
        out.push('\n');
    }
    out
}

fn table(reports: &[VipReport], errors: &[ObjectError], opts: &Options) -> String {
    let mut out = String::new();
    let down = if opts.down.is_empty() {
        "none".to_string()
    } else {
        opts.down.join(", ")
    };
    let _ = writeln!(out, "down: {down}");
    if opts.on_link.is_empty() {
        let _ = writeln!(out, "on-link: every node, every address (one L2 segment)");
    } else {
        let _ = writeln!(out, "on-link: {}", opts.on_link.join(", "));
    }
    for r in reports {
        out.push('\n');
        render_vip(&mut out, r);
    }
    if reports.is_empty() {
        out.push_str("\nno LoadBalancer addresses in the input\n");
    }
    if !errors.is_empty() {
        out.push_str("\nerrors (these objects are left out):\n");
        for e in errors {
            let _ = writeln!(out, "  {}: {}", e.object, e.message);
        }
    }
    out
}

/// One address's election as the table shows it: the winner, the
/// candidates in order with score and hash rank, the nodes on the virtual
/// interface, and why every other node is out.
pub fn render_vip(out: &mut String, r: &VipReport) {
    let pool = r.pool.as_deref().unwrap_or("-");
    let _ = writeln!(
        out,
        "{}  pool {pool}  services {}",
        r.ip,
        r.services.join(", ")
    );
    match (&r.winner, &r.note) {
        (Some(w), _) => match r.winner_on.as_ref().filter(|o| !o.interface.is_empty()) {
            Some(on) => {
                let _ = writeln!(out, "  winner: {w} on {}", on.interface);
            }
            None => {
                let _ = writeln!(out, "  winner: {w}");
            }
        },
        (None, Some(note)) => {
            let _ = writeln!(out, "  winner: none ({note})");
        }
        (None, None) => {
            let _ = writeln!(out, "  winner: none (no live, eligible, on-link candidate)");
        }
    }
    if !r.candidates.is_empty() {
        let mut rows = vec![vec![
            "ORDER".to_string(),
            "NODE".into(),
            "SCORE".into(),
            "HASH-RANK".into(),
            "SHA256(NODE#IP)".into(),
        ]];
        for (i, c) in r.candidates.iter().enumerate() {
            rows.push(vec![
                (i + 1).to_string(),
                if c.drained {
                    format!("{} (drained: last resort)", c.node)
                } else if c.upstream_lost {
                    format!("{} (gateway lost: last resort)", c.node)
                } else if c.held {
                    format!("{} (holds it: sticky)", c.node)
                } else {
                    c.node.clone()
                },
                c.score.to_string(),
                c.hash_rank.to_string(),
                format!("{}…", &hex::encode(c.hash)[..16]),
            ]);
        }
        out.push_str(&columns(&rows, "  "));
    }
    if !r.virtual_nodes.is_empty() {
        let _ = writeln!(
            out,
            "  virtual (off-link, on the virtual interface): {}",
            r.virtual_nodes.join(", ")
        );
    }
    if !r.excluded.is_empty() {
        let _ = writeln!(out, "  excluded:");
        let rows: Vec<Vec<String>> = r
            .excluded
            .iter()
            .map(|x| {
                vec![
                    x.node.clone(),
                    x.reason.to_string(),
                    x.reason.explain().to_string(),
                ]
            })
            .collect();
        out.push_str(&columns(&rows, "    "));
    }
}
