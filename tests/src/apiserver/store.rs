//! The object store and the verbs on it, synchronous and under one lock.
//!
//! Every write takes the next resourceVersion from a single counter, is
//! appended to a bounded event log and broadcast to open watches. A watch
//! from a resourceVersion older than the log gets `410 Gone`, as a real
//! server does after compaction.

use std::collections::{BTreeMap, HashMap, VecDeque};
use std::hash::{BuildHasher, RandomState};
use std::sync::Arc;

use serde_json::{Map, Value, json};
use tokio::sync::broadcast;

use super::error::{ApiError, Cause};
use super::fields::{self, Owners};
use super::patch;
use super::registry::{self, GroupResource, ResourceDef};
use super::schema;
use super::selectors::{FieldSelector, LabelSelector};
use super::services::ServiceNetwork;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum EventKind {
    Added,
    Modified,
    Deleted,
}

impl EventKind {
    pub fn as_str(self) -> &'static str {
        match self {
            EventKind::Added => "ADDED",
            EventKind::Modified => "MODIFIED",
            EventKind::Deleted => "DELETED",
        }
    }
}

#[derive(Debug)]
pub struct Event {
    pub rv: u64,
    pub gr: GroupResource,
    pub namespace: String,
    pub kind: EventKind,
    pub object: Value,
    /// The object before a modification, to tell selector transitions.
    pub old: Option<Value>,
}

/// How the body of a PATCH is to be read.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum PatchType {
    Merge,
    Json,
    Strategic,
    Apply,
}

/// Options of a write request.
#[derive(Clone, Debug, Default)]
pub struct WriteOpts {
    pub dry_run: bool,
    pub field_manager: Option<String>,
    pub force: bool,
    /// `fieldValidation=Strict`: unknown fields are an error, not pruned.
    pub strict: bool,
    /// The request is to the `/status` subresource.
    pub status: bool,
    /// The writer is a node agent (its User-Agent says `hostlb-lbnodeagent/`):
    /// its writes to Services are confined as `deploy/agent/policy.yaml`
    /// confines them on a real server (see [`agent_policy`]).
    pub agent: bool,
}

/// What `deploy/agent/policy.yaml` (a ValidatingAdmissionPolicy) refuses
/// a node agent on a real server, as this server's stand-in for it: any
/// change of a Service but its `hostlb.io/announcing-*` annotations, and
/// an announcing value longer than an agent writes. The message is the
/// policy's own. `None` when the write may go.
fn agent_policy(old: &Value, new: &Value) -> Option<String> {
    let meta = |v: &Value, k: &str| v.get("metadata").and_then(|m| m.get(k)).cloned();
    for (what, field) in [
        ("spec", None),
        ("labels", Some("labels")),
        ("owners", Some("ownerReferences")),
        ("finalizers", Some("finalizers")),
    ] {
        let (a, b) = match field {
            None => (old.get("spec").cloned(), new.get("spec").cloned()),
            Some(f) => (meta(old, f), meta(new, f)),
        };
        if a != b {
            return Some(format!(
                "a node agent may change only the hostlb.io/announcing-* annotations of a Service, not its {what}"
            ));
        }
    }
    let annotations = |v: &Value| -> serde_json::Map<String, Value> {
        meta(v, "annotations")
            .and_then(|a| a.as_object().cloned())
            .unwrap_or_default()
    };
    let (a, b) = (annotations(old), annotations(new));
    let ours = |k: &str| k.starts_with("hostlb.io/announcing-");
    let others_changed = a.iter().any(|(k, v)| !ours(k) && b.get(k) != Some(v))
        || b.iter().any(|(k, v)| !ours(k) && a.get(k) != Some(v));
    if others_changed {
        return Some(
            "a node agent may change only the hostlb.io/announcing-* annotations of a Service"
                .into(),
        );
    }
    let too_long = b.iter().any(|(k, v)| {
        let cap = if k.starts_with("hostlb.io/announcing-virtual-") {
            8200
        } else {
            269
        };
        ours(k) && v.as_str().is_some_and(|v| v.chars().count() > cap)
    });
    too_long.then(|| "a hostlb.io/announcing-* annotation names one node and its interface (at most 269 characters; a virtual one at most 32 nodes, 8200)".into())
}

/// An EndpointSlice's ports as the real server stores them: `name` ""
/// and `protocol` TCP when unset. `kubectl describe svc` reads the name
/// without a nil check and panics on a slice that lacks it.
fn default_endpoint_slice(def: &ResourceDef, obj: &mut Value) {
    if def.group != "discovery.k8s.io" || def.plural != "endpointslices" {
        return;
    }
    let Some(ports) = obj.get_mut("ports").and_then(Value::as_array_mut) else {
        return;
    };
    for port in ports.iter_mut().filter_map(Value::as_object_mut) {
        port.entry("name")
            .or_insert_with(|| Value::String(String::new()));
        port.entry("protocol")
            .or_insert_with(|| Value::String("TCP".into()));
    }
}

fn services_gr() -> GroupResource {
    GroupResource {
        group: String::new(),
        plural: "services".into(),
    }
}

fn namespaces_gr() -> GroupResource {
    GroupResource {
        group: String::new(),
        plural: "namespaces".into(),
    }
}

fn crd_gr() -> GroupResource {
    GroupResource {
        group: "apiextensions.k8s.io".into(),
        plural: "customresourcedefinitions".into(),
    }
}

fn now() -> String {
    jiff::Timestamp::now()
        .strftime("%Y-%m-%dT%H:%M:%SZ")
        .to_string()
}

fn meta_str<'a>(obj: &'a Value, key: &str) -> Option<&'a str> {
    obj.get("metadata")?.get(key)?.as_str()
}

fn meta_mut(obj: &mut Value) -> &mut Map<String, Value> {
    if !obj.get("metadata").is_some_and(Value::is_object) {
        obj["metadata"] = json!({});
    }
    obj["metadata"]
        .as_object_mut()
        .expect("just made an object")
}

/// Everything but metadata and status: what a generation counts changes of.
fn spec_part(obj: &Value) -> Value {
    let mut o = obj.clone();
    if let Some(m) = o.as_object_mut() {
        m.remove("metadata");
        m.remove("status");
    }
    o
}

pub struct Store {
    rv: u64,
    defs: Vec<ResourceDef>,
    objects: HashMap<GroupResource, BTreeMap<(String, String), Value>>,
    log: VecDeque<Arc<Event>>,
    /// Events with a resourceVersion above this are all in `log`.
    floor: u64,
    max_log: usize,
    tx: broadcast::Sender<Arc<Event>>,
    random: RandomState,
    counter: u64,
    /// Field ownership per object, for server-side apply conflicts.
    owners: HashMap<(GroupResource, String, String), Owners>,
    service_network: ServiceNetwork,
}

type ObjectKey = (GroupResource, String, String);

fn key_of(gr: &GroupResource, obj: &Value) -> ObjectKey {
    (
        gr.clone(),
        meta_str(obj, "namespace").unwrap_or_default().to_string(),
        meta_str(obj, "name").unwrap_or_default().to_string(),
    )
}

impl WriteOpts {
    fn manager(&self) -> &str {
        self.field_manager
            .as_deref()
            .filter(|m| !m.is_empty())
            .unwrap_or("unknown")
    }
}

impl Default for Store {
    fn default() -> Self {
        Store::new()
    }
}

impl Store {
    pub fn new() -> Self {
        let (tx, _) = broadcast::channel(4096);
        let mut s = Store {
            rv: 0,
            defs: registry::builtins(),
            objects: HashMap::new(),
            log: VecDeque::new(),
            floor: 0,
            max_log: 10_000,
            tx,
            random: RandomState::new(),
            counter: 0,
            owners: HashMap::new(),
            service_network: ServiceNetwork::default(),
        };
        let ns = s.def("", "v1", "namespaces").expect("builtin").clone();
        for name in ["default", "kube-system", "kube-public", "kube-node-lease"] {
            s.create(
                &ns,
                "",
                json!({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": name}}),
                &WriteOpts::default(),
            )
            .expect("fresh store");
        }
        s
    }

    pub fn resource_version(&self) -> u64 {
        self.rv
    }

    pub fn defs(&self) -> &[ResourceDef] {
        &self.defs
    }

    pub fn def(&self, group: &str, version: &str, plural: &str) -> Option<&ResourceDef> {
        self.defs
            .iter()
            .find(|d| d.group == group && d.version == version && d.plural == plural)
    }

    pub fn subscribe(&self) -> broadcast::Receiver<Arc<Event>> {
        self.tx.subscribe()
    }

    /// Forget the event history, so watches from any older resourceVersion
    /// get `410 Gone`.
    pub fn compact(&mut self) {
        self.log.clear();
        self.floor = self.rv;
    }

    fn random_u64(&mut self) -> u64 {
        self.counter += 1;
        self.random.hash_one(self.counter)
    }

    fn uid(&mut self) -> String {
        let a = self.random_u64();
        let b = self.random_u64();
        format!(
            "{:08x}-{:04x}-4{:03x}-{:04x}-{:012x}",
            a >> 32,
            (a >> 16) & 0xffff,
            a & 0xfff,
            (b >> 48) & 0x3fff | 0x8000,
            b & 0xffff_ffff_ffff
        )
    }

    fn suffix(&mut self) -> String {
        const ALPHABET: &[u8] = b"bcdfghjklmnpqrstvwxz2456789";
        let mut n = self.random_u64();
        (0..5)
            .map(|_| {
                let c = ALPHABET[(n % ALPHABET.len() as u64) as usize] as char;
                n /= ALPHABET.len() as u64;
                c
            })
            .collect()
    }

    /// Store (or remove) an object under a new resourceVersion and tell the
    /// watches.
    fn commit(
        &mut self,
        gr: &GroupResource,
        kind: EventKind,
        mut obj: Value,
        old: Option<Value>,
    ) -> Value {
        self.rv += 1;
        meta_mut(&mut obj).insert("resourceVersion".into(), Value::String(self.rv.to_string()));
        let ns = meta_str(&obj, "namespace").unwrap_or_default().to_string();
        let name = meta_str(&obj, "name").unwrap_or_default().to_string();
        let table = self.objects.entry(gr.clone()).or_default();
        if kind == EventKind::Deleted {
            self.owners.remove(&(gr.clone(), ns.clone(), name.clone()));
            table.remove(&(ns.clone(), name));
        } else {
            table.insert((ns.clone(), name), obj.clone());
        }
        let ev = Arc::new(Event {
            rv: self.rv,
            gr: gr.clone(),
            namespace: ns,
            kind,
            object: obj.clone(),
            old,
        });
        self.log.push_back(ev.clone());
        while self.log.len() > self.max_log {
            if let Some(e) = self.log.pop_front() {
                self.floor = e.rv;
            }
        }
        let _ = self.tx.send(ev);
        obj
    }

    fn stored(&self, def: &ResourceDef, ns: &str, name: &str) -> Option<&Value> {
        self.objects.get(&def.gr())?.get(&(
            if def.namespaced { ns } else { "" }.to_string(),
            name.to_string(),
        ))
    }

    /// An object as served at `def`'s version.
    fn present(def: &ResourceDef, obj: &Value) -> Value {
        let mut o = obj.clone();
        o["apiVersion"] = Value::String(def.api_version());
        o["kind"] = Value::String(def.kind.clone());
        o
    }

    pub fn get(&self, def: &ResourceDef, ns: &str, name: &str) -> Result<Value, ApiError> {
        self.stored(def, ns, name)
            .map(|o| Self::present(def, o))
            .ok_or_else(|| ApiError::not_found(&def.gr(), name))
    }

    /// Objects of `def` in `ns` (all namespaces when `None`), sorted by
    /// namespace and name, with the resourceVersion of the list.
    pub fn list(
        &self,
        def: &ResourceDef,
        ns: Option<&str>,
        labels: &LabelSelector,
        fields: &FieldSelector,
    ) -> (Vec<Value>, u64) {
        let mut items: Vec<((String, String), Value)> = self
            .objects
            .get(&def.gr())
            .into_iter()
            .flat_map(|t| t.iter())
            .filter(|((ons, _), o)| {
                ns.is_none_or(|n| n == ons) && labels.matches(o) && fields.matches(o)
            })
            .map(|(k, o)| (k.clone(), Self::present(def, o)))
            .collect();
        // A real server keeps Events once and serves them in both groups:
        // events.k8s.io/v1 Events show in the core list (`kubectl get
        // events`, `kubectl describe`), converted.
        if def.group.is_empty() && def.plural == "events" {
            let v1 = GroupResource {
                group: "events.k8s.io".into(),
                plural: "events".into(),
            };
            items.extend(
                self.objects
                    .get(&v1)
                    .into_iter()
                    .flat_map(|t| t.iter())
                    .filter(|((ons, _), _)| ns.is_none_or(|n| n == ons))
                    .map(|(k, o)| (k.clone(), Self::present(def, &core_event(o))))
                    .filter(|(_, o)| labels.matches(o) && fields.matches(o)),
            );
            items.sort_by(|a, b| a.0.cmp(&b.0));
        }
        (items.into_iter().map(|(_, o)| o).collect(), self.rv)
    }

    /// The IP families Services are served in, primary first (both by
    /// default): a single-stack cluster rejects RequireDualStack and gives
    /// PreferDualStack one family.
    pub fn set_service_families(&mut self, families: &[&str]) {
        self.service_network.families = families.iter().map(|f| f.to_string()).collect();
    }

    /// Fill in a Service as the real server does.
    fn default_service(
        &mut self,
        def: &ResourceDef,
        obj: &mut Value,
        old: Option<&Value>,
    ) -> Result<(), ApiError> {
        if def.gr() != services_gr() {
            return Ok(());
        }
        let name = meta_str(obj, "name").unwrap_or_default().to_string();
        self.service_network.fill_in(obj, old).map_err(|causes| {
            ApiError::invalid(&def.qualified_kind(), &def.group, &def.kind, &name, causes)
        })
    }

    /// The oldest resourceVersion whose later events are still kept.
    pub fn floor(&self) -> u64 {
        self.floor
    }

    /// The events after `rv` for a new watch, or `410 Gone` when some of them
    /// are no longer kept. Taken under the same lock as `subscribe` so no
    /// event falls between the two.
    pub fn since(&self, gr: &GroupResource, rv: u64) -> Result<Vec<Arc<Event>>, ApiError> {
        if rv < self.floor {
            return Err(ApiError::gone(rv, self.floor + 1));
        }
        Ok(self
            .log
            .iter()
            .filter(|e| e.rv > rv && &e.gr == gr)
            .cloned()
            .collect())
    }

    fn namespace_exists(&self, ns: &str) -> bool {
        self.objects
            .get(&namespaces_gr())
            .is_some_and(|t| t.contains_key(&(String::new(), ns.to_string())))
    }

    fn admit(&self, def: &ResourceDef, obj: &mut Value, strict: bool) -> Result<(), ApiError> {
        let name = meta_str(obj, "name").unwrap_or_default().to_string();
        let mut causes: Vec<Cause> = Vec::new();
        if let Some(schema) = &def.schema {
            let a = schema::admit(obj, schema);
            if strict && let Some(field) = a.pruned.first() {
                return Err(ApiError::bad_request(format!(
                    "strict decoding error: unknown field {field:?}"
                )));
            }
            causes.extend(a.causes);
        }
        if causes.is_empty() {
            Ok(())
        } else {
            Err(ApiError::invalid(
                &def.qualified_kind(),
                &def.group,
                &def.kind,
                &name,
                causes,
            ))
        }
    }

    fn check_kind(def: &ResourceDef, obj: &Value) -> Result<(), ApiError> {
        let kind = obj.get("kind").and_then(Value::as_str);
        if kind.is_some_and(|k| k != def.kind) {
            return Err(ApiError::bad_request(format!(
                "the body of the request was for kind {:?}, not {:?}",
                kind.unwrap_or_default(),
                def.kind
            )));
        }
        let api_version = obj.get("apiVersion").and_then(Value::as_str);
        if api_version.is_some_and(|v| v != def.api_version()) {
            return Err(ApiError::bad_request(format!(
                "the API version in the data ({}) does not match the expected API version ({})",
                api_version.unwrap_or_default(),
                def.api_version()
            )));
        }
        Ok(())
    }

    pub fn create(
        &mut self,
        def: &ResourceDef,
        ns: &str,
        mut obj: Value,
        opts: &WriteOpts,
    ) -> Result<Value, ApiError> {
        if !obj.is_object() {
            return Err(ApiError::bad_request(
                "the body of the request is not an object",
            ));
        }
        Self::check_kind(def, &obj)?;
        obj["apiVersion"] = Value::String(def.api_version());
        obj["kind"] = Value::String(def.kind.clone());
        let ns = if def.namespaced {
            ns.to_string()
        } else {
            String::new()
        };
        let body_ns = meta_str(&obj, "namespace").unwrap_or_default().to_string();
        if def.namespaced && !body_ns.is_empty() && body_ns != ns {
            return Err(ApiError::bad_request(
                "the namespace of the provided object does not match the namespace sent on the request",
            ));
        }
        if def.namespaced && !self.namespace_exists(&ns) {
            return Err(ApiError::not_found(&namespaces_gr(), &ns));
        }
        let mut name = meta_str(&obj, "name").unwrap_or_default().to_string();
        if name.is_empty() {
            match meta_str(&obj, "generateName") {
                Some(prefix) if !prefix.is_empty() => {
                    name = format!("{prefix}{}", self.suffix());
                }
                _ => {
                    return Err(ApiError::invalid(
                        &def.qualified_kind(),
                        &def.group,
                        &def.kind,
                        "",
                        vec![Cause {
                            reason: "FieldValueRequired",
                            field: "metadata.name".into(),
                            message: "Required value: name or generateName is required".into(),
                        }],
                    ));
                }
            }
        }
        if self.stored(def, &ns, &name).is_some() {
            return Err(ApiError::already_exists(&def.gr(), &name));
        }
        if def.status
            && !def.keep_status_on_create
            && let Some(m) = obj.as_object_mut()
        {
            m.remove("status");
        }
        let uid = self.uid();
        let m = meta_mut(&mut obj);
        m.insert("name".into(), Value::String(name.clone()));
        if def.namespaced {
            m.insert("namespace".into(), Value::String(ns.clone()));
        } else {
            m.remove("namespace");
        }
        m.insert("uid".into(), Value::String(uid));
        m.insert("creationTimestamp".into(), Value::String(now()));
        m.insert("generation".into(), json!(1));
        m.remove("deletionTimestamp");
        m.remove("resourceVersion");
        self.admit(def, &mut obj, opts.strict)?;
        self.default_service(def, &mut obj, None)?;
        default_endpoint_slice(def, &mut obj);
        if def.gr() == namespaces_gr() {
            obj["status"] = json!({"phase": "Active"});
        }
        let crd_defs = crd_definitions(def, &mut obj)?;
        if opts.dry_run {
            return Ok(Self::present(def, &obj));
        }
        if let Some(defs) = crd_defs {
            self.register(defs);
        }
        let stored = self.commit(&def.gr(), EventKind::Added, obj, None);
        fields::record_write(
            self.owners.entry(key_of(&def.gr(), &stored)).or_default(),
            None,
            &stored,
            opts.manager(),
        );
        Ok(Self::present(def, &stored))
    }

    fn register(&mut self, defs: Vec<ResourceDef>) {
        let crd = defs[0].crd.clone();
        self.defs.retain(|d| d.crd.is_none() || d.crd != crd);
        self.defs.extend(defs);
    }

    /// Replace an object (PUT), keeping what the endpoint may not change.
    pub fn update(
        &mut self,
        def: &ResourceDef,
        ns: &str,
        name: &str,
        obj: Value,
        opts: &WriteOpts,
    ) -> Result<Value, ApiError> {
        let old = self
            .stored(def, ns, name)
            .cloned()
            .ok_or_else(|| ApiError::not_found(&def.gr(), name))?;
        if !obj.is_object() {
            return Err(ApiError::bad_request(
                "the body of the request is not an object",
            ));
        }
        Self::check_kind(def, &obj)?;
        if let Some(body_name) = meta_str(&obj, "name")
            && body_name != name
        {
            return Err(ApiError::bad_request(format!(
                "the name of the object ({body_name}) does not match the name on the URL ({name})"
            )));
        }
        if let Some(rv) = meta_str(&obj, "resourceVersion")
            && !rv.is_empty()
            && Some(rv) != meta_str(&old, "resourceVersion")
        {
            return Err(ApiError::conflict(&def.gr(), name));
        }
        self.write(def, old, obj, opts)
    }

    /// The common end of PUT and PATCH: carry over what the endpoint ignores,
    /// validate, and store unless nothing changed.
    fn write(
        &mut self,
        def: &ResourceDef,
        old: Value,
        mut new: Value,
        opts: &WriteOpts,
    ) -> Result<Value, ApiError> {
        if opts.agent
            && !opts.status
            && def.group.is_empty()
            && def.plural == "services"
            && let Some(why) = agent_policy(&old, &new)
        {
            return Err(ApiError::unprocessable(format!(
                "services {:?} is forbidden: ValidatingAdmissionPolicy 'hostlb-agent-services' with binding 'hostlb-agent-services' denied request: {why}",
                meta_str(&old, "name").unwrap_or_default()
            )));
        }
        let status = opts.status;
        let name = meta_str(&old, "name").unwrap_or_default().to_string();
        new["apiVersion"] = Value::String(def.api_version());
        new["kind"] = Value::String(def.kind.clone());
        if def.status {
            let keep = if status { &old } else { &new };
            let status_part = if status {
                new.get("status").cloned()
            } else {
                old.get("status").cloned()
            };
            let mut merged = keep.clone();
            match status_part {
                Some(s) => merged["status"] = s,
                None => {
                    if let Some(m) = merged.as_object_mut() {
                        m.remove("status");
                    }
                }
            }
            new = merged;
        }
        {
            let old_meta = old.get("metadata").cloned().unwrap_or(json!({}));
            let m = meta_mut(&mut new);
            for k in [
                "name",
                "namespace",
                "uid",
                "creationTimestamp",
                "deletionTimestamp",
                "generation",
            ] {
                match old_meta.get(k) {
                    Some(v) => {
                        m.insert(k.into(), v.clone());
                    }
                    None => {
                        m.remove(k);
                    }
                }
            }
            m.insert(
                "resourceVersion".into(),
                old_meta["resourceVersion"].clone(),
            );
        }
        self.admit(def, &mut new, opts.strict)?;
        self.default_service(def, &mut new, Some(&old))?;
        default_endpoint_slice(def, &mut new);
        if def.gr() == namespaces_gr() {
            new["status"] = json!({"phase": "Active"});
        }
        if spec_part(&new) != spec_part(&old) {
            let generation = old
                .pointer("/metadata/generation")
                .and_then(Value::as_i64)
                .unwrap_or(1);
            meta_mut(&mut new).insert("generation".into(), json!(generation + 1));
        }
        let crd_defs = crd_definitions(def, &mut new)?;
        if new == old {
            return Ok(Self::present(def, &old));
        }
        if opts.dry_run {
            return Ok(Self::present(def, &new));
        }
        if let Some(defs) = crd_defs {
            self.register(defs);
        }
        let finalizers_left = new
            .pointer("/metadata/finalizers")
            .and_then(Value::as_array)
            .is_some_and(|f| !f.is_empty());
        if new.pointer("/metadata/deletionTimestamp").is_some() && !finalizers_left {
            return Ok(Self::present(def, &self.remove(def, new, &name)));
        }
        let stored = self.commit(&def.gr(), EventKind::Modified, new, Some(old.clone()));
        fields::record_write(
            self.owners.entry(key_of(&def.gr(), &stored)).or_default(),
            Some(&old),
            &stored,
            opts.manager(),
        );
        Ok(Self::present(def, &stored))
    }

    pub fn patch(
        &mut self,
        def: &ResourceDef,
        ns: &str,
        name: &str,
        kind: PatchType,
        body: &[u8],
        opts: &WriteOpts,
    ) -> Result<Value, ApiError> {
        let status = opts.status;
        let old = self.stored(def, ns, name).cloned();
        if kind == PatchType::Apply {
            if opts.field_manager.as_deref().is_none_or(str::is_empty) {
                return Err(ApiError::bad_request(
                    "PATCH, application/apply-patch+yaml requests require fieldManager",
                ));
            }
            let applied = patch::parse_apply(body)?;
            Self::check_kind(def, &applied)?;
            if let Some(n) = meta_str(&applied, "name")
                && n != name
            {
                return Err(ApiError::bad_request(format!(
                    "the name of the object ({n}) does not match the name on the URL ({name})"
                )));
            }
            return match old {
                None if status => Err(ApiError::not_found(&def.gr(), name)),
                None => {
                    let mut obj = applied.clone();
                    meta_mut(&mut obj).insert("name".into(), Value::String(name.into()));
                    let out = self.create(def, ns, obj, opts)?;
                    if !opts.dry_run {
                        let o = self.owners.entry(key_of(&def.gr(), &out)).or_default();
                        fields::record_apply(o, &applied, opts.manager(), false, opts.force);
                    }
                    Ok(out)
                }
                Some(old) => {
                    let manager = opts.manager().to_string();
                    let key = key_of(&def.gr(), &old);
                    let owners = self.owners.get(&key).cloned().unwrap_or_default();
                    let clashes = fields::conflicts(&owners, &old, &applied, &manager);
                    if !clashes.is_empty() && !opts.force {
                        return Err(apply_conflict(def, name, &clashes));
                    }
                    let mut new = old.clone();
                    patch::apply_merge(&mut new, &applied);
                    // What this manager's last apply named and this one
                    // leaves out goes, unless another manager owns it too.
                    let removed = fields::given_up(&owners, &applied, &manager, status)
                        .into_iter()
                        .filter_map(|(path, alone)| alone.then_some(path))
                        .collect();
                    fields::remove_leaves(&mut new, &removed);
                    let out = self.write(def, old, new, opts)?;
                    if !opts.dry_run {
                        let o = self.owners.entry(key).or_default();
                        fields::record_apply(o, &applied, &manager, status, opts.force);
                    }
                    Ok(out)
                }
            };
        }
        let old = old.ok_or_else(|| ApiError::not_found(&def.gr(), name))?;
        let mut new = old.clone();
        patch::apply(kind, &mut new, body)?;
        if !new.is_object() || !new.get("metadata").is_some_and(Value::is_object) {
            return Err(ApiError::unprocessable(format!(
                "the patched {} {name:?} is not an object with metadata",
                def.singular
            )));
        }
        if let Some(rv) = meta_str(&new, "resourceVersion")
            && Some(rv) != meta_str(&old, "resourceVersion")
        {
            return Err(ApiError::conflict(&def.gr(), name));
        }
        self.write(def, old, new, opts)
    }

    /// Delete, or mark for deletion while finalizers remain.
    pub fn delete(
        &mut self,
        def: &ResourceDef,
        ns: &str,
        name: &str,
        options: &Value,
        opts: &WriteOpts,
    ) -> Result<Value, ApiError> {
        let old = self
            .stored(def, ns, name)
            .cloned()
            .ok_or_else(|| ApiError::not_found(&def.gr(), name))?;
        for (field, label) in [("uid", "UID"), ("resourceVersion", "ResourceVersion")] {
            let want = options
                .pointer(&format!("/preconditions/{field}"))
                .and_then(Value::as_str);
            if let Some(want) = want
                && Some(want) != meta_str(&old, field)
            {
                return Err(ApiError::precondition(
                    &def.gr(),
                    name,
                    &format!(
                        "Precondition failed: {label} in precondition: {want}, {label} in object meta: {}",
                        meta_str(&old, field).unwrap_or_default()
                    ),
                ));
            }
        }
        if opts.dry_run {
            return Ok(Self::present(def, &old));
        }
        let has_finalizers = old
            .pointer("/metadata/finalizers")
            .and_then(Value::as_array)
            .is_some_and(|f| !f.is_empty());
        if has_finalizers {
            if old.pointer("/metadata/deletionTimestamp").is_some() {
                return Ok(Self::present(def, &old));
            }
            let mut new = old.clone();
            meta_mut(&mut new).insert("deletionTimestamp".into(), Value::String(now()));
            let stored = self.commit(&def.gr(), EventKind::Modified, new, Some(old));
            return Ok(Self::present(def, &stored));
        }
        Ok(Self::present(def, &self.remove(def, old, name)))
    }

    /// Remove an object for good, with what hangs off it: a namespace's
    /// objects, a CRD's resources and objects.
    fn remove(&mut self, def: &ResourceDef, obj: Value, name: &str) -> Value {
        if def.gr() == namespaces_gr() {
            let mut doomed = Vec::new();
            for (gr, table) in &self.objects {
                for ((ons, oname), o) in table {
                    if ons == name {
                        doomed.push((gr.clone(), oname.clone(), o.clone()));
                    }
                }
            }
            for (gr, _, o) in doomed {
                self.commit(&gr, EventKind::Deleted, o, None);
            }
        }
        if def.gr() == crd_gr() {
            let gone: Vec<ResourceDef> = self
                .defs
                .iter()
                .filter(|d| d.crd.as_deref() == Some(name))
                .cloned()
                .collect();
            self.defs.retain(|d| d.crd.as_deref() != Some(name));
            if let Some(d) = gone.first() {
                let objs: Vec<Value> = self
                    .objects
                    .get(&d.gr())
                    .map(|t| t.values().cloned().collect())
                    .unwrap_or_default();
                for o in objs {
                    self.commit(&d.gr(), EventKind::Deleted, o, None);
                }
            }
        }
        self.commit(&def.gr(), EventKind::Deleted, obj, None)
    }

    pub fn delete_collection(
        &mut self,
        def: &ResourceDef,
        ns: Option<&str>,
        labels: &LabelSelector,
        fields: &FieldSelector,
        opts: &WriteOpts,
    ) -> Result<Vec<Value>, ApiError> {
        let (items, _) = self.list(def, ns, labels, fields);
        let mut out = Vec::new();
        for o in items {
            let ons = meta_str(&o, "namespace").unwrap_or_default().to_string();
            let name = meta_str(&o, "name").unwrap_or_default().to_string();
            out.push(self.delete(def, &ons, &name, &Value::Null, opts)?);
        }
        Ok(out)
    }
}

/// The 409 of an apply that would take fields from other managers.
fn apply_conflict(def: &ResourceDef, name: &str, clashes: &[(String, String)]) -> ApiError {
    let n = clashes.len();
    let list: Vec<String> = clashes
        .iter()
        .map(|(path, mgr)| format!("conflict with {mgr:?} using {}: {path}", def.api_version()))
        .collect();
    let mut e = ApiError::conflict(&def.gr(), name);
    e.message = format!(
        "Apply failed with {n} conflict{}: {}",
        if n == 1 { "" } else { "s" },
        list.join("\n")
    );
    e
}

/// For a CRD being written: the resources it defines (checked before it is
/// stored), with its status set to established. `None` for other kinds.
fn crd_definitions(
    def: &ResourceDef,
    obj: &mut Value,
) -> Result<Option<Vec<ResourceDef>>, ApiError> {
    if def.gr() != crd_gr() {
        return Ok(None);
    }
    let defs = registry::from_crd(obj)?;
    obj["status"] = crd_status(obj);
    Ok(Some(defs))
}

fn crd_status(crd: &Value) -> Value {
    let now = now();
    let cond = |t: &str, reason: &str, msg: &str| json!({"type": t, "status": "True", "reason": reason, "message": msg, "lastTransitionTime": now});
    json!({
        "acceptedNames": crd.pointer("/spec/names").cloned().unwrap_or(json!({})),
        "storedVersions": crd.pointer("/spec/versions").and_then(Value::as_array).map(|vs| {
            vs.iter().filter(|v| v.get("storage").and_then(Value::as_bool) == Some(true))
                .filter_map(|v| v.get("name").cloned()).collect::<Vec<_>>()
        }).unwrap_or_default(),
        "conditions": [
            cond("NamesAccepted", "NoConflicts", "no conflicts found"),
            cond("Established", "InitialNamesAccepted", "the initial names have been accepted"),
        ],
    })
}

/// An events.k8s.io/v1 Event as core/v1 shows it (the real server's
/// conversion: `regarding` is `involvedObject`, `note` the `message`, the
/// `deprecated*` fields the old ones).
fn core_event(o: &Value) -> Value {
    let mut out = serde_json::Map::new();
    let renames = [
        ("metadata", "metadata"),
        ("regarding", "involvedObject"),
        ("related", "related"),
        ("note", "message"),
        ("reason", "reason"),
        ("type", "type"),
        ("action", "action"),
        ("eventTime", "eventTime"),
        ("series", "series"),
        ("reportingController", "reportingComponent"),
        ("reportingInstance", "reportingInstance"),
        ("deprecatedSource", "source"),
        ("deprecatedFirstTimestamp", "firstTimestamp"),
        ("deprecatedLastTimestamp", "lastTimestamp"),
        ("deprecatedCount", "count"),
    ];
    for (from, to) in renames {
        if let Some(v) = o.get(from) {
            out.insert(to.to_string(), v.clone());
        }
    }
    Value::Object(out)
}
