//! The CRDs under `deploy/crds/` must be exactly what the Rust types generate,
//! or a cluster would validate objects against a schema the code no longer has.

use std::path::PathBuf;

#[test]
fn committed_crds_match_the_types() {
    let dir = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../deploy/crds");
    for (file, crd) in hostlb_api::crds::all() {
        let path = dir.join(file);
        let committed = std::fs::read_to_string(&path).unwrap_or_else(|e| {
            panic!(
                "{}: {e}; run `cargo run -p hostlb-allocator -- crds --output-dir deploy/crds`",
                path.display()
            )
        });
        let generated = hostlb_api::crds::to_yaml(&crd);
        assert!(
            committed == generated,
            "{} is stale; run `cargo run -p hostlb-allocator -- crds --output-dir deploy/crds`",
            path.display()
        );
    }
}

#[test]
fn schema_carries_the_validation_kubernetes_enforces() {
    let (_, crd) = hostlb_api::crds::all().into_iter().nth(1).unwrap();
    let v = serde_json::to_value(&crd).unwrap();
    let spec =
        &v["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["spec"]["properties"];
    let weight = &spec["preferredNodeSelectors"]["items"]["properties"]["weight"];
    assert_eq!(weight["minimum"].as_f64(), Some(1.0));
    assert_eq!(weight["maximum"].as_f64(), Some(100.0));
    let op = &spec["nodeSelectors"]["items"]["properties"]["matchExpressions"]["items"]["properties"]
        ["operator"];
    assert_eq!(
        op["enum"],
        serde_json::json!(["In", "NotIn", "Exists", "DoesNotExist"])
    );
    assert_eq!(
        v["spec"]["versions"][0]["subresources"]["status"],
        serde_json::json!({})
    );
}
