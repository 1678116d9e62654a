//! The test API server driven by the unchanged `kube` 5 client, as the
//! allocator and the agent will drive it. Each behaviour the server claims
//! has a test here that fails if the behaviour breaks.

use std::collections::BTreeMap;
use std::time::Duration;

use futures::{StreamExt, TryStreamExt};
use hostlb_api::v1::{
    IPAddressPool, IPAddressPoolSpec, L2Advertisement, L2AdvertisementSpec, PreferredNodeSelector,
};
use hostlb_tests::apiserver::TestServer;
use k8s_openapi::api::core::v1::{ConfigMap, Namespace, Node, Service, ServiceSpec};
use k8s_openapi::api::events::v1::Event as K8sEvent;
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::api::{
    Api, DeleteParams, ListParams, ObjectMeta, Patch, PatchParams, PostParams, WatchEvent,
    WatchParams,
};
use kube::runtime::{WatchStreamExt, reflector, watcher};
use kube::{Client, Resource, ResourceExt};
use serde_json::json;

fn cm(name: &str, labels: &[(&str, &str)]) -> ConfigMap {
    ConfigMap {
        metadata: ObjectMeta {
            name: Some(name.into()),
            labels: Some(
                labels
                    .iter()
                    .map(|(k, v)| (k.to_string(), v.to_string()))
                    .collect(),
            ),
            ..Default::default()
        },
        data: Some(BTreeMap::from([("k".to_string(), "v".to_string())])),
        ..Default::default()
    }
}

/// The first address in a Service's `status.loadBalancer.ingress`.
fn first_ingress_ip(s: &Service) -> Option<&str> {
    s.status
        .as_ref()?
        .load_balancer
        .as_ref()?
        .ingress
        .as_ref()?
        .first()?
        .ip
        .as_deref()
}

fn api_err(e: kube::Error) -> kube::core::Status {
    match e {
        kube::Error::Api(s) => *s,
        other => panic!("expected an API error, got {other:?}"),
    }
}

/// A client that does not retry 503s, to see them directly.
fn no_retry_client(server: &TestServer) -> Client {
    let mut config = server.config();
    config.default_retry = false;
    Client::try_from(config).unwrap()
}

async fn eventually<F, Fut>(what: &str, mut check: F)
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = bool>,
{
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    while tokio::time::Instant::now() < deadline {
        if check().await {
            return;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    panic!("timed out waiting for {what}");
}

#[tokio::test]
async fn typed_crud_and_errors() {
    let server = TestServer::start().await;
    let cms: Api<ConfigMap> = Api::namespaced(server.client(), "default");

    let created = cms
        .create(&PostParams::default(), &cm("a", &[("app", "web")]))
        .await
        .unwrap();
    let meta = &created.metadata;
    assert!(meta.uid.as_deref().is_some_and(|u| u.len() == 36));
    assert!(meta.creation_timestamp.is_some());
    assert!(meta.resource_version.is_some());
    assert_eq!(meta.namespace.as_deref(), Some("default"));

    // generateName
    let mut g = cm("", &[]);
    g.metadata.name = None;
    g.metadata.generate_name = Some("gen-".into());
    let gen_ = cms.create(&PostParams::default(), &g).await.unwrap();
    assert!(gen_.name_any().starts_with("gen-") && gen_.name_any().len() == 9);

    // AlreadyExists
    let e = api_err(
        cms.create(&PostParams::default(), &cm("a", &[]))
            .await
            .unwrap_err(),
    );
    assert_eq!((e.code, e.reason.as_str()), (409, "AlreadyExists"));
    assert_eq!(e.message, r#"configmaps "a" already exists"#);

    // get / get_opt / NotFound
    assert_eq!(cms.get("a").await.unwrap().data.unwrap()["k"], "v");
    assert!(cms.get_opt("nope").await.unwrap().is_none());
    let e = api_err(cms.get("nope").await.unwrap_err());
    assert_eq!((e.code, e.reason.as_str()), (404, "NotFound"));

    // replace, then a stale resourceVersion conflicts
    let mut a = cms.get("a").await.unwrap();
    let stale = a.clone();
    a.data = Some(BTreeMap::from([("k".to_string(), "v2".to_string())]));
    let replaced = cms.replace("a", &PostParams::default(), &a).await.unwrap();
    assert_ne!(
        replaced.metadata.resource_version,
        stale.metadata.resource_version
    );
    let e = api_err(
        cms.replace("a", &PostParams::default(), &stale)
            .await
            .unwrap_err(),
    );
    assert_eq!((e.code, e.reason.as_str()), (409, "Conflict"));

    // a namespace that does not exist
    let other: Api<ConfigMap> = Api::namespaced(server.client(), "missing");
    let e = api_err(
        other
            .create(&PostParams::default(), &cm("x", &[]))
            .await
            .unwrap_err(),
    );
    assert_eq!(
        (e.code, e.message.as_str()),
        (404, r#"namespaces "missing" not found"#)
    );

    // list, all namespaces, delete
    assert_eq!(
        cms.list(&ListParams::default()).await.unwrap().items.len(),
        2
    );
    let all: Api<ConfigMap> = Api::all(server.client());
    assert_eq!(
        all.list(&ListParams::default()).await.unwrap().items.len(),
        2
    );
    cms.delete("a", &DeleteParams::default()).await.unwrap();
    assert!(cms.get_opt("a").await.unwrap().is_none());
    let e = api_err(cms.delete("a", &DeleteParams::default()).await.unwrap_err());
    assert_eq!(e.code, 404);
}

#[tokio::test]
async fn pagination_and_selectors() {
    let server = TestServer::start().await;
    let cms: Api<ConfigMap> = Api::namespaced(server.client(), "default");
    for i in 0..7 {
        let tier = if i % 2 == 0 { "front" } else { "back" };
        cms.create(
            &PostParams::default(),
            &cm(&format!("c{i}"), &[("tier", tier), ("n", &i.to_string())]),
        )
        .await
        .unwrap();
    }
    let page = cms.list(&ListParams::default().limit(3)).await.unwrap();
    assert_eq!(page.items.len(), 3);
    let token = page.metadata.continue_.clone().unwrap();
    let rest = cms
        .list(&ListParams::default().limit(10).continue_token(&token))
        .await
        .unwrap();
    assert_eq!(rest.items.len(), 4);
    assert!(
        rest.metadata
            .continue_
            .as_deref()
            .unwrap_or_default()
            .is_empty()
    );

    // Pages across namespaces follow the store's order (namespace, then
    // name), whatever the names' characters, and all report the first
    // page's resourceVersion.
    let nss: Api<Namespace> = Api::all(server.client());
    for ns in ["a", "a-b"] {
        nss.create(
            &PostParams::default(),
            &serde_json::from_value(json!({"metadata": {"name": ns}})).unwrap(),
        )
        .await
        .unwrap();
        let in_ns: Api<ConfigMap> = Api::namespaced(server.client(), ns);
        for n in ["x", "y"] {
            in_ns
                .create(&PostParams::default(), &cm(n, &[("paged", "yes")]))
                .await
                .unwrap();
        }
    }
    let all: Api<ConfigMap> = Api::all(server.client());
    let mut seen = Vec::new();
    let mut token: Option<String> = None;
    let mut versions = std::collections::BTreeSet::new();
    loop {
        let mut lp = ListParams::default().labels("paged=yes").limit(1);
        if let Some(t) = &token {
            lp = lp.continue_token(t);
        }
        let page = all.list(&lp).await.unwrap();
        versions.insert(page.metadata.resource_version.clone().unwrap());
        seen.extend(
            page.items
                .iter()
                .map(|c| format!("{}/{}", c.namespace().unwrap(), c.name_any())),
        );
        // Something changes between pages.
        Api::<ConfigMap>::namespaced(server.client(), "a")
            .create(
                &PostParams::default(),
                &cm(&format!("noise{}", seen.len()), &[]),
            )
            .await
            .unwrap();
        match page.metadata.continue_.filter(|c| !c.is_empty()) {
            Some(t) => token = Some(t),
            None => break,
        }
    }
    assert_eq!(seen, ["a/x", "a/y", "a-b/x", "a-b/y"]);
    assert_eq!(versions.len(), 1, "{versions:?}");

    let names = |l: kube::core::ObjectList<ConfigMap>| {
        l.items.iter().map(|c| c.name_any()).collect::<Vec<_>>()
    };
    assert_eq!(
        names(
            cms.list(&ListParams::default().labels("tier=back"))
                .await
                .unwrap()
        ),
        ["c1", "c3", "c5"]
    );
    assert_eq!(
        names(
            cms.list(&ListParams::default().labels("tier in (back),n notin (1,3)"))
                .await
                .unwrap()
        ),
        ["c5"]
    );
    assert_eq!(
        names(
            cms.list(&ListParams::default().labels("!tier"))
                .await
                .unwrap()
        ),
        Vec::<String>::new()
    );
    assert_eq!(
        names(
            cms.list(&ListParams::default().fields("metadata.name=c4"))
                .await
                .unwrap()
        ),
        ["c4"]
    );
    assert_eq!(
        names(
            cms.list(
                &ListParams::default()
                    .fields("metadata.name!=c4,metadata.namespace=default")
                    .labels("tier=front")
            )
            .await
            .unwrap()
        ),
        ["c0", "c2", "c6"]
    );
    let e = api_err(
        cms.list(&ListParams::default().fields("data.k=v"))
            .await
            .unwrap_err(),
    );
    assert_eq!(
        (e.code, e.message.as_str()),
        (400, "field label not supported: data.k")
    );
}

#[tokio::test]
async fn watch_events_selector_transitions_bookmarks_and_timeout() {
    let server = TestServer::start().await;
    let cms: Api<ConfigMap> = Api::namespaced(server.client(), "default");
    let rv = cms
        .list(&ListParams::default())
        .await
        .unwrap()
        .metadata
        .resource_version
        .unwrap();
    let mut events = cms
        .watch(
            &WatchParams::default().labels("watched=yes").timeout(3),
            &rv,
        )
        .await
        .unwrap()
        .boxed();
    cms.create(&PostParams::default(), &cm("x", &[]))
        .await
        .unwrap();
    cms.patch(
        "x",
        &PatchParams::default(),
        &Patch::Merge(json!({"metadata": {"labels": {"watched": "yes"}}})),
    )
    .await
    .unwrap();
    cms.patch(
        "x",
        &PatchParams::default(),
        &Patch::Merge(json!({"data": {"k": "changed"}})),
    )
    .await
    .unwrap();
    cms.patch(
        "x",
        &PatchParams::default(),
        &Patch::Merge(json!({"metadata": {"labels": {"watched": null}}})),
    )
    .await
    .unwrap();
    let mut seen = Vec::new();
    let mut bookmark = false;
    let started = tokio::time::Instant::now();
    while let Some(ev) = events.try_next().await.unwrap() {
        match ev {
            WatchEvent::Added(o) => seen.push(format!("added {}", o.name_any())),
            WatchEvent::Modified(o) => seen.push(format!("modified {}", o.data.unwrap()["k"])),
            WatchEvent::Deleted(o) => seen.push(format!("deleted {}", o.name_any())),
            WatchEvent::Bookmark(b) => {
                assert!(!b.metadata.resource_version.is_empty());
                bookmark = true;
            }
            WatchEvent::Error(e) => panic!("{e:?}"),
        }
    }
    // Entering the selector is ADDED, leaving it is DELETED.
    assert_eq!(seen, ["added x", "modified changed", "deleted x"]);
    assert!(bookmark, "bookmarks every second when allowed");
    let took = started.elapsed();
    assert!(
        took >= Duration::from_secs(2) && took < Duration::from_secs(6),
        "timeoutSeconds=3 ended after {took:?}"
    );
}

#[tokio::test]
async fn watch_from_a_compacted_version_gets_a_410_event() {
    let server = TestServer::start().await;
    let cms: Api<ConfigMap> = Api::namespaced(server.client(), "default");
    cms.create(&PostParams::default(), &cm("a", &[]))
        .await
        .unwrap();
    let old = cms.get("a").await.unwrap().resource_version().unwrap();
    cms.create(&PostParams::default(), &cm("b", &[]))
        .await
        .unwrap();
    server.compact();
    let mut events = cms
        .watch(&WatchParams::default(), &old)
        .await
        .unwrap()
        .boxed();
    match events.try_next().await.unwrap() {
        Some(WatchEvent::Error(e)) => assert_eq!((e.code, e.reason.as_str()), (410, "Expired")),
        other => panic!("expected a 410 ERROR event, got {other:?}"),
    }
    assert!(
        events.try_next().await.unwrap().is_none(),
        "the stream ends after the 410"
    );
}

#[tokio::test]
async fn reflector_survives_cut_watches_and_410() {
    let server = TestServer::start().await;
    let cms: Api<ConfigMap> = Api::namespaced(server.client(), "default");
    let (reader, writer) = reflector::store::<ConfigMap>();
    let stream = reflector(writer, watcher(cms.clone(), watcher::Config::default()))
        .default_backoff()
        .applied_objects();
    let task = tokio::spawn(async move {
        futures::pin_mut!(stream);
        while stream.next().await.is_some() {}
    });
    reader.wait_until_ready().await.unwrap();
    cms.create(&PostParams::default(), &cm("one", &[]))
        .await
        .unwrap();
    eventually("one", || async {
        reader
            .get(&reflector::ObjectRef::new("one").within("default"))
            .is_some()
    })
    .await;

    // A cut watch: the watcher resumes from its last resourceVersion.
    server.cut_watches();
    cms.create(&PostParams::default(), &cm("two", &[]))
        .await
        .unwrap();
    eventually("two after a cut", || async { reader.state().len() == 2 }).await;

    // History compacted while the watch is down: the resumed watch gets a
    // 410 and the watcher re-lists, noticing a deletion it never saw.
    server.set_refusing();
    tokio::time::sleep(Duration::from_millis(100)).await;
    server.with_store(|s| {
        let def = s.def("", "v1", "configmaps").unwrap().clone();
        s.delete(
            &def,
            "default",
            "one",
            &serde_json::Value::Null,
            &Default::default(),
        )
        .unwrap();
        s.create(
            &def,
            "default",
            json!({"metadata": {"name": "three"}}),
            &Default::default(),
        )
        .unwrap();
        s.compact();
    });
    server.set_available();
    eventually("relist after 410", || async {
        let mut names: Vec<String> = reader.state().iter().map(|c| c.name_any()).collect();
        names.sort();
        names == ["three", "two"]
    })
    .await;
    task.abort();
}

#[tokio::test]
async fn status_subresource_and_generation() {
    let server = TestServer::start().await;
    let svcs: Api<Service> = Api::namespaced(server.client(), "default");
    let svc = Service {
        metadata: ObjectMeta {
            name: Some("web".into()),
            ..Default::default()
        },
        spec: Some(ServiceSpec {
            type_: Some("LoadBalancer".into()),
            ..Default::default()
        }),
        status: Some(
            serde_json::from_value(json!({"loadBalancer": {"ingress": [{"ip": "10.0.0.9"}]}}))
                .unwrap(),
        ),
    };
    let created = svcs.create(&PostParams::default(), &svc).await.unwrap();
    assert!(
        created.status.is_none_or(|s| s.load_balancer.is_none()),
        "status is dropped on create"
    );
    assert_eq!(created.metadata.generation, Some(1));

    // Merge patch of the status endpoint.
    let st = json!({"status": {"loadBalancer": {"ingress": [{"ip": "10.0.0.1"}]}}, "spec": {"type": "ClusterIP"}});
    let s = svcs
        .patch_status("web", &PatchParams::default(), &Patch::Merge(&st))
        .await
        .unwrap();
    assert_eq!(first_ingress_ip(&s), Some("10.0.0.1"));
    assert_eq!(
        s.spec.unwrap().type_.as_deref(),
        Some("LoadBalancer"),
        "the status endpoint ignores spec"
    );
    assert_eq!(s.metadata.generation, Some(1));

    // The main endpoint ignores status and bumps generation on spec changes.
    let main = json!({"status": {"loadBalancer": {"ingress": [{"ip": "10.9.9.9"}]}}, "spec": {"externalTrafficPolicy": "Local"}});
    let s = svcs
        .patch("web", &PatchParams::default(), &Patch::Merge(&main))
        .await
        .unwrap();
    assert_eq!(first_ingress_ip(&s), Some("10.0.0.1"));
    assert_eq!(s.metadata.generation, Some(2));

    // Server-side apply of the status needs a field manager, and creates no object.
    let apply = json!({"apiVersion": "v1", "kind": "Service", "status": {"loadBalancer": {"ingress": [{"ip": "10.0.0.2"}]}}});
    let e = api_err(
        svcs.patch_status("web", &PatchParams::default(), &Patch::Apply(&apply))
            .await
            .unwrap_err(),
    );
    assert_eq!(e.code, 400);
    // The ingress was set by another manager (the merge patch above): a
    // controller takes its fields with force, as a real server demands.
    let e = api_err(
        svcs.patch_status(
            "web",
            &PatchParams::apply("hostlb-allocator"),
            &Patch::Apply(&apply),
        )
        .await
        .unwrap_err(),
    );
    assert_eq!((e.code, e.reason.as_str()), (409, "Conflict"));
    let s = svcs
        .patch_status(
            "web",
            &PatchParams::apply("hostlb-allocator").force(),
            &Patch::Apply(&apply),
        )
        .await
        .unwrap();
    assert_eq!(first_ingress_ip(&s), Some("10.0.0.2"));
    // The same manager's apply to the main resource leaves the status alone;
    // its status apply that leaves the ingress out clears it.
    let spec = json!({"apiVersion": "v1", "kind": "Service", "spec": {"type": "LoadBalancer"}});
    let s = svcs
        .patch(
            "web",
            &PatchParams::apply("hostlb-allocator"),
            &Patch::Apply(&spec),
        )
        .await
        .unwrap();
    assert_eq!(first_ingress_ip(&s), Some("10.0.0.2"));
    let cleared = json!({"apiVersion": "v1", "kind": "Service", "status": {"loadBalancer": {}}});
    let s = svcs
        .patch_status(
            "web",
            &PatchParams::apply("hostlb-allocator"),
            &Patch::Apply(&cleared),
        )
        .await
        .unwrap();
    assert_eq!(first_ingress_ip(&s), None);
    let e = api_err(
        svcs.patch_status(
            "nope",
            &PatchParams::apply("hostlb-allocator"),
            &Patch::Apply(&apply),
        )
        .await
        .unwrap_err(),
    );
    assert_eq!(e.code, 404);

    // replace_status ignores spec.
    let mut cur = svcs.get("web").await.unwrap();
    cur.spec.as_mut().unwrap().type_ = Some("NodePort".into());
    cur.status = Some(serde_json::from_value(json!({"loadBalancer": {}})).unwrap());
    let s = svcs
        .replace_status("web", &PostParams::default(), &cur)
        .await
        .unwrap();
    assert_eq!(s.spec.unwrap().type_.as_deref(), Some("LoadBalancer"));
    assert!(s.status.unwrap().load_balancer.unwrap().ingress.is_none());

    // An unchanged write is a no-op: same resourceVersion.
    let before = svcs.get("web").await.unwrap();
    let after = svcs
        .patch(
            "web",
            &PatchParams::default(),
            &Patch::Merge(json!({"spec": {"type": "LoadBalancer"}})),
        )
        .await
        .unwrap();
    assert_eq!(
        before.metadata.resource_version,
        after.metadata.resource_version
    );
}

#[tokio::test]
async fn patch_kinds_and_apply_create() {
    let server = TestServer::start().await;
    let cms: Api<ConfigMap> = Api::namespaced(server.client(), "default");
    // Apply creates when missing.
    let cfg = json!({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "ssa"}, "data": {"a": "1"}});
    cms.patch("ssa", &PatchParams::apply("me"), &Patch::Apply(&cfg))
        .await
        .unwrap();
    // JSON patch, strategic merge patch, and a failed JSON patch test.
    let p: json_patch::Patch =
        serde_json::from_value(json!([{"op": "add", "path": "/data/b", "value": "2"}])).unwrap();
    cms.patch("ssa", &PatchParams::default(), &Patch::Json::<()>(p))
        .await
        .unwrap();
    cms.patch(
        "ssa",
        &PatchParams::default(),
        &Patch::Strategic(json!({"data": {"c": "3"}})),
    )
    .await
    .unwrap();
    let data = cms.get("ssa").await.unwrap().data.unwrap();
    assert_eq!(
        data,
        BTreeMap::from([
            ("a".into(), "1".into()),
            ("b".into(), "2".into()),
            ("c".into(), "3".into())
        ])
    );
    let p: json_patch::Patch =
        serde_json::from_value(json!([{"op": "test", "path": "/data/a", "value": "9"}])).unwrap();
    let e = api_err(
        cms.patch("ssa", &PatchParams::default(), &Patch::Json::<()>(p))
            .await
            .unwrap_err(),
    );
    assert_eq!(e.code, 422);
    // Patching a missing object is a 404 (except apply).
    let e = api_err(
        cms.patch("gone", &PatchParams::default(), &Patch::Merge(json!({})))
            .await
            .unwrap_err(),
    );
    assert_eq!(e.code, 404);
    // Another manager's field: conflict without force, taken with force.
    let theirs = json!({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "ssa"}, "data": {"a": "mine"}});
    let e = api_err(
        cms.patch("ssa", &PatchParams::apply("other"), &Patch::Apply(&theirs))
            .await
            .unwrap_err(),
    );
    assert_eq!((e.code, e.reason.as_str()), (409, "Conflict"));
    assert!(
        e.message
            .starts_with(r#"Apply failed with 1 conflict: conflict with "me" using v1: .data.a"#),
        "{}",
        e.message
    );
    cms.patch(
        "ssa",
        &PatchParams::apply("other").force(),
        &Patch::Apply(&theirs),
    )
    .await
    .unwrap();
    assert_eq!(cms.get("ssa").await.unwrap().data.unwrap()["a"], "mine");
    // A field an apply stops naming is given up: kept while another manager
    // owns it, removed once none does; others' fields stay.
    let mine = json!({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "ssa"}, "data": {"d": "4"}});
    cms.patch("ssa", &PatchParams::apply("me"), &Patch::Apply(&mine))
        .await
        .unwrap();
    let data = cms.get("ssa").await.unwrap().data.unwrap();
    assert_eq!(data.keys().collect::<Vec<_>>(), ["a", "b", "c", "d"]);
    let none = json!({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "ssa"}});
    cms.patch("ssa", &PatchParams::apply("other"), &Patch::Apply(&none))
        .await
        .unwrap();
    let data = cms.get("ssa").await.unwrap().data.unwrap();
    assert_eq!(data.keys().collect::<Vec<_>>(), ["b", "c", "d"]);
    cms.patch(
        "ssa",
        &PatchParams::apply("other").force(),
        &Patch::Apply(&theirs),
    )
    .await
    .unwrap();
    // A patch that leaves no object is refused, and the server goes on.
    for p in [
        json!([{"op": "replace", "path": "", "value": [1, 2]}]),
        json!([{"op": "replace", "path": "/metadata", "value": "x"}]),
    ] {
        let p: json_patch::Patch = serde_json::from_value(p).unwrap();
        let e = api_err(
            cms.patch("ssa", &PatchParams::default(), &Patch::Json::<()>(p))
                .await
                .unwrap_err(),
        );
        assert_eq!(
            (e.code, e.reason.as_str()),
            (422, "Invalid"),
            "{}",
            e.message
        );
    }
    assert_eq!(cms.get("ssa").await.unwrap().data.unwrap()["a"], "mine");
}

#[tokio::test]
async fn services_are_filled_in_as_the_real_server_does() {
    let server = TestServer::start().await;
    let svcs: Api<Service> = Api::namespaced(server.client(), "default");
    let lb = |name: &str, extra: serde_json::Value| -> Service {
        let mut v = json!({"metadata": {"name": name}, "spec": {"type": "LoadBalancer", "ports": [{"port": 80}]}});
        json_patch::merge(&mut v, &extra);
        serde_json::from_value(v).unwrap()
    };
    let s = svcs
        .create(&PostParams::default(), &lb("web", json!({})))
        .await
        .unwrap();
    let spec = s.spec.unwrap();
    assert_eq!(spec.ip_family_policy.as_deref(), Some("SingleStack"));
    assert_eq!(spec.ip_families, Some(vec!["IPv4".to_string()]));
    let ip = spec.cluster_ip.clone().unwrap();
    assert!(ip.starts_with("10.96."), "{ip}");
    assert!(spec.ports.unwrap()[0].node_port.is_some());
    // Dual-stack by default; a single-stack cluster narrows and refuses.
    let s = svcs
        .create(
            &PostParams::default(),
            &lb(
                "dual",
                json!({"spec": {"ipFamilyPolicy": "PreferDualStack"}}),
            ),
        )
        .await
        .unwrap();
    assert_eq!(s.spec.unwrap().cluster_ips.unwrap().len(), 2);
    server.with_store(|s| s.set_service_families(&["IPv4"]));
    let s = svcs
        .create(
            &PostParams::default(),
            &lb(
                "prefer",
                json!({"spec": {"ipFamilyPolicy": "PreferDualStack"}}),
            ),
        )
        .await
        .unwrap();
    assert_eq!(s.spec.unwrap().ip_families, Some(vec!["IPv4".to_string()]));
    let e = api_err(
        svcs.create(
            &PostParams::default(),
            &lb(
                "require",
                json!({"spec": {"ipFamilyPolicy": "RequireDualStack"}}),
            ),
        )
        .await
        .unwrap_err(),
    );
    assert_eq!(e.code, 422);
    assert!(
        e.message.contains("not configured for dual-stack"),
        "{}",
        e.message
    );
    // What was allocated stays on update; the cluster IP cannot change.
    svcs.patch(
        "web",
        &PatchParams::default(),
        &Patch::Merge(json!({"spec": {"ports": [{"port": 80}, {"port": 443}]}})),
    )
    .await
    .unwrap();
    assert_eq!(
        svcs.get("web").await.unwrap().spec.unwrap().cluster_ip,
        Some(ip)
    );
    let e = api_err(
        svcs.patch(
            "web",
            &PatchParams::default(),
            &Patch::Merge(json!({"spec": {"clusterIP": "10.96.200.1"}})),
        )
        .await
        .unwrap_err(),
    );
    assert_eq!(e.code, 422);
}

#[tokio::test]
async fn finalizers_hold_deletion() {
    let server = TestServer::start().await;
    let cms: Api<ConfigMap> = Api::namespaced(server.client(), "default");
    let mut c = cm("held", &[]);
    c.metadata.finalizers = Some(vec!["hostlb.io/test".into()]);
    cms.create(&PostParams::default(), &c).await.unwrap();
    cms.delete("held", &DeleteParams::default()).await.unwrap();
    let c = cms.get("held").await.unwrap();
    assert!(c.metadata.deletion_timestamp.is_some());
    cms.patch(
        "held",
        &PatchParams::default(),
        &Patch::Merge(json!({"metadata": {"finalizers": null}})),
    )
    .await
    .unwrap();
    assert!(cms.get_opt("held").await.unwrap().is_none());
}

#[tokio::test]
async fn namespaces_nodes_and_cascading_delete() {
    let server = TestServer::start().await;
    let nss: Api<Namespace> = Api::all(server.client());
    let ns = Namespace {
        metadata: ObjectMeta {
            name: Some("shop".into()),
            ..Default::default()
        },
        ..Default::default()
    };
    let ns = nss.create(&PostParams::default(), &ns).await.unwrap();
    assert_eq!(ns.status.unwrap().phase.as_deref(), Some("Active"));
    let cms: Api<ConfigMap> = Api::namespaced(server.client(), "shop");
    cms.create(&PostParams::default(), &cm("c", &[]))
        .await
        .unwrap();
    nss.delete("shop", &DeleteParams::default()).await.unwrap();
    assert!(
        Api::<ConfigMap>::all(server.client())
            .list(&ListParams::default())
            .await
            .unwrap()
            .items
            .is_empty()
    );

    // Nodes keep the status they are created with, as kubelets rely on.
    let nodes: Api<Node> = Api::all(server.client());
    let node: Node = serde_json::from_value(json!({
        "metadata": {"name": "n1", "labels": {"zone": "a"}},
        "status": {"conditions": [{"type": "Ready", "status": "True"}]}
    }))
    .unwrap();
    let n = nodes.create(&PostParams::default(), &node).await.unwrap();
    assert_eq!(n.status.unwrap().conditions.unwrap()[0].type_, "Ready");
}

#[tokio::test]
async fn crds_then_typed_custom_objects_and_schema_rejection() {
    let server = TestServer::start().await;
    let client = server.client();
    let crds: Api<CustomResourceDefinition> = Api::all(client.clone());
    for (_, crd) in hostlb_api::crds::all() {
        crds.create(&PostParams::default(), &crd).await.unwrap();
    }
    for name in ["ipaddresspools.hostlb.io", "l2advertisements.hostlb.io"] {
        let established = kube::runtime::wait::await_condition(
            crds.clone(),
            name,
            kube::runtime::wait::conditions::is_crd_established(),
        );
        tokio::time::timeout(Duration::from_secs(5), established)
            .await
            .unwrap()
            .unwrap();
    }

    let pools: Api<IPAddressPool> = Api::namespaced(client.clone(), "default");
    let p = IPAddressPool::new(
        "p1",
        IPAddressPoolSpec {
            addresses: vec!["10.0.0.0/24".into()],
            ..Default::default()
        },
    );
    // Default applied by the schema even though the client omits it.
    let raw = json!({"apiVersion": "hostlb.io/v1", "kind": "IPAddressPool", "metadata": {"name": "p2"},
                     "spec": {"addresses": ["10.0.1.0/24"], "unknownField": 1}});
    pools.create(&PostParams::default(), &p).await.unwrap();
    let dynamic: Api<kube::core::DynamicObject> = Api::namespaced_with(
        client.clone(),
        "default",
        &kube::core::ApiResource::erase::<IPAddressPool>(&()),
    );
    let created = dynamic
        .create(
            &PostParams::default(),
            &serde_json::from_value(raw).unwrap(),
        )
        .await
        .unwrap();
    assert_eq!(created.data["spec"]["autoAssign"], true);
    assert!(
        created.data["spec"].get("unknownField").is_none(),
        "unknown fields are pruned"
    );
    let listed = pools.list(&ListParams::default()).await.unwrap();
    assert_eq!(listed.items.len(), 2);

    // Status subresource on the custom resource.
    let st = json!({"status": {"assignedIPv4": 3, "availableIPv4": 253}});
    let p = pools
        .patch_status("p1", &PatchParams::default(), &Patch::Merge(&st))
        .await
        .unwrap();
    assert_eq!(p.status.unwrap().assigned_ipv4, 3);

    // Schema rejection with the real server's 422.
    let ads: Api<L2Advertisement> = Api::namespaced(client.clone(), "default");
    let spec = L2AdvertisementSpec {
        preferred_node_selectors: vec![PreferredNodeSelector {
            weight: 0,
            preference: Default::default(),
        }],
        ..Default::default()
    };
    let e = api_err(
        ads.create(&PostParams::default(), &L2Advertisement::new("bad", spec))
            .await
            .unwrap_err(),
    );
    assert_eq!((e.code, e.reason.as_str()), (422, "Invalid"));
    assert_eq!(
        e.message,
        r#"L2Advertisement.hostlb.io "bad" is invalid: spec.preferredNodeSelectors[0].weight: Invalid value: 0: spec.preferredNodeSelectors[0].weight in body should be greater than or equal to 1"#
    );
    let bad_op = json!({"apiVersion": "hostlb.io/v1", "kind": "L2Advertisement", "metadata": {"name": "op"},
        "spec": {"nodeSelectors": [{"matchExpressions": [{"key": "a", "operator": "Near"}]}]}});
    let dyn_ads: Api<kube::core::DynamicObject> = Api::namespaced_with(
        client.clone(),
        "default",
        &kube::core::ApiResource::erase::<L2Advertisement>(&()),
    );
    let e = api_err(
        dyn_ads
            .create(
                &PostParams::default(),
                &serde_json::from_value(bad_op).unwrap(),
            )
            .await
            .unwrap_err(),
    );
    assert!(e.message.ends_with(r#"spec.nodeSelectors[0].matchExpressions[0].operator: Unsupported value: "Near": supported values: "In", "NotIn", "Exists", "DoesNotExist""#), "{}", e.message);
    let wrong_type = json!({"apiVersion": "hostlb.io/v1", "kind": "IPAddressPool", "metadata": {"name": "t"}, "spec": {"addresses": "10.0.0.1"}});
    let e = api_err(
        dynamic
            .create(
                &PostParams::default(),
                &serde_json::from_value(wrong_type).unwrap(),
            )
            .await
            .unwrap_err(),
    );
    assert!(e.message.ends_with(r#"spec.addresses: Invalid value: "string": spec.addresses in body must be of type array: "string""#), "{}", e.message);

    // Deleting the CRD stops serving the resource and removes its objects.
    crds.delete("ipaddresspools.hostlb.io", &DeleteParams::default())
        .await
        .unwrap();
    let e = api_err(pools.list(&ListParams::default()).await.unwrap_err());
    assert_eq!(e.code, 404);
}

#[tokio::test]
async fn discovery_sees_builtin_and_custom_groups() {
    let server = TestServer::start().await;
    let client = server.client();
    let crds: Api<CustomResourceDefinition> = Api::all(client.clone());
    for (_, crd) in hostlb_api::crds::all() {
        crds.create(&PostParams::default(), &crd).await.unwrap();
    }
    let d = kube::Discovery::new(client.clone()).run().await.unwrap();
    let groups: Vec<String> = d.groups().map(|g| g.name().to_string()).collect();
    for g in [
        "",
        "coordination.k8s.io",
        "discovery.k8s.io",
        "events.k8s.io",
        "hostlb.io",
    ] {
        assert!(groups.iter().any(|x| x == g), "{g} missing from {groups:?}");
    }
    let (ar, caps) = d
        .resolve_gvk(&kube::core::GroupVersionKind::gvk(
            "hostlb.io",
            "v1",
            "IPAddressPool",
        ))
        .unwrap();
    assert_eq!(ar.plural, "ipaddresspools");
    assert!(
        caps.subresources
            .iter()
            .any(|(s, _)| s.plural == "ipaddresspools/status")
            || caps.scope == kube::discovery::Scope::Namespaced
    );
    let (ar, _) = kube::discovery::pinned_kind(
        &client,
        &kube::core::GroupVersionKind::gvk("coordination.k8s.io", "v1", "Lease"),
    )
    .await
    .unwrap();
    assert_eq!(ar.plural, "leases");
    let v = client.apiserver_version().await.unwrap();
    assert_eq!(v.major, "1");
}

/// A bare Service `default/web` for Events to be about.
async fn create_web(client: &kube::Client) -> Service {
    let svcs: Api<Service> = Api::namespaced(client.clone(), "default");
    svcs.create(
        &PostParams::default(),
        &Service {
            metadata: ObjectMeta {
                name: Some("web".into()),
                ..Default::default()
            },
            ..Default::default()
        },
    )
    .await
    .unwrap()
}

#[tokio::test]
async fn events_recorder_creates_then_counts_a_series() {
    let server = TestServer::start().await;
    let client = server.client();
    let svc = create_web(&client).await;
    let recorder = kube::runtime::events::Recorder::new(client.clone(), "hostlb-allocator".into());
    let ev = kube::runtime::events::Event {
        type_: kube::runtime::events::EventType::Normal,
        reason: "IPAllocated".into(),
        note: Some("Assigned 10.0.0.1 from pool p1".into()),
        action: "Allocate".into(),
        secondary: None,
    };
    recorder.publish(&ev, &svc.object_ref(&())).await.unwrap();
    recorder.publish(&ev, &svc.object_ref(&())).await.unwrap();
    let events: Api<K8sEvent> = Api::namespaced(client, "default");
    let list = events.list(&ListParams::default()).await.unwrap().items;
    assert_eq!(list.len(), 1, "the repeat is a series on the same Event");
    let e = &list[0];
    assert_eq!(e.reason.as_deref(), Some("IPAllocated"));
    assert_eq!(e.regarding.as_ref().unwrap().name.as_deref(), Some("web"));
    assert_eq!(e.series.as_ref().unwrap().count, 2);
}

/// The binaries' own recorder (it keeps no copy of each Event): a repeat
/// is the next count of the first Event's series, and another reason or
/// type is an Event of its own.
#[tokio::test]
async fn the_binaries_recorder_counts_repeats_as_a_series() {
    use kube::runtime::events::{Event, EventType};
    let server = TestServer::start().await;
    let client = server.client();
    let svc = create_web(&client).await;
    let recorder = hostlb_api::runtime::events::Recorder::new(
        client.clone(),
        kube::runtime::events::Reporter {
            controller: "hostlb-lbnodeagent".into(),
            instance: Some("node-a".into()),
        },
    );
    let ev = |type_, reason: &str, note: &str| Event {
        type_,
        reason: reason.into(),
        note: Some(note.into()),
        action: "Announce".into(),
        secondary: None,
    };
    let at = svc.object_ref(&());
    let first = ev(
        EventType::Normal,
        "AnnouncingLocal",
        "node-a answers for 10.0.0.1",
    );
    for _ in 0..3 {
        recorder.publish(&first, &at).await.unwrap();
    }
    recorder
        .publish(
            &ev(EventType::Normal, "Withdrawn", "node-a no longer answers"),
            &at,
        )
        .await
        .unwrap();
    recorder
        .publish(&ev(EventType::Warning, "AnnouncingLocal", "odd"), &at)
        .await
        .unwrap();
    let events: Api<K8sEvent> = Api::namespaced(client, "default");
    let mut list = events.list(&ListParams::default()).await.unwrap().items;
    list.sort_by_key(|e| (e.reason.clone(), e.type_.clone()));
    let seen: Vec<_> = list
        .iter()
        .map(|e| {
            (
                e.reason.clone().unwrap(),
                e.type_.clone().unwrap(),
                e.series.as_ref().map(|s| s.count),
                e.note.clone().unwrap(),
                e.reporting_instance.clone().unwrap(),
                e.regarding.as_ref().and_then(|r| r.name.clone()).unwrap(),
            )
        })
        .collect();
    let row = |r: &str, t: &str, c, n: &str| {
        (
            r.to_string(),
            t.to_string(),
            c,
            n.to_string(),
            "node-a".to_string(),
            "web".to_string(),
        )
    };
    assert_eq!(
        seen,
        [
            row(
                "AnnouncingLocal",
                "Normal",
                Some(3),
                "node-a answers for 10.0.0.1"
            ),
            row("AnnouncingLocal", "Warning", None, "odd"),
            row("Withdrawn", "Normal", None, "node-a no longer answers"),
        ]
    );
    // The first Event gone (expired, or deleted by hand): a repeat starts
    // a new one rather than patching nothing.
    let name = list[0].metadata.name.clone().unwrap();
    events.delete(&name, &Default::default()).await.unwrap();
    recorder.publish(&first, &at).await.unwrap();
    let again: Vec<_> = events
        .list(&ListParams::default())
        .await
        .unwrap()
        .items
        .into_iter()
        .filter(|e| {
            e.reason.as_deref() == Some("AnnouncingLocal") && e.type_.as_deref() == Some("Normal")
        })
        .collect();
    assert_eq!(again.len(), 1);
    assert_ne!(again[0].metadata.name.as_deref(), Some(name.as_str()));
    assert_eq!(again[0].series, None);
}

#[tokio::test]
async fn lease_manager_elects_one_leader_and_hands_over() {
    use kube_lease_manager::{LeaseManager, LeaseManagerBuilder};
    let server = TestServer::start().await;
    let client = server.client();
    let make = |id: &str| {
        let client = client.clone();
        let id = id.to_string();
        async move {
            LeaseManagerBuilder::new(client, "hostlb-allocator")
                .with_namespace("default")
                .with_identity(id)
                .with_duration(2)
                .with_grace(1)
                .build()
                .await
                .unwrap()
        }
    };
    let a: LeaseManager = make("a").await;
    let b: LeaseManager = make("b").await;
    let (mut a_rx, a_task) = a.watch().await;
    let (mut b_rx, b_task) = b.watch().await;
    eventually("one leader", || {
        let (x, y) = (*a_rx.borrow(), *b_rx.borrow());
        async move { x ^ y }
    })
    .await;
    // Stay with exactly one leader for a while.
    for _ in 0..20 {
        tokio::time::sleep(Duration::from_millis(100)).await;
        assert!(
            *a_rx.borrow() ^ *b_rx.borrow(),
            "exactly one leader at all times"
        );
    }
    let a_leads = *a_rx.borrow();
    // The leader stops; the other takes over once the lease expires.
    let (survivor, survivor_task) = if a_leads {
        drop(a_rx);
        a_task.await.unwrap().unwrap();
        (&mut b_rx, b_task)
    } else {
        drop(b_rx);
        b_task.await.unwrap().unwrap();
        (&mut a_rx, a_task)
    };
    tokio::time::timeout(Duration::from_secs(10), async {
        while !*survivor.borrow() {
            survivor.changed().await.unwrap();
        }
    })
    .await
    .expect("hand-over within the lease duration");
    survivor_task.abort();
}

#[tokio::test]
async fn faults_unavailable_refused_delayed() {
    let server = TestServer::start().await;
    let client = no_retry_client(&server);
    let cms: Api<ConfigMap> = Api::namespaced(client.clone(), "default");

    server.set_unavailable();
    let e = api_err(cms.list(&ListParams::default()).await.unwrap_err());
    assert_eq!((e.code, e.reason.as_str()), (503, "ServiceUnavailable"));
    server.set_available();
    cms.list(&ListParams::default()).await.unwrap();

    // With kube's default retry policy, a short 503 window is ridden out.
    let retrying: Api<ConfigMap> = Api::namespaced(server.client(), "default");
    server.set_unavailable();
    let faults = tokio::spawn({
        let url = server.url();
        async move {
            tokio::time::sleep(Duration::from_millis(200)).await;
            // Through the control path, as an operator or a script would.
            reqwest_free_get(&format!("{url}/testserver/available")).await;
        }
    });
    retrying.list(&ListParams::default()).await.unwrap();
    faults.await.unwrap();

    server.set_refusing();
    tokio::time::sleep(Duration::from_millis(50)).await;
    let e = cms.list(&ListParams::default()).await.unwrap_err();
    assert!(
        !matches!(e, kube::Error::Api(_)),
        "refused connections are transport errors: {e:?}"
    );
    assert!(tokio::net::TcpStream::connect(server.addr()).await.is_err());
    server.set_available();
    eventually("listening again", || async {
        cms.list(&ListParams::default()).await.is_ok()
    })
    .await;

    server.set_delay(Duration::from_millis(300));
    let t = tokio::time::Instant::now();
    cms.list(&ListParams::default()).await.unwrap();
    assert!(t.elapsed() >= Duration::from_millis(300));
    server.set_delay(Duration::ZERO);
}

/// A GET without an HTTP client crate: the control path is plain HTTP.
async fn reqwest_free_get(url: &str) {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let rest = url.strip_prefix("http://").unwrap();
    let (host, path) = rest.split_once('/').unwrap();
    let mut s = tokio::net::TcpStream::connect(host).await.unwrap();
    s.write_all(
        format!("GET /{path} HTTP/1.1\r\nHost: {host}\r\nConnection: close\r\n\r\n").as_bytes(),
    )
    .await
    .unwrap();
    let mut out = String::new();
    s.read_to_string(&mut out).await.unwrap();
    assert!(out.starts_with("HTTP/1.1 200"), "{out}");
}

#[tokio::test]
async fn controller_reconciles_and_writes() {
    use kube::runtime::controller::{Action, Controller};
    use std::sync::Arc;
    let server = TestServer::start().await;
    let client = server.client();
    let cms: Api<ConfigMap> = Api::namespaced(client.clone(), "default");
    for i in 0..5 {
        cms.create(&PostParams::default(), &cm(&format!("c{i}"), &[]))
            .await
            .unwrap();
    }
    async fn reconcile(
        obj: Arc<ConfigMap>,
        api: Arc<Api<ConfigMap>>,
    ) -> Result<Action, kube::Error> {
        let want = obj
            .data
            .as_ref()
            .and_then(|d| d.get("k"))
            .cloned()
            .unwrap_or_default();
        if obj.annotations().get("seen") != Some(&want) {
            let p = json!({"metadata": {"annotations": {"seen": want}}});
            api.patch(&obj.name_any(), &PatchParams::default(), &Patch::Merge(p))
                .await?;
        }
        Ok(Action::await_change())
    }
    let api = Arc::new(cms.clone());
    let task = tokio::spawn(
        Controller::new(cms.clone(), watcher::Config::default())
            .run(
                reconcile,
                |_, _, _| Action::requeue(Duration::from_secs(1)),
                api,
            )
            .for_each(|_| async {}),
    );
    let all_seen = |v: &'static str| {
        let cms = cms.clone();
        move || {
            let cms = cms.clone();
            async move {
                cms.list(&ListParams::default())
                    .await
                    .unwrap()
                    .items
                    .iter()
                    .all(|c| c.annotations().get("seen").map(String::as_str) == Some(v))
            }
        }
    };
    eventually("first reconcile of every object", all_seen("v")).await;
    for i in 0..5 {
        cms.patch(
            &format!("c{i}"),
            &PatchParams::default(),
            &Patch::Merge(json!({"data": {"k": "w"}})),
        )
        .await
        .unwrap();
    }
    eventually("reconcile after changes", all_seen("w")).await;
    task.abort();
}

/// Slow writes behave as on a real server: the `timeout` parameter ends one
/// that would take longer, with a 504 and nothing applied; without it the
/// write lands even after the client gave up on it. Other clients' writes
/// are not slowed.
#[tokio::test]
async fn slow_writes_honour_the_timeout_parameter() {
    let server = TestServer::start().await;
    let mut config = server.config();
    config.headers.push((
        axum::http::header::USER_AGENT,
        "slowpoke/1".parse().unwrap(),
    ));
    // The client's own retries of 504s would hide the answer.
    config.default_retry = false;
    let slow = Client::try_from(config).unwrap();
    server.set_slow_writes("slowpoke", Duration::from_millis(600));
    let create = |name: &str, timeout: Option<&str>| {
        let api: Api<ConfigMap> = Api::default_namespaced(slow.clone());
        let mut req = kube::core::Request::new(api.resource_url())
            .create(
                &PostParams::default(),
                serde_json::to_vec(&cm(name, &[])).unwrap(),
            )
            .unwrap();
        if let Some(t) = timeout {
            *req.uri_mut() = format!("{}?timeout={t}", req.uri().path()).parse().unwrap();
        }
        let slow = slow.clone();
        async move { slow.request::<ConfigMap>(req).await }
    };
    let cms: Api<ConfigMap> = Api::default_namespaced(server.client());

    let t = tokio::time::Instant::now();
    match create("bounded", Some("300ms")).await {
        Err(kube::Error::Api(s)) => {
            assert_eq!((s.code, s.reason.as_str()), (504, "Timeout"), "{s:?}")
        }
        other => panic!("expected a 504, got {other:?}"),
    }
    assert!(t.elapsed() >= Duration::from_millis(300));
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert!(
        cms.get_opt("bounded").await.unwrap().is_none(),
        "not applied"
    );

    assert!(
        tokio::time::timeout(Duration::from_millis(100), create("abandoned", None))
            .await
            .is_err(),
        "the client gives up first"
    );
    assert!(cms.get_opt("abandoned").await.unwrap().is_none());
    eventually("the abandoned write to land", || async {
        cms.get_opt("abandoned").await.unwrap().is_some()
    })
    .await;

    create("in-time", Some("2s")).await.unwrap();
    let t = tokio::time::Instant::now();
    cms.create(&PostParams::default(), &cm("other-client", &[]))
        .await
        .unwrap();
    assert!(t.elapsed() < Duration::from_millis(600));
    let junk = kube::core::Request::new(cms.resource_url())
        .create(
            &PostParams::default(),
            serde_json::to_vec(&cm("junk", &[])).unwrap(),
        )
        .unwrap();
    let (mut parts, body) = junk.into_parts();
    parts.uri = format!("{}?timeout=soon", parts.uri.path())
        .parse()
        .unwrap();
    match server
        .client()
        .request::<ConfigMap>(axum::http::Request::from_parts(parts, body))
        .await
    {
        Err(kube::Error::Api(s)) => assert_eq!(s.code, 400, "{s:?}"),
        other => panic!("expected a 400, got {other:?}"),
    }
}
