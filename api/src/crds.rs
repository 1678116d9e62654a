//! The CRD manifests generated from the Rust types, as committed under
//! `deploy/crds/`. One function renders them so that the `crds` command and
//! the staleness test can never disagree.

use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::CustomResourceExt;

use crate::v1::{IPAddressPool, L2Advertisement, NodeAgent};

/// Every CRD hostlb installs, with the file name it has under `deploy/crds/`.
pub fn all() -> Vec<(&'static str, CustomResourceDefinition)> {
    vec![
        ("hostlb.io_ipaddresspools.yaml", IPAddressPool::crd()),
        ("hostlb.io_l2advertisements.yaml", L2Advertisement::crd()),
        ("hostlb.io_nodeagents.yaml", NodeAgent::crd()),
    ]
}

/// A CRD as YAML, headed by a comment saying where it comes from.
pub fn to_yaml(crd: &CustomResourceDefinition) -> String {
    let body = serde_saphyr::to_string(crd).expect("a CRD always serializes");
    format!("# Generated from the hostlb-api Rust types by `allocator crds`; do not edit.\n{body}")
}
