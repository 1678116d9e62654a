//! `allocator plan`: the addresses the allocator would give, computed
//! offline from YAML dumps, with the same ledger the controller uses.

use std::fmt::Write as _;
use std::path::PathBuf;

use hostlb_api::snapshot::{ObjectError, Snapshot, SnapshotError};
use serde::Serialize;

use crate::engine::PoolState;
use crate::inputs::{self, Scope};
use crate::ledger::Ledger;

#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, clap::ValueEnum)]
pub enum Output {
    #[default]
    Table,
    Json,
}

#[derive(Clone, Debug, Default)]
pub struct Options {
    pub files: Vec<PathBuf>,
    pub output: Output,
    pub scope: Scope,
}

/// The plan and the objects that could not be used.
pub struct Plan {
    pub text: String,
    pub warnings: Vec<ObjectError>,
}

#[derive(Serialize)]
struct JsonOut {
    services: Vec<JsonService>,
}

#[derive(Serialize)]
#[serde(untagged)]
enum JsonService {
    Assigned {
        service: String,
        addresses: Vec<String>,
        pool: String,
        /// Why what the Service asks for is not applied while it keeps
        /// `addresses`.
        #[serde(rename = "notApplied", skip_serializing_if = "Option::is_none")]
        not_applied: Option<String>,
        /// The sharing terms the allocator records with the addresses (the
        /// message of the `hostlb.io/SharingGranted` status condition): a
        /// plan applied with them tells, in the next plan, an edited sharer
        /// from an unchanged one, as the live allocator does.
        #[serde(rename = "sharingGranted", skip_serializing_if = "Option::is_none")]
        sharing_granted: Option<String>,
    },
    Failed {
        service: String,
        error: String,
    },
}

pub fn run(opts: &Options) -> Result<Plan, SnapshotError> {
    let mut snap = Snapshot::default();
    for f in &opts.files {
        snap.add_file(f)?;
    }
    let mut warnings = snap.errors.clone();
    let pools: Vec<_> = snap
        .pools
        .iter()
        .filter(|p| {
            let ok = p.metadata.namespace.as_deref() == Some(opts.scope.namespace.as_str());
            if !ok {
                warnings.push(ObjectError::new(
                    "IPAddressPool",
                    &p.metadata,
                    format!(
                        "not in namespace {}; the allocator does not read it",
                        opts.scope.namespace
                    ),
                ));
            }
            ok
        })
        .map(inputs::pool_spec)
        .collect();
    let mut ledger = Ledger::new();
    ledger.load(&pools, snap.namespaces.iter().map(inputs::namespace_labels));
    // Services without a creation time are taken as created in file order,
    // after the dated ones.
    let mut requests = Vec::new();
    for (i, svc) in snap.services.iter().enumerate() {
        if !opts.scope.handles(svc) {
            continue;
        }
        let mut r = inputs::service_request(svc);
        r.created = r.created.or(Some(i64::MAX / 2 + i as i64));
        requests.push(r);
    }
    for r in &requests {
        ledger.insert(r.clone());
    }
    ledger.rebuild();

    let text = match opts.output {
        Output::Json => {
            let services = ledger
                .answers()
                .into_iter()
                .map(|(s, a)| match a {
                    Ok(x) => JsonService::Assigned {
                        service: s.key.clone(),
                        addresses: x.ips.iter().map(|i| i.to_string()).collect(),
                        pool: x.pool.clone(),
                        not_applied: x.pending.as_ref().map(ToString::to_string),
                        sharing_granted: s.sharing_terms().filter(|_| !x.ips.is_empty()),
                    },
                    Err(e) => JsonService::Failed {
                        service: s.key.clone(),
                        error: e.to_string(),
                    },
                })
                .collect();
            let mut t = serde_json::to_string(&JsonOut { services }).expect("plain data");
            t.push('\n');
            t
        }
        Output::Table => table(&ledger, &warnings),
    };
    Ok(Plan { text, warnings })
}

fn columns(rows: &[Vec<String>]) -> String {
    let widths: Vec<usize> = (0..rows[0].len())
        .map(|i| rows.iter().map(|r| r[i].chars().count()).max().unwrap_or(0))
        .collect();
    let mut out = String::new();
    for r in rows {
        let mut line = String::new();
        for (i, cell) in r.iter().enumerate() {
            let _ = write!(line, "{cell:<w$}  ", w = widths[i]);
        }
        out.push_str(line.trim_end());
        out.push('\n');
    }
    out
}

fn table(ledger: &Ledger, warnings: &[ObjectError]) -> String {
    let mut rows = vec![vec![
        "SERVICE".to_string(),
        "ADDRESSES".into(),
        "POOL".into(),
        "NOTE".into(),
    ]];
    for (s, a) in ledger.answers() {
        match a {
            Ok(x) => {
                let ips: Vec<String> = x.ips.iter().map(|i| i.to_string()).collect();
                let note = if s.current.is_empty() {
                    "new".to_string()
                } else if s.current == x.ips {
                    "kept".to_string()
                } else {
                    format!(
                        "moved from {}",
                        s.current
                            .iter()
                            .map(|i| i.to_string())
                            .collect::<Vec<_>>()
                            .join(", ")
                    )
                };
                let note = match &x.pending {
                    Some(why) => format!("{note}; not applied: {why}"),
                    None => note,
                };
                rows.push(vec![s.key.clone(), ips.join(", "), x.pool.clone(), note]);
            }
            Err(e) => rows.push(vec![s.key.clone(), "-".into(), "-".into(), e.to_string()]),
        }
    }
    let mut out = if rows.len() == 1 {
        "no LoadBalancer Services in the input\n".to_string()
    } else {
        columns(&rows)
    };
    let mut pools = vec![vec![
        "POOL".to_string(),
        "STATE".into(),
        "ASSIGNED IPV4/IPV6".into(),
        "AVAILABLE IPV4/IPV6".into(),
    ]];
    let mut problems = Vec::new();
    for p in ledger.report() {
        let state = match &p.state {
            PoolState::Ready => "Ready",
            PoolState::Invalid(m) => {
                problems.push(format!("  {}: {m}", p.name));
                "Invalid"
            }
            PoolState::Overlaps(m) => {
                problems.push(format!("  {}: {m}", p.name));
                "Overlaps"
            }
        }
        .to_string();
        pools.push(vec![
            p.name.clone(),
            state,
            format!("{}/{}", p.assigned[0], p.assigned[1]),
            format!("{}/{}", p.available[0], p.available[1]),
        ]);
    }
    out.push('\n');
    out.push_str(&columns(&pools));
    if !problems.is_empty() {
        out.push_str("\npools not handing out new addresses:\n");
        for p in problems {
            out.push_str(&p);
            out.push('\n');
        }
    }
    if !warnings.is_empty() {
        out.push_str("\nleft out:\n");
        for w in warnings {
            let _ = writeln!(out, "  {}: {}", w.object, w.message);
        }
    }
    out
}
