//! PATCH bodies: JSON merge patch (RFC 7386), JSON patch (RFC 6902),
//! strategic merge patch (read as a merge patch: lists are replaced, not
//! merged by key) and server-side apply (create-or-merge, see
//! [`apply_merge`]).

use serde_json::Value;

use super::error::ApiError;
use super::store::PatchType;

pub fn apply(kind: PatchType, target: &mut Value, body: &[u8]) -> Result<(), ApiError> {
    match kind {
        PatchType::Merge | PatchType::Strategic => {
            let p: Value = serde_json::from_slice(body)
                .map_err(|e| ApiError::bad_request(format!("error decoding patch: {e}")))?;
            json_patch::merge(target, &p);
            Ok(())
        }
        PatchType::Json => {
            let p: json_patch::Patch = serde_json::from_slice(body)
                .map_err(|e| ApiError::bad_request(format!("error decoding patch: {e}")))?;
            json_patch::patch(target, &p).map_err(|e| ApiError {
                code: 422,
                reason: "Invalid",
                message: format!(
                    "the server rejected our request due to an error in our request: {e}"
                ),
                details: None,
            })
        }
        PatchType::Apply => {
            let applied = parse_apply(body)?;
            apply_merge(target, &applied);
            Ok(())
        }
    }
}

/// An apply configuration: YAML (of which JSON is a subset).
pub fn parse_apply(body: &[u8]) -> Result<Value, ApiError> {
    let text = std::str::from_utf8(body)
        .map_err(|_| ApiError::bad_request("the apply configuration is not UTF-8"))?;
    let v: Value = serde_saphyr::from_str(text)
        .map_err(|e| ApiError::bad_request(format!("error decoding YAML: {e}")))?;
    if !v.is_object() {
        return Err(ApiError::bad_request(
            "the apply configuration is not an object",
        ));
    }
    Ok(v)
}

/// Merge an apply configuration into the live object: maps merge
/// recursively, lists and scalars replace, explicit nulls remove. What the
/// apply leaves out is the store's to remove (`fields::given_up`): that
/// depends on who owns it.
pub fn apply_merge(target: &mut Value, applied: &Value) {
    match (target, applied) {
        (Value::Object(t), Value::Object(a)) => {
            for (k, v) in a {
                if v.is_null() {
                    t.remove(k);
                } else if let Some(existing) = t.get_mut(k) {
                    apply_merge(existing, v);
                } else {
                    t.insert(k.clone(), v.clone());
                }
            }
        }
        (t, a) => *t = a.clone(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn merge_json_and_apply() {
        let mut o = json!({"a": {"b": 1, "c": [1, 2]}, "d": 1});
        apply(
            PatchType::Merge,
            &mut o,
            br#"{"a": {"b": null, "c": [3]}, "e": 2}"#,
        )
        .unwrap();
        assert_eq!(o, json!({"a": {"c": [3]}, "d": 1, "e": 2}));
        apply(
            PatchType::Json,
            &mut o,
            br#"[{"op": "add", "path": "/a/c/-", "value": 4}, {"op": "remove", "path": "/d"}]"#,
        )
        .unwrap();
        assert_eq!(o, json!({"a": {"c": [3, 4]}, "e": 2}));
        let err = apply(
            PatchType::Json,
            &mut o,
            br#"[{"op": "test", "path": "/e", "value": 9}]"#,
        )
        .unwrap_err();
        assert_eq!(err.code, 422);
        apply(PatchType::Apply, &mut o, b"a:\n  x: z\ne: null\n").unwrap();
        assert_eq!(o, json!({"a": {"c": [3, 4], "x": "z"}}));
        assert_eq!(
            apply(PatchType::Merge, &mut o, b"{not json")
                .unwrap_err()
                .code,
            400
        );
    }
}
