//! Admission of custom resources against their CRD's `openAPIV3Schema`, in
//! the order the real server does it: null values of non-nullable fields and
//! unknown fields are pruned, defaults applied, then the object validated.
//!
//! Covered: `type` (object, array, string, integer, number, boolean),
//! `properties`, `additionalProperties`, `items`, `required`, `nullable`,
//! `enum`, `pattern`, `minimum`/`maximum`, `minItems`/`maxItems`,
//! `minLength`/`maxLength`, `default`, `x-kubernetes-preserve-unknown-fields`
//! and `x-kubernetes-int-or-string`. Not covered: CEL rules, formats.

use serde_json::{Map, Value};

use super::error::Cause;

fn child(path: &str, key: &str) -> String {
    if path.is_empty() {
        key.to_string()
    } else {
        format!("{path}.{key}")
    }
}

fn render(v: &Value) -> String {
    match v {
        Value::String(s) => format!("{s:?}"),
        other => other.to_string(),
    }
}

fn type_name(v: &Value) -> &'static str {
    match v {
        Value::Null => "null",
        Value::Bool(_) => "boolean",
        Value::Number(n) if n.is_i64() || n.is_u64() => "integer",
        Value::Number(_) => "number",
        Value::String(_) => "string",
        Value::Array(_) => "array",
        Value::Object(_) => "object",
    }
}

fn invalid(path: &str, v: &Value, detail: String) -> Cause {
    Cause {
        reason: "FieldValueInvalid",
        field: path.to_string(),
        message: format!("Invalid value: {}: {detail}", render(v)),
    }
}

/// What admission found: field problems, and the unknown fields it pruned
/// (an error instead under `fieldValidation=Strict`).
#[derive(Debug, Default)]
pub struct Admission {
    pub causes: Vec<Cause>,
    pub pruned: Vec<String>,
}

/// Prune, default and validate `obj` (a whole custom resource) in place.
pub fn admit(obj: &mut Value, schema: &Value) -> Admission {
    let mut a = Admission::default();
    let Some(map) = obj.as_object_mut() else {
        return a;
    };
    let props = schema.get("properties").and_then(Value::as_object);
    let empty = Map::new();
    let props = props.unwrap_or(&empty);
    let keys: Vec<String> = map.keys().cloned().collect();
    for k in keys {
        if matches!(k.as_str(), "apiVersion" | "kind" | "metadata") {
            continue;
        }
        admit_field(map, &k, props.get(&k), schema, "", &mut a);
    }
    apply_defaults(map, props);
    required(map, schema, "", &mut a.causes);
    a
}

/// Handle one field of an object: prune it, or walk into it.
fn admit_field(
    map: &mut Map<String, Value>,
    key: &str,
    prop: Option<&Value>,
    parent: &Value,
    path: &str,
    a: &mut Admission,
) {
    let preserve = parent
        .get("x-kubernetes-preserve-unknown-fields")
        .and_then(Value::as_bool)
        == Some(true);
    let schema = match (prop, parent.get("additionalProperties")) {
        (Some(s), _) => Some(s),
        (None, Some(a)) if a.is_object() => Some(a),
        (None, Some(Value::Bool(true))) => None,
        (None, _) if preserve => None,
        (None, _) => {
            map.remove(key);
            a.pruned.push(child(path, key));
            return;
        }
    };
    let Some(schema) = schema else { return };
    let nullable = schema.get("nullable").and_then(Value::as_bool) == Some(true);
    if map.get(key).is_some_and(Value::is_null) {
        if !nullable {
            map.remove(key);
        }
        return;
    }
    let v = map.get_mut(key).expect("present");
    walk(v, schema, &child(path, key), a);
}

fn apply_defaults(map: &mut Map<String, Value>, props: &Map<String, Value>) {
    for (k, p) in props {
        if !map.contains_key(k)
            && let Some(d) = p.get("default")
        {
            map.insert(k.clone(), d.clone());
        }
    }
}

fn required(map: &Map<String, Value>, schema: &Value, path: &str, causes: &mut Vec<Cause>) {
    for r in schema
        .get("required")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
    {
        if let Some(r) = r.as_str()
            && !map.contains_key(r)
        {
            causes.push(Cause {
                reason: "FieldValueRequired",
                field: child(path, r),
                message: "Required value".into(),
            });
        }
    }
}

fn walk(v: &mut Value, s: &Value, path: &str, a: &mut Admission) {
    let int_or_string = s.get("x-kubernetes-int-or-string").and_then(Value::as_bool) == Some(true);
    if int_or_string {
        if !(v.is_string() || v.is_i64() || v.is_u64()) {
            a.causes.push(invalid(
                path,
                v,
                format!(
                    "{path} in body must be of type int-or-string: {:?}",
                    type_name(v)
                ),
            ));
        }
        return;
    }
    let want = s.get("type").and_then(Value::as_str);
    let ok = match want {
        None => true,
        Some("integer") => v.is_i64() || v.is_u64(),
        Some("number") => v.is_number(),
        Some(t) => type_name(v) == t,
    };
    if !ok {
        a.causes.push(invalid(
            path,
            &Value::String(type_name(v).into()),
            format!(
                "{path} in body must be of type {}: {:?}",
                want.unwrap_or_default(),
                type_name(v)
            ),
        ));
        return;
    }
    if let Some(options) = s.get("enum").and_then(Value::as_array)
        && !options.contains(v)
    {
        let supported: Vec<String> = options.iter().map(render).collect();
        a.causes.push(Cause {
            reason: "FieldValueNotSupported",
            field: path.to_string(),
            message: format!(
                "Unsupported value: {}: supported values: {}",
                render(v),
                supported.join(", ")
            ),
        });
    }
    match v {
        Value::Object(map) => {
            let props = s
                .get("properties")
                .and_then(Value::as_object)
                .cloned()
                .unwrap_or_default();
            let keys: Vec<String> = map.keys().cloned().collect();
            for k in keys {
                admit_field(map, &k, props.get(&k), s, path, a);
            }
            apply_defaults(map, &props);
            required(map, s, path, &mut a.causes);
        }
        Value::Array(items) => {
            let n = items.len() as u64;
            if let Some(min) = s.get("minItems").and_then(Value::as_u64)
                && n < min
            {
                a.causes.push(invalid(
                    path,
                    &Value::from(n),
                    format!("{path} in body should have at least {min} items"),
                ));
            }
            if let Some(max) = s.get("maxItems").and_then(Value::as_u64)
                && n > max
            {
                a.causes.push(invalid(
                    path,
                    &Value::from(n),
                    format!("{path} in body should have at most {max} items"),
                ));
            }
            if let Some(item_schema) = s.get("items") {
                let nullable = item_schema.get("nullable").and_then(Value::as_bool) == Some(true);
                for (i, item) in items.iter_mut().enumerate() {
                    if item.is_null() && nullable {
                        continue;
                    }
                    walk(item, item_schema, &format!("{path}[{i}]"), a);
                }
            }
        }
        Value::String(_) | Value::Number(_) => scalar(v, s, path, &mut a.causes),
        _ => {}
    }
}

/// Checks on strings and numbers, which never change.
fn scalar(v: &Value, s: &Value, path: &str, causes: &mut Vec<Cause>) {
    match v {
        Value::String(text) => {
            let len = text.chars().count() as u64;
            if let Some(min) = s.get("minLength").and_then(Value::as_u64)
                && len < min
            {
                causes.push(invalid(
                    path,
                    v,
                    format!("{path} in body should be at least {min} chars long"),
                ));
            } else if let Some(max) = s.get("maxLength").and_then(Value::as_u64)
                && len > max
            {
                causes.push(Cause {
                    reason: "FieldValueTooLong",
                    field: path.to_string(),
                    message: format!("Too long: may not be more than {max} bytes"),
                });
            }
            if let Some(p) = s.get("pattern").and_then(Value::as_str) {
                match regex::Regex::new(p) {
                    Ok(re) if !re.is_match(text) => causes.push(invalid(
                        path,
                        v,
                        format!("{path} in body should match '{p}'"),
                    )),
                    Ok(_) => {}
                    Err(_) => causes.push(invalid(
                        path,
                        v,
                        format!("the schema's pattern '{p}' does not compile"),
                    )),
                }
            }
        }
        Value::Number(n) => {
            let x = n.as_f64().unwrap_or_default();
            let fmt = |b: f64| {
                if b.fract() == 0.0 {
                    format!("{}", b as i64)
                } else {
                    b.to_string()
                }
            };
            if let Some(min) = s.get("minimum").and_then(Value::as_f64)
                && x < min
            {
                causes.push(invalid(
                    path,
                    v,
                    format!(
                        "{path} in body should be greater than or equal to {}",
                        fmt(min)
                    ),
                ));
            }
            if let Some(max) = s.get("maximum").and_then(Value::as_f64)
                && x > max
            {
                causes.push(invalid(
                    path,
                    v,
                    format!(
                        "{path} in body should be less than or equal to {}",
                        fmt(max)
                    ),
                ));
            }
        }
        _ => {}
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn schema() -> Value {
        json!({
            "type": "object",
            "properties": {
                "spec": {
                    "type": "object",
                    "required": ["addresses"],
                    "properties": {
                        "addresses": {"type": "array", "items": {"type": "string", "pattern": "^[0-9a-f.:/-]+$"}},
                        "autoAssign": {"type": "boolean", "default": true},
                        "weight": {"type": "integer", "minimum": 1.0, "maximum": 100.0},
                        "op": {"type": "string", "enum": ["In", "NotIn"]},
                        "labels": {"type": "object", "additionalProperties": {"type": "string"}},
                        "opaque": {"type": "object", "x-kubernetes-preserve-unknown-fields": true},
                        "maybe": {"type": "string", "nullable": true},
                        "port": {"x-kubernetes-int-or-string": true}
                    }
                },
                "status": {"type": "object", "properties": {"n": {"type": "integer"}}}
            }
        })
    }

    fn messages(c: &[Cause]) -> Vec<String> {
        c.iter()
            .map(|c| format!("{}: {}", c.field, c.message))
            .collect()
    }

    #[test]
    fn prunes_defaults_and_accepts_a_good_object() {
        let mut o = json!({
            "apiVersion": "x/v1", "kind": "K", "metadata": {"name": "a", "extra": 1},
            "spec": {"addresses": ["10.0.0.0/24"], "unknown": 1, "labels": {"a": "b"},
                     "opaque": {"anything": [1, {"x": 2}]}, "maybe": null, "weight": null, "port": "http"},
            "junk": true
        });
        let a = admit(&mut o, &schema());
        assert!(a.causes.is_empty());
        assert_eq!(a.pruned, vec!["junk", "spec.unknown"]);
        assert_eq!(o["spec"]["autoAssign"], true);
        assert!(o["spec"].get("unknown").is_none());
        assert!(o.get("junk").is_none());
        assert_eq!(o["metadata"]["extra"], 1, "metadata is never pruned");
        assert_eq!(o["spec"]["opaque"]["anything"][1]["x"], 2);
        assert!(o["spec"]["maybe"].is_null());
        assert!(
            o["spec"].get("weight").is_none(),
            "null of a non-nullable field is pruned"
        );
    }

    #[test]
    fn reports_every_problem_like_the_real_server() {
        let mut o = json!({
            "spec": {"addresses": "10.0.0.0/24", "weight": 0, "op": "Near", "labels": {"a": 1}, "port": true}
        });
        let got = messages(&admit(&mut o, &schema()).causes);
        assert_eq!(
            got,
            vec![
                r#"spec.addresses: Invalid value: "string": spec.addresses in body must be of type array: "string""#,
                r#"spec.labels.a: Invalid value: "integer": spec.labels.a in body must be of type string: "integer""#,
                r#"spec.op: Unsupported value: "Near": supported values: "In", "NotIn""#,
                r#"spec.port: Invalid value: true: spec.port in body must be of type int-or-string: "boolean""#,
                "spec.weight: Invalid value: 0: spec.weight in body should be greater than or equal to 1",
            ]
        );
        let mut o = json!({"spec": {"weight": 101, "addresses": ["BAD"]}});
        assert_eq!(
            messages(&admit(&mut o, &schema()).causes),
            vec![
                r#"spec.addresses[0]: Invalid value: "BAD": spec.addresses[0] in body should match '^[0-9a-f.:/-]+$'"#,
                "spec.weight: Invalid value: 101: spec.weight in body should be less than or equal to 100",
            ]
        );
        let mut o = json!({"spec": {}});
        assert_eq!(
            messages(&admit(&mut o, &schema()).causes),
            vec!["spec.addresses: Required value"]
        );
    }
}
