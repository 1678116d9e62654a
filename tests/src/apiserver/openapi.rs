//! The kinds' schemas in `/openapi/v3/<group-version>`, which `kubectl
//! explain` reads (it looks a kind up by `x-kubernetes-group-version-kind`
//! and follows `$ref`s within the document): custom resources from their
//! CRD's `openAPIV3Schema`, built-in kinds from k8s-openapi's schemas, named
//! as the real server names them (`io.k8s.api.core.v1.Service`).

use k8s_openapi::api;
use schemars::{JsonSchema, SchemaGenerator, generate::SchemaSettings};
use serde_json::{Map, Value, json};

use super::registry::ResourceDef;

/// `components.schemas` for the resources of one group-version.
pub fn components(defs: &[&ResourceDef]) -> Value {
    let mut generator = SchemaSettings::openapi3().into_generator();
    let mut out = Map::new();
    for d in defs {
        let Some((name, mut schema)) = custom(d).or_else(|| builtin(&mut generator, d)) else {
            continue;
        };
        schema["x-kubernetes-group-version-kind"] =
            json!([{"group": d.group, "version": d.version, "kind": d.kind}]);
        out.insert(name, schema);
    }
    for (name, schema) in generator.take_definitions(true) {
        out.entry(name).or_insert(schema);
    }
    Value::Object(out)
}

/// `hostlb.io` → `io.hostlb`, as the real server names custom kinds.
fn custom(d: &ResourceDef) -> Option<(String, Value)> {
    let schema = d.schema.clone()?;
    let group: Vec<&str> = d.group.split('.').rev().collect();
    Some((
        format!("{}.{}.{}", group.join("."), d.version, d.kind),
        schema,
    ))
}

fn builtin(g: &mut SchemaGenerator, d: &ResourceDef) -> Option<(String, Value)> {
    fn of<T: JsonSchema>(g: &mut SchemaGenerator) -> Option<(String, Value)> {
        // Registers the kind (and what it refers to) as a definition.
        g.subschema_for::<T>();
        let name = T::schema_name().to_string();
        let schema = g.definitions_mut().remove(&name)?;
        Some((name, schema))
    }
    match (d.group.as_str(), d.kind.as_str()) {
        ("", "Namespace") => of::<api::core::v1::Namespace>(g),
        ("", "Node") => of::<api::core::v1::Node>(g),
        ("", "Service") => of::<api::core::v1::Service>(g),
        ("", "Endpoints") => of::<api::core::v1::Endpoints>(g),
        ("", "Event") => of::<api::core::v1::Event>(g),
        ("", "ConfigMap") => of::<api::core::v1::ConfigMap>(g),
        ("", "Secret") => of::<api::core::v1::Secret>(g),
        ("", "Pod") => of::<api::core::v1::Pod>(g),
        ("", "ServiceAccount") => of::<api::core::v1::ServiceAccount>(g),
        ("events.k8s.io", "Event") => of::<api::events::v1::Event>(g),
        ("discovery.k8s.io", "EndpointSlice") => of::<api::discovery::v1::EndpointSlice>(g),
        ("coordination.k8s.io", "Lease") => of::<api::coordination::v1::Lease>(g),
        ("apps", "Deployment") => of::<api::apps::v1::Deployment>(g),
        ("policy", "PodDisruptionBudget") => of::<api::policy::v1::PodDisruptionBudget>(g),
        ("rbac.authorization.k8s.io", "ClusterRole") => of::<api::rbac::v1::ClusterRole>(g),
        ("rbac.authorization.k8s.io", "ClusterRoleBinding") => {
            of::<api::rbac::v1::ClusterRoleBinding>(g)
        }
        ("rbac.authorization.k8s.io", "Role") => of::<api::rbac::v1::Role>(g),
        ("rbac.authorization.k8s.io", "RoleBinding") => of::<api::rbac::v1::RoleBinding>(g),
        ("apiextensions.k8s.io", "CustomResourceDefinition") => of::<
            k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition,
        >(g),
        _ => None,
    }
}
