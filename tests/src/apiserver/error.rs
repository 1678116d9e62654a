//! API errors as Kubernetes returns them: a `kind: Status` body with a
//! reason, a message in the real server's words, and the HTTP code.

use serde_json::{Value, json};

use super::registry::GroupResource;

#[derive(Clone, Debug, PartialEq)]
pub struct ApiError {
    pub code: u16,
    pub reason: &'static str,
    pub message: String,
    pub details: Option<Value>,
}

/// One field problem in a 422.
#[derive(Clone, Debug, PartialEq)]
pub struct Cause {
    /// `FieldValueInvalid`, `FieldValueRequired`, `FieldValueNotSupported`.
    pub reason: &'static str,
    pub field: String,
    pub message: String,
}

impl ApiError {
    fn new(code: u16, reason: &'static str, message: impl Into<String>) -> Self {
        ApiError {
            code,
            reason,
            message: message.into(),
            details: None,
        }
    }

    fn with_details(mut self, details: Value) -> Self {
        self.details = Some(details);
        self
    }

    pub fn not_found(gr: &GroupResource, name: &str) -> Self {
        ApiError::new(404, "NotFound", format!("{gr} {name:?} not found")).with_details(json!({
            "name": name, "group": gr.group, "kind": gr.plural
        }))
    }

    /// A path that names no resource at all.
    pub fn no_route(path: &str) -> Self {
        ApiError::new(
            404,
            "NotFound",
            format!("the server could not find the requested resource ({path})"),
        )
    }

    pub fn already_exists(gr: &GroupResource, name: &str) -> Self {
        ApiError::new(
            409,
            "AlreadyExists",
            format!("{gr} {name:?} already exists"),
        )
        .with_details(json!({"name": name, "group": gr.group, "kind": gr.plural}))
    }

    pub fn conflict(gr: &GroupResource, name: &str) -> Self {
        ApiError::new(
            409,
            "Conflict",
            format!(
                "Operation cannot be fulfilled on {gr} {name:?}: the object has been modified; please apply your changes to the latest version and try again"
            ),
        )
        .with_details(json!({"name": name, "group": gr.group, "kind": gr.plural}))
    }

    pub fn precondition(gr: &GroupResource, name: &str, what: &str) -> Self {
        ApiError::new(
            409,
            "Conflict",
            format!("Operation cannot be fulfilled on {gr} {name:?}: {what}"),
        )
    }

    pub fn bad_request(message: impl Into<String>) -> Self {
        ApiError::new(400, "BadRequest", message)
    }

    pub fn method_not_allowed() -> Self {
        ApiError::new(
            405,
            "MethodNotAllowed",
            "the server does not allow this method on the requested resource",
        )
    }

    pub fn unsupported_media_type(content_type: &str) -> Self {
        ApiError::new(
            415,
            "UnsupportedMediaType",
            format!(
                "the body of the request was in an unknown format - accepted media types include: application/json-patch+json, application/merge-patch+json, application/apply-patch+yaml, application/strategic-merge-patch+json (got {content_type:?})"
            ),
        )
    }

    pub fn gone(requested: u64, oldest: u64) -> Self {
        ApiError::new(
            410,
            "Expired",
            format!("too old resource version: {requested} ({oldest})"),
        )
    }

    pub fn internal(message: &str) -> Self {
        ApiError::new(
            500,
            "InternalError",
            format!("Internal error occurred: {message}"),
        )
    }

    pub fn unavailable() -> Self {
        ApiError::new(
            503,
            "ServiceUnavailable",
            "the server is currently unable to handle the request",
        )
    }

    /// The request's `timeout` passed before it was done; nothing applied.
    pub fn timeout() -> Self {
        ApiError::new(
            504,
            "Timeout",
            "Timeout: request did not complete within requested timeout - context deadline exceeded",
        )
    }

    /// A 422 with one cause per field problem, shaped as the real server's.
    pub fn invalid(
        qualified_kind: &str,
        group: &str,
        kind: &str,
        name: &str,
        causes: Vec<Cause>,
    ) -> Self {
        let list: Vec<String> = causes
            .iter()
            .map(|c| format!("{}: {}", c.field, c.message))
            .collect();
        let joined = if list.len() == 1 {
            list[0].clone()
        } else {
            format!("[{}]", list.join(", "))
        };
        ApiError::new(
            422,
            "Invalid",
            format!("{qualified_kind} {name:?} is invalid: {joined}"),
        )
        .with_details(json!({
            "name": name,
            "group": group,
            "kind": kind,
            "causes": causes.iter().map(|c| json!({
                "reason": c.reason,
                "message": format!("{}: {}", c.field, c.message),
                "field": c.field,
            })).collect::<Vec<_>>(),
        }))
    }

    /// A 422 without field causes, for a body that cannot be an object.
    pub fn unprocessable(message: impl Into<String>) -> Self {
        ApiError::new(422, "Invalid", message)
    }

    pub fn invalid_crd(name: &str, message: &str) -> Self {
        ApiError::new(
            422,
            "Invalid",
            format!("CustomResourceDefinition.apiextensions.k8s.io {name:?} is invalid: {message}"),
        )
    }

    pub fn status(&self) -> Value {
        let mut s = json!({
            "kind": "Status",
            "apiVersion": "v1",
            "metadata": {},
            "status": "Failure",
            "message": self.message,
            "reason": self.reason,
            "code": self.code,
        });
        if let Some(d) = &self.details {
            s["details"] = d.clone();
        }
        s
    }
}

impl std::fmt::Display for ApiError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{} ({}): {}", self.code, self.reason, self.message)
    }
}

impl std::error::Error for ApiError {}
