//! `meta.k8s.io/v1` Table responses, so `kubectl get` prints the columns a
//! real cluster prints: a CRD's `additionalPrinterColumns`, and the usual
//! columns of Services and Nodes.

use serde_json::{Value, json};

use super::registry::ResourceDef;

/// Evaluate the JSONPath subset printer columns use: `.a.b`, `.a[0]`,
/// `.a[*].b` and `.a[?(@.k=="v")].b`.
pub fn jsonpath(obj: &Value, path: &str) -> Vec<Value> {
    let mut current = vec![obj.clone()];
    let mut rest = path.trim();
    while !rest.is_empty() {
        if let Some(r) = rest.strip_prefix('.') {
            let end = r.find(['.', '[']).unwrap_or(r.len());
            let key = &r[..end];
            current = current.iter().filter_map(|v| v.get(key).cloned()).collect();
            rest = &r[end..];
        } else if let Some(r) = rest.strip_prefix('[') {
            let Some(end) = r.find(']') else {
                return Vec::new();
            };
            let inner = &r[..end];
            rest = &r[end + 1..];
            current = if inner == "*" {
                current
                    .iter()
                    .filter_map(|v| v.as_array().cloned())
                    .flatten()
                    .collect()
            } else if let Ok(i) = inner.parse::<usize>() {
                current.iter().filter_map(|v| v.get(i).cloned()).collect()
            } else if let Some(cond) = inner.strip_prefix("?(@.").and_then(|c| c.strip_suffix(')'))
            {
                let Some((k, want)) = cond.split_once("==") else {
                    return Vec::new();
                };
                let want = want.trim().trim_matches('"').trim_matches('\'');
                current
                    .iter()
                    .filter_map(|v| v.as_array().cloned())
                    .flatten()
                    .filter(|item| {
                        item.get(k.trim()).is_some_and(|x| match x {
                            Value::String(s) => s == want,
                            other => {
                                *other == serde_json::from_str::<Value>(want).unwrap_or(Value::Null)
                            }
                        })
                    })
                    .collect()
            } else {
                return Vec::new();
            };
        } else {
            return Vec::new();
        }
    }
    current
}

fn text(v: &Value) -> String {
    v.as_str()
        .map(str::to_string)
        .unwrap_or_else(|| v.to_string())
}

/// One cell: a single scalar as is, a list (or several matches) joined with
/// commas as kubectl shows them.
fn cell(values: Vec<Value>) -> Value {
    let joined =
        |items: &[Value]| Value::String(items.iter().map(text).collect::<Vec<_>>().join(","));
    match values.as_slice() {
        [] => Value::Null,
        [Value::Array(a)] => joined(a),
        [v] => v.clone(),
        many => joined(many),
    }
}

/// kubectl's `HumanDuration`: what an AGE cell says.
pub fn human_duration(secs: i64) -> String {
    if secs < -1 {
        return "<invalid>".into();
    }
    let secs = secs.max(0);
    if secs < 120 {
        return format!("{secs}s");
    }
    let minutes = secs / 60;
    if minutes < 10 {
        let s = secs % 60;
        return if s == 0 {
            format!("{minutes}m")
        } else {
            format!("{minutes}m{s}s")
        };
    }
    if minutes < 180 {
        return format!("{minutes}m");
    }
    let hours = minutes / 60;
    if hours < 8 {
        let m = minutes % 60;
        return if m == 0 {
            format!("{hours}h")
        } else {
            format!("{hours}h{m}m")
        };
    }
    if hours < 48 {
        return format!("{hours}h");
    }
    if hours < 24 * 8 {
        let h = hours % 24;
        return if h == 0 {
            format!("{}d", hours / 24)
        } else {
            format!("{}d{h}h", hours / 24)
        };
    }
    if hours < 24 * 365 * 2 {
        return format!("{}d", hours / 24);
    }
    if hours < 24 * 365 * 8 {
        let d = (hours / 24) % 365;
        return if d == 0 {
            format!("{}y", hours / 24 / 365)
        } else {
            format!("{}y{d}d", hours / 24 / 365)
        };
    }
    format!("{}y", hours / 24 / 365)
}

/// Date cells are rendered as ages, as the real server does.
fn date_cell(v: Value) -> Value {
    match v.as_str().and_then(|s| s.parse::<jiff::Timestamp>().ok()) {
        Some(t) => Value::String(human_duration(
            jiff::Timestamp::now().as_second() - t.as_second(),
        )),
        None => v,
    }
}

/// The Object column of Events: `kind/name` of what they are about, as a
/// real server prints it.
const OBJECT: &str = "@involvedObject";

struct Column {
    name: String,
    type_: String,
    priority: i64,
    path: String,
}

fn columns(def: &ResourceDef) -> Vec<Column> {
    let col = |name: &str, type_: &str, path: &str| Column {
        name: name.into(),
        type_: type_.into(),
        priority: 0,
        path: path.into(),
    };
    let mut cols = vec![col("Name", "string", ".metadata.name")];
    match (def.group.as_str(), def.kind.as_str()) {
        ("", "Service") => cols.extend([
            col("Type", "string", ".spec.type"),
            col("Cluster-IP", "string", ".spec.clusterIP"),
            col(
                "External-IP",
                "string",
                ".status.loadBalancer.ingress[*].ip",
            ),
            col("Port(s)", "string", ".spec.ports[*].port"),
        ]),
        ("", "Event") => cols.extend([
            col("Type", "string", ".type"),
            col("Reason", "string", ".reason"),
            col("Object", "string", OBJECT),
            col("Message", "string", ".message"),
        ]),
        ("", "Node") => cols.push(col(
            "Status",
            "string",
            ".status.conditions[?(@.type==\"Ready\")].type",
        )),
        _ => {}
    }
    for c in &def.printer_columns {
        cols.push(Column {
            name: c
                .get("name")
                .and_then(Value::as_str)
                .unwrap_or_default()
                .into(),
            type_: c
                .get("type")
                .and_then(Value::as_str)
                .unwrap_or("string")
                .into(),
            priority: c.get("priority").and_then(Value::as_i64).unwrap_or(0),
            path: c
                .get("jsonPath")
                .and_then(Value::as_str)
                .unwrap_or_default()
                .into(),
        });
    }
    if !cols.iter().any(|c| c.name == "Age") {
        cols.push(col("Age", "date", ".metadata.creationTimestamp"));
    }
    cols
}

/// A Table of `items` (already filtered), as `kubectl get` asks for.
pub fn table(def: &ResourceDef, items: &[Value], resource_version: u64) -> Value {
    let cols = columns(def);
    let rows: Vec<Value> = items
        .iter()
        .map(|o| {
            json!({
                "cells": cols.iter().map(|c| {
                    if c.path == OBJECT {
                        let kind = o.pointer("/involvedObject/kind").and_then(Value::as_str).unwrap_or_default();
                        let name = o.pointer("/involvedObject/name").and_then(Value::as_str).unwrap_or_default();
                        return Value::String(format!("{}/{name}", kind.to_lowercase()));
                    }
                    let v = cell(jsonpath(o, &c.path));
                    if c.type_ == "date" { date_cell(v) } else { v }
                }).collect::<Vec<_>>(),
                "object": {
                    "kind": "PartialObjectMetadata",
                    "apiVersion": "meta.k8s.io/v1",
                    "metadata": o.get("metadata").cloned().unwrap_or(json!({})),
                },
            })
        })
        .collect();
    json!({
        "kind": "Table",
        "apiVersion": "meta.k8s.io/v1",
        "metadata": {"resourceVersion": resource_version.to_string()},
        "columnDefinitions": cols.iter().map(|c| json!({
            "name": c.name,
            "type": c.type_,
            "format": if c.name == "Name" { "name" } else { "" },
            "description": "",
            "priority": c.priority,
        })).collect::<Vec<_>>(),
        "rows": rows,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ages_read_like_kubectl() {
        for (secs, want) in [
            (5, "5s"),
            (119, "119s"),
            (150, "2m30s"),
            (600, "10m"),
            (3 * 3600 + 60, "3h1m"),
            (30 * 3600, "30h"),
            (3 * 86400 + 3600, "3d1h"),
            (40 * 86400, "40d"),
            (3 * 365 * 86400, "3y"),
        ] {
            assert_eq!(human_duration(secs), want, "{secs}");
        }
    }

    #[test]
    fn jsonpath_subset() {
        let o = json!({"status": {"conditions": [
            {"type": "Ready", "status": "True"}, {"type": "Invalid", "status": "False"}
        ], "n": 3}, "spec": {"addresses": ["a", "b"], "ports": [{"port": 80}, {"port": 443}]}});
        assert_eq!(jsonpath(&o, ".status.n"), vec![json!(3)]);
        assert_eq!(
            jsonpath(&o, ".status.conditions[?(@.type==\"Ready\")].status"),
            vec![json!("True")]
        );
        assert_eq!(cell(jsonpath(&o, ".spec.addresses")), json!("a,b"));
        assert_eq!(cell(jsonpath(&o, ".spec.ports[*].port")), json!("80,443"));
        assert_eq!(jsonpath(&o, ".spec.addresses[1]"), vec![json!("b")]);
        assert!(jsonpath(&o, ".missing.x").is_empty());
    }
}
