//! `labelSelector` and `fieldSelector` query parameters, in the string
//! syntax clients send: `a=b,c!=d,e in (x,y),f notin (z),g,!h`.

use serde_json::Value;

use super::error::ApiError;

#[derive(Clone, Debug, PartialEq)]
enum Req {
    Eq(String, String),
    NotEq(String, String),
    In(String, Vec<String>),
    NotIn(String, Vec<String>),
    Exists(String),
    NotExists(String),
}

/// A parsed label selector; empty matches everything.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct LabelSelector(Vec<Req>);

struct Lexer<'a> {
    s: &'a [u8],
    i: usize,
}

impl<'a> Lexer<'a> {
    fn skip_ws(&mut self) {
        while self.i < self.s.len() && self.s[self.i].is_ascii_whitespace() {
            self.i += 1;
        }
    }
    fn peek(&mut self) -> Option<u8> {
        self.skip_ws();
        self.s.get(self.i).copied()
    }
    fn eat(&mut self, lit: &str) -> bool {
        self.skip_ws();
        if self.s[self.i..].starts_with(lit.as_bytes()) {
            self.i += lit.len();
            true
        } else {
            false
        }
    }
    /// A key or value: anything up to a delimiter.
    fn word(&mut self) -> String {
        self.skip_ws();
        let start = self.i;
        while self.i < self.s.len() && !b" \t,()=!".contains(&self.s[self.i]) {
            self.i += 1;
        }
        String::from_utf8_lossy(&self.s[start..self.i]).into_owned()
    }
    /// `in` or `notin` followed by whitespace or `(`.
    fn keyword(&mut self, kw: &str) -> bool {
        self.skip_ws();
        let rest = &self.s[self.i..];
        if rest.starts_with(kw.as_bytes())
            && rest
                .get(kw.len())
                .is_some_and(|c| c.is_ascii_whitespace() || *c == b'(')
        {
            self.i += kw.len();
            true
        } else {
            false
        }
    }
}

impl LabelSelector {
    pub fn parse(s: &str) -> Result<Self, ApiError> {
        let bad = |why: &str| {
            ApiError::bad_request(format!(
                "unable to parse requirement: {why} in labelSelector {s:?}"
            ))
        };
        let mut lx = Lexer {
            s: s.as_bytes(),
            i: 0,
        };
        let mut reqs = Vec::new();
        if lx.peek().is_none() {
            return Ok(LabelSelector(reqs));
        }
        loop {
            if lx.eat("!") {
                let k = lx.word();
                if k.is_empty() {
                    return Err(bad("missing key after '!'"));
                }
                reqs.push(Req::NotExists(k));
            } else {
                let k = lx.word();
                if k.is_empty() {
                    return Err(bad("missing key"));
                }
                if lx.eat("!=") {
                    reqs.push(Req::NotEq(k, lx.word()));
                } else if lx.eat("==") || lx.eat("=") {
                    reqs.push(Req::Eq(k, lx.word()));
                } else if lx.keyword("notin") || lx.keyword("in") {
                    let negate = lx.s[..lx.i].ends_with(b"notin");
                    if !lx.eat("(") {
                        return Err(bad("expected '('"));
                    }
                    let mut vals = Vec::new();
                    loop {
                        vals.push(lx.word());
                        if lx.eat(")") {
                            break;
                        }
                        if !lx.eat(",") {
                            return Err(bad("expected ',' or ')'"));
                        }
                    }
                    reqs.push(if negate {
                        Req::NotIn(k, vals)
                    } else {
                        Req::In(k, vals)
                    });
                } else {
                    reqs.push(Req::Exists(k));
                }
            }
            match lx.peek() {
                None => break,
                Some(b',') => {
                    lx.i += 1;
                }
                Some(_) => return Err(bad("expected ','")),
            }
        }
        Ok(LabelSelector(reqs))
    }

    pub fn matches(&self, obj: &Value) -> bool {
        let labels = obj.pointer("/metadata/labels");
        let get = |k: &str| labels.and_then(|l| l.get(k)).and_then(Value::as_str);
        self.0.iter().all(|r| match r {
            Req::Eq(k, v) => get(k) == Some(v.as_str()),
            Req::NotEq(k, v) => get(k) != Some(v.as_str()),
            Req::In(k, vs) => get(k).is_some_and(|x| vs.iter().any(|v| v == x)),
            Req::NotIn(k, vs) => get(k).is_none_or(|x| !vs.iter().any(|v| v == x)),
            Req::Exists(k) => get(k).is_some(),
            Req::NotExists(k) => get(k).is_none(),
        })
    }
}

/// A parsed field selector over `metadata.name` and `metadata.namespace`,
/// and the fields a real server lets Events be selected by (what
/// `kubectl describe` asks for).
#[derive(Clone, Debug, Default, PartialEq)]
pub struct FieldSelector(Vec<(String, bool, String)>);

impl FieldSelector {
    pub fn parse(s: &str) -> Result<Self, ApiError> {
        let mut out = Vec::new();
        for part in s.split(',').map(str::trim).filter(|p| !p.is_empty()) {
            let (field, eq, value) = if let Some((f, v)) = part.split_once("!=") {
                (f, false, v)
            } else if let Some((f, v)) = part.split_once("==") {
                (f, true, v)
            } else if let Some((f, v)) = part.split_once('=') {
                (f, true, v)
            } else {
                return Err(ApiError::bad_request(format!(
                    "invalid selector: '{s}'; can't understand '{part}'"
                )));
            };
            let field = field.trim();
            let event_field = field.starts_with("involvedObject.")
                || matches!(field, "reason" | "type" | "source" | "reportingComponent");
            if !matches!(field, "metadata.name" | "metadata.namespace") && !event_field {
                return Err(ApiError::bad_request(format!(
                    "field label not supported: {field}"
                )));
            }
            out.push((field.to_string(), eq, value.trim().to_string()));
        }
        Ok(FieldSelector(out))
    }

    pub fn matches(&self, obj: &Value) -> bool {
        self.0.iter().all(|(field, eq, value)| {
            let actual = match field.as_str() {
                "source" => obj.pointer("/source/component"),
                f => obj.pointer(&format!("/{}", f.replace('.', "/"))),
            }
            .and_then(Value::as_str)
            .unwrap_or_default();
            (actual == value) == *eq
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn obj(labels: Value) -> Value {
        json!({"metadata": {"name": "x", "namespace": "ns", "labels": labels}})
    }

    #[test]
    fn label_selector_syntax() {
        let o = obj(json!({"app": "web", "tier": "front", "zone": "a"}));
        let cases = [
            ("", true),
            ("app=web", true),
            ("app==web", true),
            ("app!=web", false),
            ("app=db", false),
            ("app in (db, web)", true),
            ("app notin (db,web)", false),
            ("gpu notin (true)", true),
            ("tier", true),
            ("!tier", false),
            ("!gpu", true),
            ("app=web,zone in (a,b),!gpu", true),
            ("app=web, zone=b", false),
            ("inner in (x)", false),
        ];
        for (sel, want) in cases {
            assert_eq!(
                LabelSelector::parse(sel).unwrap().matches(&o),
                want,
                "{sel}"
            );
        }
        assert!(LabelSelector::parse("app in web").is_err());
        assert!(LabelSelector::parse("a=b c=d").is_err());
        assert!(LabelSelector::parse(",").is_err());
    }

    #[test]
    fn field_selector_syntax() {
        let o = obj(json!({}));
        assert!(FieldSelector::parse("metadata.name=x").unwrap().matches(&o));
        assert!(
            !FieldSelector::parse("metadata.name!=x")
                .unwrap()
                .matches(&o)
        );
        assert!(
            FieldSelector::parse("metadata.namespace==ns,metadata.name=x")
                .unwrap()
                .matches(&o)
        );
        let err = FieldSelector::parse("spec.nodeName=a").unwrap_err();
        assert_eq!(err.code, 400);
        assert_eq!(err.message, "field label not supported: spec.nodeName");
    }
}
