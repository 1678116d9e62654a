//! The HTTP face of the test server: Kubernetes paths, verbs, discovery,
//! watch streams and the `/testserver/...` control path.

use std::collections::HashMap;
use std::convert::Infallible;
use std::sync::{Arc, PoisonError};
use std::time::Duration;

use axum::body::{Body, Bytes};
use axum::extract::{Request, State};
use axum::http::{HeaderMap, Method, StatusCode, header};
use axum::response::{IntoResponse, Response};
use serde_json::{Value, json};
use tokio::sync::{broadcast, mpsc};
use tokio_stream::wrappers::ReceiverStream;

use super::error::ApiError;
use super::registry::ResourceDef;
use super::selectors::{FieldSelector, LabelSelector};
use super::store::{Event, EventKind, PatchType, WriteOpts};
use super::{App, Mode, RequestRecord};
use super::{protobuf, table};

fn json_response(code: StatusCode, v: &Value) -> Response {
    (
        code,
        [(header::CONTENT_TYPE, "application/json")],
        serde_json::to_vec(v).expect("values serialize"),
    )
        .into_response()
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        json_response(
            StatusCode::from_u16(self.code).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR),
            &self.status(),
        )
    }
}

fn query(req: &Request) -> HashMap<String, String> {
    req.uri()
        .query()
        .map(|q| {
            q.split('&')
                .filter(|p| !p.is_empty())
                .map(|p| {
                    let (k, v) = p.split_once('=').unwrap_or((p, ""));
                    (decode(k), decode(v))
                })
                .collect()
        })
        .unwrap_or_default()
}

/// Percent-decoding of a query component (`+` is a space).
fn decode(s: &str) -> String {
    let hex = |c: u8| (c as char).to_digit(16);
    let b = s.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        match b[i] {
            b'+' => out.push(b' '),
            b'%' if i + 2 < b.len() => match (hex(b[i + 1]), hex(b[i + 2])) {
                (Some(h), Some(l)) => {
                    out.push((h * 16 + l) as u8);
                    i += 2;
                }
                _ => out.push(b'%'),
            },
            c => out.push(c),
        }
        i += 1;
    }
    String::from_utf8_lossy(&out).into_owned()
}

fn flag(q: &HashMap<String, String>, k: &str) -> bool {
    matches!(q.get(k).map(String::as_str), Some("true" | "1"))
}

fn wants_table(headers: &HeaderMap) -> bool {
    headers
        .get(header::ACCEPT)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|a| a.contains("as=Table"))
}

/// Every request: control path, faults, then the API.
pub async fn handle(State(app): State<Arc<App>>, req: Request) -> Response {
    let path = req.uri().path().to_string();
    if let Some(cmd) = path.strip_prefix("/testserver/") {
        return control(&app, cmd, &query(&req));
    }
    let delay = app.faults.delay();
    if !delay.is_zero() {
        tokio::time::sleep(delay).await;
    }
    if app.faults.mode() == Mode::Unavailable {
        return ApiError::unavailable().into_response();
    }
    let method = req.method().clone();
    if !matches!(method, Method::GET | Method::HEAD) && app.faults.take_write_failure(&path) {
        return ApiError::internal("injected write failure").into_response();
    }
    let q = query(&req);
    let user_agent = req
        .headers()
        .get(header::USER_AGENT)
        .and_then(|v| v.to_str().ok())
        .unwrap_or_default()
        .to_string();
    let resp = match handle_in_time(&app, req, &path, &q, &user_agent).await {
        Ok(r) => r,
        Err(e) => e.into_response(),
    };
    app.requests
        .lock()
        .unwrap_or_else(PoisonError::into_inner)
        .push(RequestRecord {
            method: method.to_string(),
            path,
            watch: flag(&q, "watch"),
            field_manager: q.get("fieldManager").cloned(),
            user_agent,
            status: resp.status().as_u16(),
        });
    resp
}

/// The request as a real server handles it: a slow write takes its time
/// and lands even if the client has gone (it runs in its own task), unless
/// the `timeout` parameter ends it first, with a 504 and nothing applied.
async fn handle_in_time(
    app: &Arc<App>,
    req: Request,
    path: &str,
    q: &HashMap<String, String>,
    user_agent: &str,
) -> Result<Response, ApiError> {
    let timeout = match q.get("timeout") {
        Some(t) => Some(go_duration(t).ok_or_else(|| {
            ApiError::bad_request(format!(
                "invalid timeout specified in the request URL: {t:?}"
            ))
        })?),
        None => None,
    }
    // Zero means the server's default, as on a real server.
    .filter(|t| !t.is_zero());
    let write = !matches!(*req.method(), Method::GET | Method::HEAD);
    let takes = if write {
        app.faults.write_time(user_agent)
    } else {
        Duration::ZERO
    };
    if timeout.is_some_and(|t| takes >= t) {
        tokio::time::sleep(timeout.unwrap_or_default()).await;
        return Err(ApiError::timeout());
    }
    let (app, path, q) = (app.clone(), path.to_string(), q.clone());
    tokio::spawn(async move {
        tokio::time::sleep(takes).await;
        route(&app, req, &path, &q).await
    })
    .await
    .unwrap_or_else(|e| Err(ApiError::internal(&e.to_string())))
}

/// A Go duration as `timeout` carries it: `5s`, `1m30s`, `250ms`, `1.5s`.
fn go_duration(s: &str) -> Option<Duration> {
    let mut total = 0f64;
    let mut rest = s;
    if rest.is_empty() {
        return None;
    }
    while !rest.is_empty() {
        let n = rest
            .find(|c: char| !(c.is_ascii_digit() || c == '.'))
            .unwrap_or(rest.len());
        let value: f64 = rest[..n].parse().ok()?;
        rest = &rest[n..];
        let u = rest
            .find(|c: char| c.is_ascii_digit() || c == '.')
            .unwrap_or(rest.len());
        let unit = match &rest[..u] {
            "ns" => 1e-9,
            "us" | "µs" => 1e-6,
            "ms" => 1e-3,
            "s" => 1.0,
            "m" => 60.0,
            "h" => 3600.0,
            _ => return None,
        };
        rest = &rest[u..];
        total += value * unit;
    }
    Duration::try_from_secs_f64(total).ok()
}

fn control(app: &App, cmd: &str, q: &HashMap<String, String>) -> Response {
    match cmd {
        "unavailable" => {
            let mode = match q.get("mode").map(String::as_str) {
                Some("refuse") => Mode::Refuse,
                _ => Mode::Unavailable,
            };
            app.faults.set_mode(mode);
            if let Some(secs) = q
                .get("for")
                .and_then(|s| s.trim_end_matches('s').parse::<f64>().ok())
            {
                let faults = app.faults.clone();
                tokio::spawn(async move {
                    tokio::time::sleep(Duration::from_secs_f64(secs)).await;
                    faults.set_mode(Mode::Available);
                });
            }
        }
        "available" => app.faults.set_mode(Mode::Available),
        "cut-watches" => app.faults.cut_watches(),
        "delay" => {
            let ms = q.get("ms").and_then(|s| s.parse().ok()).unwrap_or(0);
            app.faults.set_delay(Duration::from_millis(ms));
        }
        "compact" => app
            .store
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .compact(),
        "fail-writes" => {
            let n = q.get("n").and_then(|s| s.parse().ok()).unwrap_or(1);
            app.faults
                .fail_writes(q.get("path").map(String::as_str).unwrap_or_default(), n);
        }
        _ => return ApiError::no_route(&format!("/testserver/{cmd}")).into_response(),
    }
    json_response(StatusCode::OK, &json!({"ok": cmd}))
}

/// What a path names.
struct Target {
    def: ResourceDef,
    namespace: Option<String>,
    name: Option<String>,
    status: bool,
}

async fn route(
    app: &Arc<App>,
    req: Request,
    path: &str,
    q: &HashMap<String, String>,
) -> Result<Response, ApiError> {
    let segs: Vec<&str> = path
        .trim_matches('/')
        .split('/')
        .filter(|s| !s.is_empty())
        .collect();
    let get = req.method() == Method::GET;
    let (group, version, rest) = match segs.as_slice() {
        ["version"] if get => return Ok(json_response(StatusCode::OK, &version())),
        ["api"] if get => {
            return Ok(json_response(
                StatusCode::OK,
                &json!({
                    "kind": "APIVersions",
                    "versions": ["v1"],
                    "serverAddressByClientCIDRs": [{"clientCIDR": "0.0.0.0/0", "serverAddress": app.addr.to_string()}],
                }),
            ));
        }
        ["apis"] if get => return Ok(json_response(StatusCode::OK, &group_list(app))),
        ["apis", g] if get => {
            return group_list(app)["groups"]
                .as_array()
                .and_then(|gs| gs.iter().find(|x| x["name"] == *g).cloned())
                .map(|mut g| {
                    g["kind"] = json!("APIGroup");
                    g["apiVersion"] = json!("v1");
                    json_response(StatusCode::OK, &g)
                })
                .ok_or_else(|| ApiError::no_route(path));
        }
        ["openapi", "v3"] if get => return Ok(json_response(StatusCode::OK, &openapi_index(app))),
        ["openapi", "v3", gv @ ..] if get => return openapi_doc(app, &gv.join("/"), path),
        ["api", "v1"] if get => return resource_list(app, "", "v1", path),
        ["apis", g, v] if get => return resource_list(app, g, v, path),
        ["api", "v1", rest @ ..] => ("", "v1", rest),
        ["apis", g, v, rest @ ..] => (*g, *v, rest),
        _ => return Err(ApiError::no_route(path)),
    };
    let (plural, namespace, name, status) = match rest {
        [plural] => (*plural, None, None, false),
        [plural, name] => (*plural, None, Some(*name), false),
        [plural, name, "status"] => (*plural, None, Some(*name), true),
        ["namespaces", ns, plural] => (*plural, Some(*ns), None, false),
        ["namespaces", ns, plural, name] => (*plural, Some(*ns), Some(*name), false),
        ["namespaces", ns, plural, name, "status"] => (*plural, Some(*ns), Some(*name), true),
        _ => return Err(ApiError::no_route(path)),
    };
    let def = app
        .store
        .lock()
        .unwrap_or_else(PoisonError::into_inner)
        .def(group, version, plural)
        .cloned()
        .ok_or_else(|| ApiError::no_route(path))?;
    if (namespace.is_some() && !def.namespaced)
        || (status && !def.status)
        || (!def.namespaced && namespace.is_some())
    {
        return Err(ApiError::no_route(path));
    }
    if def.namespaced && namespace.is_none() && name.is_some() {
        return Err(ApiError::no_route(path));
    }
    let target = Target {
        def,
        namespace: namespace.map(str::to_string),
        name: name.map(str::to_string),
        status,
    };
    let opts = WriteOpts {
        dry_run: q.contains_key("dryRun"),
        field_manager: q.get("fieldManager").cloned(),
        force: flag(q, "force"),
        strict: q.get("fieldValidation").is_some_and(|v| v == "Strict"),
        status: target.status,
        agent: req
            .headers()
            .get(header::USER_AGENT)
            .and_then(|v| v.to_str().ok())
            .is_some_and(|ua| ua.starts_with("hostlb-lbnodeagent/")),
    };
    let method = req.method().clone();
    let headers = req.headers().clone();
    let body = axum::body::to_bytes(req.into_body(), 64 << 20)
        .await
        .map_err(|e| ApiError::bad_request(format!("reading the body: {e}")))?;
    let ns = target.namespace.clone().unwrap_or_default();
    let content_type = headers
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .unwrap_or_default();
    if content_type.contains("cbor") {
        return Err(ApiError::unsupported_media_type(content_type));
    }
    let body = if content_type.starts_with("application/vnd.kubernetes.protobuf") {
        let obj = protobuf::decode(&body)
            .map_err(|e| ApiError::bad_request(format!("error decoding the body: {e}")))?;
        Bytes::from(serde_json::to_vec(&obj).expect("a JSON value serialises"))
    } else {
        body
    };
    match (method, &target.name) {
        (Method::GET, None) if flag(q, "watch") => watch(app, &target, q),
        (Method::GET, None) => list(app, &target, q, &headers),
        (Method::GET, Some(name)) => {
            let obj = app
                .store
                .lock()
                .unwrap_or_else(PoisonError::into_inner)
                .get(&target.def, &ns, name)?;
            if wants_table(&headers) {
                let rv = app
                    .store
                    .lock()
                    .unwrap_or_else(PoisonError::into_inner)
                    .resource_version();
                return Ok(json_response(
                    StatusCode::OK,
                    &table::table(&target.def, &[obj], rv),
                ));
            }
            Ok(json_response(StatusCode::OK, &obj))
        }
        (Method::POST, None) if target.def.namespaced && target.namespace.is_none() => {
            Err(ApiError::method_not_allowed())
        }
        (Method::POST, None) => {
            let obj = parse_body(&body)?;
            let created = app
                .store
                .lock()
                .unwrap_or_else(PoisonError::into_inner)
                .create(&target.def, &ns, obj, &opts)?;
            Ok(json_response(StatusCode::CREATED, &created))
        }
        (Method::PUT, Some(name)) => {
            let obj = parse_body(&body)?;
            let updated = app
                .store
                .lock()
                .unwrap_or_else(PoisonError::into_inner)
                .update(&target.def, &ns, name, obj, &opts)?;
            Ok(json_response(StatusCode::OK, &updated))
        }
        (Method::PATCH, Some(name)) => {
            let content_type = headers
                .get(header::CONTENT_TYPE)
                .and_then(|v| v.to_str().ok())
                .unwrap_or_default();
            let kind = match content_type.split(';').next().unwrap_or_default().trim() {
                "application/merge-patch+json" => PatchType::Merge,
                "application/json-patch+json" => PatchType::Json,
                "application/strategic-merge-patch+json" => PatchType::Strategic,
                "application/apply-patch+yaml" => PatchType::Apply,
                other => return Err(ApiError::unsupported_media_type(other)),
            };
            let mut store = app.store.lock().unwrap_or_else(PoisonError::into_inner);
            let existed = store.get(&target.def, &ns, name).is_ok();
            let patched = store.patch(&target.def, &ns, name, kind, &body, &opts)?;
            let code = if existed {
                StatusCode::OK
            } else {
                StatusCode::CREATED
            };
            Ok(json_response(code, &patched))
        }
        (Method::DELETE, Some(name)) => {
            let options = if body.is_empty() {
                Value::Null
            } else {
                parse_body(&body)?
            };
            let deleted = app
                .store
                .lock()
                .unwrap_or_else(PoisonError::into_inner)
                .delete(&target.def, &ns, name, &options, &opts)?;
            Ok(json_response(StatusCode::OK, &deleted))
        }
        (Method::DELETE, None) => {
            let (labels, fields) = selectors(q)?;
            let items = app
                .store
                .lock()
                .unwrap_or_else(PoisonError::into_inner)
                .delete_collection(
                    &target.def,
                    target.namespace.as_deref(),
                    &labels,
                    &fields,
                    &opts,
                )?;
            let rv = app
                .store
                .lock()
                .unwrap_or_else(PoisonError::into_inner)
                .resource_version();
            Ok(json_response(
                StatusCode::OK,
                &list_body(&target.def, items, rv, None),
            ))
        }
        _ => Err(ApiError::method_not_allowed()),
    }
}

fn parse_body(body: &Bytes) -> Result<Value, ApiError> {
    serde_json::from_slice(body)
        .map_err(|e| ApiError::bad_request(format!("error decoding the body: {e}")))
}

fn selectors(q: &HashMap<String, String>) -> Result<(LabelSelector, FieldSelector), ApiError> {
    Ok((
        LabelSelector::parse(
            q.get("labelSelector")
                .map(String::as_str)
                .unwrap_or_default(),
        )?,
        FieldSelector::parse(
            q.get("fieldSelector")
                .map(String::as_str)
                .unwrap_or_default(),
        )?,
    ))
}

fn list_body(def: &ResourceDef, items: Vec<Value>, rv: u64, cont: Option<String>) -> Value {
    let mut meta = json!({"resourceVersion": rv.to_string()});
    if let Some(c) = cont {
        meta["continue"] = Value::String(c);
    }
    json!({
        "kind": format!("{}List", def.kind),
        "apiVersion": def.api_version(),
        "metadata": meta,
        "items": items,
    })
}

/// Where an object sorts in a list: by namespace, then name, as the store
/// keeps them.
fn object_key(o: &Value) -> (String, String) {
    let get = |p: &str| {
        o.pointer(p)
            .and_then(Value::as_str)
            .unwrap_or_default()
            .to_string()
    };
    (get("/metadata/namespace"), get("/metadata/name"))
}

/// A continue token: the resourceVersion of the first page (every page
/// reports it, so a watch from it sees whatever changed while paging) and
/// the last object sent. Names and namespaces cannot hold a NUL.
fn continue_token(rv: u64, last: &(String, String)) -> String {
    format!("{rv}\0{}\0{}", last.0, last.1)
        .bytes()
        .map(|b| format!("{b:02x}"))
        .collect()
}

fn parse_continue(s: &str) -> Option<(u64, (String, String))> {
    let bytes = (0..s.len())
        .step_by(2)
        .map(|i| s.get(i..i + 2).and_then(|h| u8::from_str_radix(h, 16).ok()))
        .collect::<Option<Vec<u8>>>()?;
    let text = String::from_utf8(bytes).ok()?;
    let mut parts = text.split('\0');
    let rv = parts.next()?.parse().ok()?;
    let ns = parts.next()?.to_string();
    let name = parts.next()?.to_string();
    parts.next().is_none().then_some((rv, (ns, name)))
}

fn list(
    app: &App,
    t: &Target,
    q: &HashMap<String, String>,
    headers: &HeaderMap,
) -> Result<Response, ApiError> {
    let (labels, fields) = selectors(q)?;
    let (mut items, mut rv, floor) = {
        let store = app.store.lock().unwrap_or_else(PoisonError::into_inner);
        let (items, rv) = store.list(&t.def, t.namespace.as_deref(), &labels, &fields);
        (items, rv, store.floor())
    };
    if let Some(token) = q.get("continue").filter(|c| !c.is_empty()) {
        let (first_rv, after) = parse_continue(token)
            .ok_or_else(|| ApiError::bad_request("continue key is not valid"))?;
        if first_rv < floor {
            return Err(ApiError::gone(first_rv, floor + 1));
        }
        rv = first_rv;
        items.retain(|o| object_key(o) > after);
    }
    let mut cont = None;
    if let Some(limit) = q
        .get("limit")
        .and_then(|l| l.parse::<usize>().ok())
        .filter(|l| *l > 0)
        && items.len() > limit
    {
        items.truncate(limit);
        cont = items.last().map(|o| continue_token(rv, &object_key(o)));
    }
    if wants_table(headers) {
        return Ok(json_response(
            StatusCode::OK,
            &table::table(&t.def, &items, rv),
        ));
    }
    Ok(json_response(
        StatusCode::OK,
        &list_body(&t.def, items, rv, cont),
    ))
}

fn version() -> Value {
    json!({
        "major": "1",
        "minor": "33",
        "emulationMajor": "1",
        "emulationMinor": "33",
        "gitVersion": "v1.33.0",
        "gitCommit": "hostlb-testserver",
        "gitTreeState": "clean",
        "buildDate": "2026-01-01T00:00:00Z",
        "goVersion": "go1.24.0",
        "compiler": "gc",
        "platform": "linux/amd64",
    })
}

fn group_list(app: &App) -> Value {
    let store = app.store.lock().unwrap_or_else(PoisonError::into_inner);
    let mut groups: Vec<(String, Vec<String>)> = Vec::new();
    for d in store.defs().iter().filter(|d| !d.group.is_empty()) {
        match groups.iter_mut().find(|(g, _)| *g == d.group) {
            Some((_, vs)) => {
                if !vs.contains(&d.version) {
                    vs.push(d.version.clone());
                }
            }
            None => groups.push((d.group.clone(), vec![d.version.clone()])),
        }
    }
    json!({
        "kind": "APIGroupList",
        "apiVersion": "v1",
        "groups": groups.iter().map(|(g, vs)| {
            let versions: Vec<Value> = vs.iter().map(|v| json!({"groupVersion": format!("{g}/{v}"), "version": v})).collect();
            json!({"name": g, "versions": versions, "preferredVersion": versions[0]})
        }).collect::<Vec<_>>(),
    })
}

fn resource_list(app: &App, group: &str, version: &str, path: &str) -> Result<Response, ApiError> {
    let store = app.store.lock().unwrap_or_else(PoisonError::into_inner);
    let defs: Vec<&ResourceDef> = store
        .defs()
        .iter()
        .filter(|d| d.group == group && d.version == version)
        .collect();
    if defs.is_empty() {
        return Err(ApiError::no_route(path));
    }
    let mut resources = Vec::new();
    for d in defs {
        resources.push(json!({
            "name": d.plural,
            "singularName": d.singular,
            "namespaced": d.namespaced,
            "kind": d.kind,
            "verbs": ["create", "delete", "deletecollection", "get", "list", "patch", "update", "watch"],
            "shortNames": d.short_names,
            "categories": d.categories,
        }));
        if d.status {
            resources.push(json!({
                "name": format!("{}/status", d.plural),
                "singularName": "",
                "namespaced": d.namespaced,
                "kind": d.kind,
                "verbs": ["get", "patch", "update"],
            }));
        }
    }
    let gv = if group.is_empty() {
        version.to_string()
    } else {
        format!("{group}/{version}")
    };
    Ok(json_response(
        StatusCode::OK,
        &json!({
            "kind": "APIResourceList",
            "apiVersion": "v1",
            "groupVersion": gv,
            "resources": resources,
        }),
    ))
}

fn gv_key(d: &ResourceDef) -> String {
    if d.group.is_empty() {
        format!("api/{}", d.version)
    } else {
        format!("apis/{}/{}", d.group, d.version)
    }
}

/// The `/openapi/v3` index: one entry per group-version. Each document
/// holds a PATCH operation taking `fieldValidation` per resource (all that
/// `kubectl`'s default validation looks for before leaving validation to
/// the server) and the kinds' schemas, which `kubectl explain` reads.
fn openapi_index(app: &App) -> Value {
    let store = app.store.lock().unwrap_or_else(PoisonError::into_inner);
    let rv = store.resource_version();
    let mut paths = serde_json::Map::new();
    for d in store.defs() {
        let key = gv_key(d);
        paths.insert(
            key.clone(),
            json!({"serverRelativeURL": format!("/openapi/v3/{key}?hash={rv}")}),
        );
    }
    json!({"paths": paths})
}

fn openapi_doc(app: &App, key: &str, path: &str) -> Result<Response, ApiError> {
    let store = app.store.lock().unwrap_or_else(PoisonError::into_inner);
    let mut paths = serde_json::Map::new();
    for d in store.defs().iter().filter(|d| gv_key(d) == key) {
        let p = if d.namespaced {
            format!("/{key}/namespaces/{{namespace}}/{}/{{name}}", d.plural)
        } else {
            format!("/{key}/{}/{{name}}", d.plural)
        };
        paths.insert(p, json!({"patch": {
            "x-kubernetes-group-version-kind": {"group": d.group, "version": d.version, "kind": d.kind},
            "parameters": [{"name": "fieldValidation", "in": "query", "schema": {"type": "string"}}],
            "responses": {"200": {"description": "OK"}},
        }}));
    }
    if paths.is_empty() {
        return Err(ApiError::no_route(path));
    }
    let defs: Vec<&ResourceDef> = store.defs().iter().filter(|d| gv_key(d) == key).collect();
    Ok(json_response(
        StatusCode::OK,
        &json!({
            "openapi": "3.0.0",
            "info": {"title": "Kubernetes", "version": "v1.33.0"},
            "paths": paths,
            "components": {"schemas": super::openapi::components(&defs)},
        }),
    ))
}

/// The watch event an object change is for a watcher with these filters,
/// if any: an object that starts or stops matching the selectors is seen as
/// added or deleted, as the real watch cache does.
fn visible(
    ev: &Event,
    ns: Option<&str>,
    labels: &LabelSelector,
    fields: &FieldSelector,
) -> Option<&'static str> {
    if ns.is_some_and(|n| n != ev.namespace) {
        return None;
    }
    let matches = |o: &Value| labels.matches(o) && fields.matches(o);
    let now = matches(&ev.object);
    let before = ev.old.as_ref().map(matches);
    match (ev.kind, before, now) {
        (EventKind::Added, _, true) => Some("ADDED"),
        (EventKind::Deleted, _, true) => Some("DELETED"),
        (EventKind::Modified, Some(true), true) => Some("MODIFIED"),
        (EventKind::Modified, Some(false), true) => Some("ADDED"),
        (EventKind::Modified, Some(true), false) => Some("DELETED"),
        (EventKind::Modified, None, true) => Some(ev.kind.as_str()),
        _ => None,
    }
}

fn line(kind: &str, object: &Value) -> Bytes {
    let mut b = serde_json::to_vec(&json!({"type": kind, "object": object})).expect("serializes");
    b.push(b'\n');
    Bytes::from(b)
}

fn watch(app: &Arc<App>, t: &Target, q: &HashMap<String, String>) -> Result<Response, ApiError> {
    let (labels, fields) = selectors(q)?;
    let def = t.def.clone();
    let ns = t.namespace.clone();
    let rv_param = q.get("resourceVersion").cloned().unwrap_or_default();
    let send_initial = flag(q, "sendInitialEvents");
    let bookmarks = flag(q, "allowWatchBookmarks");
    let timeout = q
        .get("timeoutSeconds")
        .and_then(|s| s.parse::<u64>().ok())
        .map(Duration::from_secs);
    let (tx, rx) = mpsc::channel::<Result<Bytes, Infallible>>(256);
    let (api_version, kind) = (def.api_version(), def.kind.clone());
    let present = move |o: &Value| {
        let mut o = o.clone();
        o["apiVersion"] = json!(api_version);
        o["kind"] = json!(kind);
        o
    };
    // Under one lock: the starting point, the backlog and the subscription.
    let (initial, mut sub, start_rv) = {
        let store = app.store.lock().unwrap_or_else(PoisonError::into_inner);
        let sub = store.subscribe();
        let start_rv = store.resource_version();
        let initial: Result<Vec<Bytes>, ApiError> =
            if rv_param.is_empty() || rv_param == "0" || send_initial {
                let (items, _) = store.list(&def, ns.as_deref(), &labels, &fields);
                let mut lines: Vec<Bytes> = items.iter().map(|o| line("ADDED", o)).collect();
                if send_initial {
                    lines.push(line(
                        "BOOKMARK",
                        &json!({
                            "kind": def.kind, "apiVersion": def.api_version(),
                            "metadata": {"resourceVersion": start_rv.to_string(),
                                         "annotations": {"k8s.io/initial-events-end": "true"}}
                        }),
                    ));
                }
                Ok(lines)
            } else {
                match rv_param.parse::<u64>() {
                    Err(_) => Err(ApiError::bad_request(format!(
                        "invalid resource version: {rv_param}"
                    ))),
                    Ok(rv) => store.since(&def.gr(), rv).map(|evs| {
                        evs.iter()
                            .filter_map(|e| {
                                visible(e, ns.as_deref(), &labels, &fields)
                                    .map(|k| line(k, &present(&e.object)))
                            })
                            .collect()
                    }),
                }
            };
        (initial, sub, start_rv)
    };
    // A watch from a compacted resourceVersion is answered, as the real
    // server does, with one ERROR event carrying the 410 and then closed.
    let (initial, gone) = match initial {
        Ok(lines) => (lines, false),
        Err(e) if e.code == 410 => (vec![line("ERROR", &e.status())], true),
        Err(e) => return Err(e),
    };
    let mut cut = app.faults.cut.subscribe();
    let faults = app.faults.clone();
    let interval = app.bookmark_interval;
    tokio::spawn(async move {
        for l in initial {
            if tx.send(Ok(l)).await.is_err() {
                return;
            }
        }
        if gone {
            return;
        }
        let deadline = timeout.map(|d| tokio::time::Instant::now() + d);
        let mut last_rv = start_rv;
        let mut tick = tokio::time::interval(interval);
        tick.tick().await;
        loop {
            tokio::select! {
                ev = sub.recv() => match ev {
                    Ok(ev) => {
                        last_rv = ev.rv;
                        if ev.gr != def.gr() {
                            continue;
                        }
                        if let Some(kind) = visible(&ev, ns.as_deref(), &labels, &fields) {
                            let lag = faults.watch_lag(&def.plural);
                            if !lag.is_zero() {
                                tokio::time::sleep(lag).await;
                            }
                            if tx.send(Ok(line(kind, &present(&ev.object)))).await.is_err() {
                                return;
                            }
                        }
                    }
                    Err(broadcast::error::RecvError::Lagged(_)) => {
                        let _ = tx.send(Ok(line("ERROR", &ApiError::gone(last_rv, last_rv + 1).status()))).await;
                        return;
                    }
                    Err(broadcast::error::RecvError::Closed) => return,
                },
                _ = tick.tick(), if bookmarks => {
                    let b = json!({"kind": def.kind, "apiVersion": def.api_version(),
                                   "metadata": {"resourceVersion": last_rv.to_string()}});
                    if tx.send(Ok(line("BOOKMARK", &b))).await.is_err() {
                        return;
                    }
                }
                _ = async { match deadline { Some(d) => tokio::time::sleep_until(d).await, None => std::future::pending().await } } => return,
                _ = cut.changed() => return,
                _ = tx.closed() => return,
            }
        }
    });
    Ok(Response::builder()
        .status(StatusCode::OK)
        .header(header::CONTENT_TYPE, "application/json")
        .body(Body::from_stream(ReceiverStream::new(rx)))
        .expect("valid response"))
}

#[cfg(test)]
mod tests {
    use super::decode;

    #[test]
    fn query_decoding_takes_any_bytes() {
        assert_eq!(decode("a%3Db+c"), "a=b c");
        assert_eq!(decode("%E2%82%AC"), "\u{20ac}");
        // Not escapes: kept as written, never a panic on a multi-byte char.
        assert_eq!(decode("%zz%+1"), "%zz% 1");
        assert_eq!(decode("%\u{e9}\u{e9}"), "%\u{e9}\u{e9}");
        assert_eq!(decode("100%"), "100%");
    }
}
