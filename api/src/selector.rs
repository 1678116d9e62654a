//! Label selectors: the `metav1.LabelSelector` wire shape and its evaluation.
//!
//! The wire type keeps `operator` as a plain string so that a selector with an
//! unknown operator still deserializes: the object is then reported as
//! unusable instead of breaking the watch or the whole file it came in. The
//! CRD schema carries the operator enum, so the API server rejects such
//! selectors up front where it can.
//!
//! [`Selector`] is the compiled form, validated exactly as
//! `metav1.LabelSelectorAsSelector` does, so errors read the same as
//! Kubernetes'.

use std::collections::BTreeMap;
use std::fmt;

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use crate::validation;

/// A label query over a set of objects: `matchLabels` and `matchExpressions`
/// are ANDed; an empty selector matches everything.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
#[schemars(extend("x-kubernetes-map-type" = "atomic"))]
pub struct LabelSelector {
    /// `{key: value}` pairs, each equivalent to an `In` expression with one value.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(extend(
        "maxProperties" = 64,
        "additionalProperties" = {"type": "string", "maxLength": 63, "pattern": LABEL_VALUE_PATTERN},
    ))]
    pub match_labels: Option<BTreeMap<String, String>>,
    /// Requirements, ANDed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub match_expressions: Option<Vec<LabelSelectorRequirement>>,
}

/// Label keys and values as the API server checks them on Pods and Nodes,
/// so a typo in a selector is refused at `kubectl apply` instead of being
/// found by every agent. The agents still check (an object may predate the
/// schema), and keep the last valid form of an object in force. The keys of
/// `matchLabels` are left to them: a CEL rule over map keys costs more than
/// the API server's budget allows.
const QUALIFIED_NAME_PATTERN: &str = r"^([a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*/)?[A-Za-z0-9]([-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?$";
const LABEL_VALUE_PATTERN: &str = r"^(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])?$";

/// One `matchExpressions` entry.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
#[schemars(extend("x-kubernetes-validations" = [{
    "rule": "self.operator in ['In', 'NotIn'] ? (has(self.values) && size(self.values) > 0) : (!has(self.values) || size(self.values) == 0)",
    "message": "values must be non-empty for In and NotIn, and empty for Exists and DoesNotExist",
}]))]
pub struct LabelSelectorRequirement {
    /// The label key the selector applies to.
    #[schemars(extend("maxLength" = 317, "pattern" = QUALIFIED_NAME_PATTERN))]
    pub key: String,
    /// `In`, `NotIn`, `Exists` or `DoesNotExist`.
    #[schemars(extend("enum" = ["In", "NotIn", "Exists", "DoesNotExist"]))]
    pub operator: String,
    /// Values for `In`/`NotIn` (non-empty); must be empty for `Exists`/`DoesNotExist`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(extend(
        "maxItems" = 256,
        "items" = {"type": "string", "maxLength": 63, "pattern": LABEL_VALUE_PATTERN},
    ))]
    pub values: Option<Vec<String>>,
}

impl LabelSelector {
    /// A selector from `matchLabels` only; convenient for tests and builders.
    pub fn from_labels<'a>(labels: impl IntoIterator<Item = (&'a str, &'a str)>) -> Self {
        LabelSelector {
            match_labels: Some(
                labels
                    .into_iter()
                    .map(|(k, v)| (k.to_string(), v.to_string()))
                    .collect(),
            ),
            match_expressions: None,
        }
    }
}

/// Why a selector cannot be used. `Display` gives the text Kubernetes gives.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum SelectorError {
    #[error("{0:?} is not a valid label selector operator")]
    UnknownOperator(String),
    #[error("key: Invalid value: {key:?}: {detail}")]
    InvalidKey { key: String, detail: String },
    #[error("values: Invalid value: {}: for 'in', 'notin' operators, values set can't be empty", go_slice(.0))]
    EmptyValues(Vec<String>),
    #[error("values: Invalid value: {}: values set must be empty for exists and does not exist", go_slice(.0))]
    UnexpectedValues(Vec<String>),
    #[error("values[{index}][{key}]: Invalid value: {value:?}: {detail}")]
    InvalidValue {
        index: usize,
        key: String,
        value: String,
        detail: String,
    },
}

/// Go's `%#v` of a `[]string`, as it appears inside Kubernetes' messages.
fn go_slice(values: &[String]) -> String {
    if values.is_empty() {
        return "[]string(nil)".to_string();
    }
    let items: Vec<String> = values.iter().map(|v| format!("{v:?}")).collect();
    format!("[]string{{{}}}", items.join(", "))
}

/// The compiled, validated form of a [`LabelSelector`].
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Selector {
    requirements: Vec<Requirement>,
}

#[derive(Clone, Debug, PartialEq, Eq)]
enum Requirement {
    In(String, Vec<String>),
    NotIn(String, Vec<String>),
    Exists(String),
    DoesNotExist(String),
}

impl Requirement {
    fn matches(&self, labels: &BTreeMap<String, String>) -> bool {
        match self {
            Requirement::In(k, vs) => labels.get(k).is_some_and(|v| vs.contains(v)),
            Requirement::NotIn(k, vs) => labels.get(k).is_none_or(|v| !vs.contains(v)),
            Requirement::Exists(k) => labels.contains_key(k),
            Requirement::DoesNotExist(k) => !labels.contains_key(k),
        }
    }
}

impl Selector {
    /// The selector that matches every object (an empty `LabelSelector`).
    pub fn everything() -> Self {
        Selector::default()
    }

    /// True when the selector has no requirements and so matches everything.
    pub fn is_everything(&self) -> bool {
        self.requirements.is_empty()
    }

    pub fn matches(&self, labels: &BTreeMap<String, String>) -> bool {
        self.requirements.iter().all(|r| r.matches(labels))
    }

    /// Compile and validate, stopping at the first problem as Kubernetes does.
    pub fn parse(selector: &LabelSelector) -> Result<Self, SelectorError> {
        let mut requirements = Vec::new();
        for (k, v) in selector.match_labels.iter().flatten() {
            validate_key(k)?;
            validate_value(0, k, v)?;
            requirements.push(Requirement::In(k.clone(), vec![v.clone()]));
        }
        for expr in selector.match_expressions.iter().flatten() {
            let values = expr.values.clone().unwrap_or_default();
            let op = expr.operator.as_str();
            if !matches!(op, "In" | "NotIn" | "Exists" | "DoesNotExist") {
                return Err(SelectorError::UnknownOperator(expr.operator.clone()));
            }
            validate_key(&expr.key)?;
            match op {
                "In" | "NotIn" if values.is_empty() => {
                    return Err(SelectorError::EmptyValues(values));
                }
                "Exists" | "DoesNotExist" if !values.is_empty() => {
                    return Err(SelectorError::UnexpectedValues(values));
                }
                _ => {}
            }
            for (i, v) in values.iter().enumerate() {
                validate_value(i, &expr.key, v)?;
            }
            let key = expr.key.clone();
            requirements.push(match op {
                "In" => Requirement::In(key, values),
                "NotIn" => Requirement::NotIn(key, values),
                "Exists" => Requirement::Exists(key),
                _ => Requirement::DoesNotExist(key),
            });
        }
        Ok(Selector { requirements })
    }
}

impl TryFrom<&LabelSelector> for Selector {
    type Error = SelectorError;
    fn try_from(s: &LabelSelector) -> Result<Self, SelectorError> {
        Selector::parse(s)
    }
}

fn validate_key(key: &str) -> Result<(), SelectorError> {
    let errs = validation::qualified_name(key);
    if errs.is_empty() {
        Ok(())
    } else {
        Err(SelectorError::InvalidKey {
            key: key.to_string(),
            detail: errs.join("; "),
        })
    }
}

fn validate_value(index: usize, key: &str, value: &str) -> Result<(), SelectorError> {
    let errs = validation::label_value(value);
    if errs.is_empty() {
        Ok(())
    } else {
        Err(SelectorError::InvalidValue {
            index,
            key: key.to_string(),
            value: value.to_string(),
            detail: errs.join("; "),
        })
    }
}

impl fmt::Display for Selector {
    /// The selector in `kubectl -l` syntax, `<everything>` when empty.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.requirements.is_empty() {
            return f.write_str("<everything>");
        }
        for (i, r) in self.requirements.iter().enumerate() {
            if i > 0 {
                f.write_str(",")?;
            }
            match r {
                Requirement::In(k, vs) if vs.len() == 1 => write!(f, "{k}={}", vs[0])?,
                Requirement::In(k, vs) => write!(f, "{k} in ({})", vs.join(","))?,
                Requirement::NotIn(k, vs) => write!(f, "{k} notin ({})", vs.join(","))?,
                Requirement::Exists(k) => write!(f, "{k}")?,
                Requirement::DoesNotExist(k) => write!(f, "!{k}")?,
            }
        }
        Ok(())
    }
}

/// Parse a list of selectors that are ORed (as in `nodeSelectors`), naming the
/// failing entry by index so the message points into the object.
pub fn parse_list(field: &str, selectors: &[LabelSelector]) -> Result<Vec<Selector>, String> {
    selectors
        .iter()
        .enumerate()
        .map(|(i, s)| Selector::parse(s).map_err(|e| format!("{field}[{i}]: {e}")))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn labels(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
        pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    }

    fn expr(key: &str, op: &str, values: &[&str]) -> LabelSelector {
        LabelSelector {
            match_labels: None,
            match_expressions: Some(vec![LabelSelectorRequirement {
                key: key.into(),
                operator: op.into(),
                values: if values.is_empty() {
                    None
                } else {
                    Some(values.iter().map(|v| v.to_string()).collect())
                },
            }]),
        }
    }

    #[test]
    fn evaluation_table() {
        let node = labels(&[("zone", "a"), ("role", "lb")]);
        let cases: &[(&str, LabelSelector, bool)] = &[
            ("empty matches all", LabelSelector::default(), true),
            (
                "matchLabels hit",
                LabelSelector::from_labels([("zone", "a")]),
                true,
            ),
            (
                "matchLabels miss",
                LabelSelector::from_labels([("zone", "b")]),
                false,
            ),
            (
                "matchLabels all must hold",
                LabelSelector::from_labels([("zone", "a"), ("role", "x")]),
                false,
            ),
            ("In hit", expr("zone", "In", &["b", "a"]), true),
            ("In miss", expr("zone", "In", &["b"]), false),
            ("In absent key", expr("gpu", "In", &["true"]), false),
            ("NotIn hit", expr("zone", "NotIn", &["a"]), false),
            ("NotIn other", expr("zone", "NotIn", &["b"]), true),
            (
                "NotIn absent key matches",
                expr("gpu", "NotIn", &["true"]),
                true,
            ),
            ("Exists", expr("role", "Exists", &[]), true),
            ("Exists absent", expr("gpu", "Exists", &[]), false),
            ("DoesNotExist", expr("gpu", "DoesNotExist", &[]), true),
            (
                "DoesNotExist present",
                expr("role", "DoesNotExist", &[]),
                false,
            ),
        ];
        for (name, sel, want) in cases {
            let s = Selector::parse(sel).unwrap();
            assert_eq!(s.matches(&node), *want, "{name}");
        }
        // matchLabels and matchExpressions are ANDed.
        let mut both = LabelSelector::from_labels([("zone", "a")]);
        both.match_expressions = expr("gpu", "Exists", &[]).match_expressions;
        assert!(!Selector::parse(&both).unwrap().matches(&node));
    }

    #[test]
    fn invalid_selectors_read_like_kubernetes() {
        let cases: &[(LabelSelector, &str)] = &[
            (
                expr("zone", "Foo", &["a"]),
                r#""Foo" is not a valid label selector operator"#,
            ),
            (
                expr("zone", "in", &["a"]),
                r#""in" is not a valid label selector operator"#,
            ),
            (
                expr("zone", "In", &[]),
                "values: Invalid value: []string(nil): for 'in', 'notin' operators, values set can't be empty",
            ),
            (
                expr("zone", "NotIn", &[]),
                "values: Invalid value: []string(nil): for 'in', 'notin' operators, values set can't be empty",
            ),
            (
                expr("zone", "Exists", &["foo"]),
                r#"values: Invalid value: []string{"foo"}: values set must be empty for exists and does not exist"#,
            ),
            (
                expr("zone", "DoesNotExist", &["a", "b"]),
                r#"values: Invalid value: []string{"a", "b"}: values set must be empty for exists and does not exist"#,
            ),
            (
                expr("bad key", "Exists", &[]),
                r#"key: Invalid value: "bad key": name part must consist of alphanumeric characters, '-', '_' or '.', and must start and end with an alphanumeric character (e.g. 'MyName',  or 'my.name',  or '123-abc', regex used for validation is '([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9]')"#,
            ),
            (
                expr("zone", "In", &["ok", "not ok"]),
                r#"values[1][zone]: Invalid value: "not ok": a valid label must be an empty string or consist of alphanumeric characters, '-', '_' or '.', and must start and end with an alphanumeric character (e.g. 'MyValue',  or 'my_value',  or '12345', regex used for validation is '(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])?')"#,
            ),
            (
                LabelSelector::from_labels([("app", "-x")]),
                r#"values[0][app]: Invalid value: "-x": a valid label must be an empty string or consist of alphanumeric characters, '-', '_' or '.', and must start and end with an alphanumeric character (e.g. 'MyValue',  or 'my_value',  or '12345', regex used for validation is '(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])?')"#,
            ),
            (
                LabelSelector::from_labels([("a/b/c", "x")]),
                r#"key: Invalid value: "a/b/c": a qualified name must consist of alphanumeric characters, '-', '_' or '.', and must start and end with an alphanumeric character (e.g. 'MyName',  or 'my.name',  or '123-abc', regex used for validation is '([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9]') with an optional DNS subdomain prefix and '/' (e.g. 'example.com/MyName')"#,
            ),
        ];
        for (sel, want) in cases {
            let err = Selector::parse(sel).unwrap_err();
            assert_eq!(err.to_string(), *want);
        }
    }

    #[test]
    fn empty_label_value_is_valid() {
        let s = Selector::parse(&LabelSelector::from_labels([("gpu", "")])).unwrap();
        assert!(s.matches(&labels(&[("gpu", "")])));
        assert!(!s.matches(&labels(&[])));
    }

    #[test]
    fn list_errors_name_the_entry() {
        let list = vec![LabelSelector::default(), expr("zone", "Bogus", &[])];
        assert_eq!(
            parse_list("spec.nodeSelectors", &list).unwrap_err(),
            r#"spec.nodeSelectors[1]: "Bogus" is not a valid label selector operator"#
        );
    }

    #[test]
    fn wire_shape_is_metav1() {
        let yaml =
            "matchLabels: {a: b}\nmatchExpressions:\n- {key: k, operator: Bogus, values: [x]}\n";
        let s: LabelSelector = serde_saphyr::from_str(yaml).unwrap();
        assert_eq!(s.match_expressions.as_ref().unwrap()[0].operator, "Bogus");
        let json = serde_json::to_value(&s).unwrap();
        assert_eq!(json["matchLabels"]["a"], "b");
        assert_eq!(json["matchExpressions"][0]["key"], "k");
    }

    #[test]
    fn display_is_kubectl_syntax() {
        let mut s = LabelSelector::from_labels([("zone", "a")]);
        s.match_expressions = expr("gpu", "DoesNotExist", &[]).match_expressions;
        assert_eq!(Selector::parse(&s).unwrap().to_string(), "zone=a,!gpu");
        assert_eq!(Selector::everything().to_string(), "<everything>");
    }
}
