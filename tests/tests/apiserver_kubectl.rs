//! `kubectl` against the test API server: discovery, get (with the columns
//! a real cluster prints), create, apply (client- and server-side), delete
//! and schema errors.
//!
//! Needs `kubectl` on PATH (or `KUBECTL=/path`). Without it the test fails
//! when `CI` is set and otherwise says it did not run.

use std::path::{Path, PathBuf};
use std::process::Command;

use hostlb_tests::apiserver::TestServer;

struct Kubectl {
    bin: PathBuf,
    kubeconfig: PathBuf,
    cache: PathBuf,
    /// Client-side validation needs OpenAPI v2 before kubectl 1.27.
    validate: &'static str,
}

impl Kubectl {
    fn find(dir: &Path, server: &TestServer) -> Option<Kubectl> {
        let bin = std::env::var_os("KUBECTL")
            .map(PathBuf::from)
            .unwrap_or_else(|| "kubectl".into());
        let out = Command::new(&bin)
            .args(["version", "--client", "-o", "json"])
            .output()
            .ok()?;
        let v: serde_json::Value = serde_json::from_slice(&out.stdout).ok()?;
        let minor: u32 = v["clientVersion"]["minor"]
            .as_str()?
            .trim_end_matches('+')
            .parse()
            .ok()?;
        let kubeconfig = dir.join("kubeconfig");
        server.write_kubeconfig(&kubeconfig).unwrap();
        Some(Kubectl {
            bin,
            kubeconfig,
            cache: dir.join("cache"),
            validate: if minor >= 27 {
                "--validate=strict"
            } else {
                "--validate=false"
            },
        })
    }

    /// `None` (the test does not run) without kubectl, except in CI.
    fn find_or_skip(dir: &Path, server: &TestServer) -> Option<Kubectl> {
        let k = Kubectl::find(dir, server);
        if k.is_none() {
            if std::env::var_os("CI").is_some() {
                panic!("kubectl is required in CI: install it or set KUBECTL");
            }
            eprintln!("NOT RUN: kubectl not found (install it or set KUBECTL)");
        }
        k
    }

    fn run(&self, args: &[&str]) -> (bool, String, String) {
        let out = Command::new(&self.bin)
            .arg("--kubeconfig")
            .arg(&self.kubeconfig)
            .arg("--cache-dir")
            .arg(&self.cache)
            .args(args)
            .env("HOME", self.cache.parent().unwrap())
            .output()
            .expect("run kubectl");
        (
            out.status.success(),
            String::from_utf8_lossy(&out.stdout).into_owned(),
            String::from_utf8_lossy(&out.stderr).into_owned(),
        )
    }

    fn ok(&self, args: &[&str]) -> String {
        let (ok, out, err) = self.run(args);
        assert!(ok, "kubectl {args:?} failed: {err}");
        out
    }

    fn apply_yaml(
        &self,
        dir: &Path,
        name: &str,
        yaml: &str,
        args: &[&str],
    ) -> (bool, String, String) {
        let f = dir.join(name);
        std::fs::write(&f, yaml).unwrap();
        let mut all: Vec<&str> = args.to_vec();
        all.extend(["-f", f.to_str().unwrap(), self.validate]);
        self.run(&all)
    }
}

fn tempdir(name: &str) -> PathBuf {
    let d = std::env::temp_dir().join(format!("hostlb-kubectl-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    std::fs::create_dir_all(&d).unwrap();
    d
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kubectl_get_create_apply_delete() {
    let server = TestServer::start().await;
    let dir = tempdir("crud");
    let Some(k) = Kubectl::find_or_skip(&dir, &server) else {
        return;
    };
    let k = tokio::task::spawn_blocking(move || {
        // Built-in kinds.
        let out = k.ok(&["get", "namespaces"]);
        assert!(out.contains("default") && out.contains("kube-system"), "{out}");
        let (ok, out, err) = k.apply_yaml(&dir, "cm.yaml", "apiVersion: v1\nkind: ConfigMap\nmetadata: {name: greeting}\ndata: {hello: world}\n", &["create"]);
        assert!(ok, "{err}");
        assert!(out.contains("configmap/greeting created"), "{out}");
        let out = k.ok(&["get", "configmap", "greeting", "-o", "jsonpath={.data.hello}"]);
        assert_eq!(out, "world");
        let (ok, _, err) = k.apply_yaml(&dir, "cm.yaml", "apiVersion: v1\nkind: ConfigMap\nmetadata: {name: greeting}\ndata: {hello: world}\n", &["create"]);
        assert!(!ok && err.contains("AlreadyExists") || err.contains("already exists"), "{err}");

        // CRDs from the repository, then objects of them, client- and server-side apply.
        let crds = Path::new(env!("CARGO_MANIFEST_DIR")).join("../deploy/crds");
        let (ok, out, err) = k.run(&["apply", "-f", crds.to_str().unwrap(), k.validate]);
        assert!(ok, "{err}");
        assert!(out.contains("ipaddresspools.hostlb.io created"), "{out}");
        let (ok, _, err) = k.apply_yaml(&dir, "ns.yaml", "apiVersion: v1\nkind: Namespace\nmetadata: {name: hostlb-system}\n", &["create"]);
        assert!(ok, "{err}");
        let pool = "apiVersion: hostlb.io/v1\nkind: IPAddressPool\nmetadata: {name: p1, namespace: hostlb-system}\nspec:\n  addresses: [192.168.10.0/24]\n";
        let (ok, out, err) = k.apply_yaml(&dir, "pool.yaml", pool, &["apply"]);
        assert!(ok, "{err}");
        assert!(out.contains("ipaddresspool.hostlb.io/p1 created"), "{out}");
        let (ok, out, err) = k.apply_yaml(&dir, "pool.yaml", &pool.replace("/24", "/25"), &["apply"]);
        assert!(ok, "{err}");
        assert!(out.contains("configured"), "{out}");
        let (ok, _, err) = k.apply_yaml(&dir, "pool2.yaml", &pool.replace("p1", "p2"), &["apply", "--server-side"]);
        assert!(ok, "{err}");
        // The printer columns of the CRD.
        let out = k.ok(&["get", "ipaddresspools", "-n", "hostlb-system"]);
        let header = out.lines().next().unwrap();
        for col in ["NAME", "ADDRESSES", "AUTO ASSIGN", "ASSIGNED IPV4", "AVAILABLE IPV6", "READY", "AGE"] {
            assert!(header.contains(col), "{col} missing: {out}");
        }
        assert!(out.contains("[\"192.168.10.0/25\"]") || out.contains("192.168.10.0/25"), "{out}");
        let out = k.ok(&["get", "ipp", "-A"]);
        assert!(out.contains("hostlb-system") && out.contains("p2"), "short name and -A: {out}");

        // Schema errors come back as the real server words them.
        let bad = "apiVersion: hostlb.io/v1\nkind: L2Advertisement\nmetadata: {name: bad, namespace: hostlb-system}\nspec:\n  preferredNodeSelectors:\n  - weight: 0\n    preference: {}\n";
        let (ok, _, err) = k.apply_yaml(&dir, "bad.yaml", bad, &["create"]);
        assert!(!ok);
        assert!(err.contains("is invalid") && err.contains("should be greater than or equal to 1"), "{err}");

        // Delete, then NotFound.
        let out = k.ok(&["delete", "configmap", "greeting"]);
        assert!(out.contains("deleted"), "{out}");
        let (ok, _, err) = k.run(&["get", "configmap", "greeting"]);
        assert!(!ok && err.contains(r#"configmaps "greeting" not found"#), "{err}");
        k
    })
    .await
    .unwrap();
    drop(k);
}

/// kubectl's typed generators send protobuf bodies; what they carry arrives.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kubectl_create_generators_send_protobuf() {
    let server = TestServer::start().await;
    let dir = tempdir("protobuf");
    let Some(k) = Kubectl::find_or_skip(&dir, &server) else {
        return;
    };
    tokio::task::spawn_blocking(move || {
        let get = |args: &[&str]| -> serde_json::Value {
            let mut all = vec!["get", "-o", "json", "-n", "demo"];
            all.extend(args);
            serde_json::from_str(&k.ok(&all)).unwrap()
        };
        let out = k.ok(&["create", "namespace", "demo"]);
        assert!(out.contains("namespace/demo created"), "{out}");
        let (_, _, log) = k.run(&["create", "namespace", "demo2", "-v=8"]);
        assert!(
            log.contains("Content-Type: application/vnd.kubernetes.protobuf"),
            "kubectl no longer sends protobuf, so this test proves nothing: {log}"
        );
        assert_eq!(get(&["namespace", "demo"])["metadata"]["name"], "demo");

        let file = dir.join("blob");
        std::fs::write(&file, [0u8, 0xff]).unwrap();
        let from_file = format!("--from-file=blob={}", file.display());
        k.ok(&[
            "create",
            "configmap",
            "cm",
            "-n",
            "demo",
            "--from-literal=greeting=hello",
            &from_file,
        ]);
        let cm = get(&["configmap", "cm"]);
        assert_eq!(cm["data"], serde_json::json!({"greeting": "hello"}));
        assert_eq!(cm["binaryData"], serde_json::json!({"blob": "AP8="}));

        k.ok(&[
            "create",
            "secret",
            "generic",
            "creds",
            "-n",
            "demo",
            "--from-literal=user=admin",
            "--type=Opaque",
        ]);
        let secret = get(&["secret", "creds"]);
        assert_eq!(secret["data"], serde_json::json!({"user": "YWRtaW4="}));
        assert_eq!(secret["type"], "Opaque");

        k.ok(&[
            "create",
            "service",
            "loadbalancer",
            "web",
            "-n",
            "demo",
            "--tcp=80:http",
            "--tcp=443:8443",
        ]);
        let svc = get(&["service", "web"]);
        assert_eq!(svc["spec"]["type"], "LoadBalancer");
        assert_eq!(svc["spec"]["selector"], serde_json::json!({"app": "web"}));
        let ports = &svc["spec"]["ports"];
        assert_eq!(ports[0]["port"], 80);
        assert_eq!(
            ports[0]["targetPort"], "http",
            "a named target port stays a string"
        );
        assert_eq!(
            ports[1]["targetPort"], 8443,
            "a numbered one stays a number"
        );
        assert_eq!(ports[0]["protocol"], "TCP");
        assert!(
            ports[0]["nodePort"].as_u64().unwrap() >= 30000,
            "an unset nodePort is allocated: {svc}"
        );
        assert_eq!(svc["metadata"]["labels"], serde_json::json!({"app": "web"}));
    })
    .await
    .unwrap();
}

/// Events written in events.k8s.io (as hostlb writes them) show where a
/// real server shows them: `kubectl get events` and `kubectl describe`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn events_k8s_io_events_and_endpoint_slices_show_in_describe() {
    let server = TestServer::start().await;
    let dir = tempdir("events");
    let Some(k) = Kubectl::find_or_skip(&dir, &server) else {
        return;
    };
    tokio::task::spawn_blocking(move || {
        let svc = "apiVersion: v1\nkind: Service\nmetadata: {name: web, namespace: default}\nspec:\n  type: LoadBalancer\n  ports: [{port: 80, protocol: TCP}]\n";
        let (ok, _, err) = k.apply_yaml(&dir, "svc.yaml", svc, &["create"]);
        assert!(ok, "{err}");
        let uid = k.ok(&["get", "service", "web", "-o", "jsonpath={.metadata.uid}"]);
        let ev = format!("apiVersion: events.k8s.io/v1\nkind: Event\nmetadata: {{name: web.1, namespace: default}}\neventTime: \"2026-11-24T22:00:00.000000Z\"\nreportingController: hostlb-lbnodeagent\nreportingInstance: node-a\naction: Announce\nreason: AnnouncingLocal\nnote: node-a answers for 10.0.0.1\ntype: Normal\nregarding: {{kind: Service, name: web, namespace: default, apiVersion: v1, uid: {uid}}}\n");
        let (ok, _, err) = k.apply_yaml(&dir, "ev.yaml", &ev, &["create"]);
        assert!(ok, "{err}");
        let events = k.ok(&["get", "events", "-n", "default"]);
        assert!(
            events.contains("AnnouncingLocal") && events.contains("service/web"),
            "{events}"
        );
        // An EndpointSlice whose port has no name: the server stores it
        // with name "" (kubectl describe reads it without a nil check).
        let slice = "apiVersion: discovery.k8s.io/v1\nkind: EndpointSlice\nmetadata: {name: web-1, namespace: default, labels: {kubernetes.io/service-name: web}}\naddressType: IPv4\nendpoints: [{addresses: [10.1.0.1], nodeName: n1}]\nports: [{port: 8080}]\n";
        let (ok, _, err) = k.apply_yaml(&dir, "slice.yaml", slice, &["create"]);
        assert!(ok, "{err}");
        let port = k.ok(&["get", "endpointslice", "web-1", "-o", "jsonpath={.ports[0]}"]);
        assert_eq!(port, r#"{"name":"","port":8080,"protocol":"TCP"}"#);
        let described = k.ok(&["describe", "service", "web", "-n", "default"]);
        assert!(
            described.contains("AnnouncingLocal") && described.contains("node-a answers"),
            "{described}"
        );
        assert!(described.contains("10.1.0.1:8080"), "{described}");
    })
    .await
    .unwrap();
}

/// What an operator types first: `kubectl apply -k deploy/` lands every
/// object the project ships (validated through OpenAPI v3, with no v2 to
/// fall back on), and `kubectl explain` reads the schemas of custom and
/// built-in kinds.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn apply_k_deploy_and_explain() {
    let server = TestServer::start().await;
    let dir = tempdir("apply-k");
    let Some(k) = Kubectl::find_or_skip(&dir, &server) else {
        return;
    };
    tokio::task::spawn_blocking(move || {
        let deploy = Path::new(env!("CARGO_MANIFEST_DIR")).join("../deploy");
        let (ok, out, err) = k.run(&["apply", "-k", deploy.to_str().unwrap(), k.validate]);
        assert!(ok, "{err}");
        for object in [
            "namespace/hostlb-system created",
            "customresourcedefinition.apiextensions.k8s.io/l2advertisements.hostlb.io created",
            "namespace/hostlb-agents created",
            "clusterrole.rbac.authorization.k8s.io/hostlb-agent created",
            "clusterrolebinding.rbac.authorization.k8s.io/hostlb-allocator created",
            "deployment.apps/hostlb-allocator created",
            "poddisruptionbudget.policy/hostlb-allocator created",
        ] {
            assert!(out.contains(object), "{object} missing:\n{out}");
        }
        let (ok, out, err) = k.run(&["apply", "-k", deploy.to_str().unwrap(), k.validate]);
        assert!(ok, "{err}");
        assert!(
            !out.contains("created"),
            "a second apply created again:\n{out}"
        );

        let out = k.ok(&[
            "explain",
            "l2advertisements.spec.preferredNodeSelectors.weight",
        ]);
        assert!(out.contains("KIND:       L2Advertisement"), "{out}");
        assert!(out.contains("FIELD: weight <integer>"), "{out}");
        let out = k.ok(&["explain", "ipaddresspools.spec"]);
        assert!(out.contains("addresses\t<[]string> -required-"), "{out}");
        let out = k.ok(&["explain", "services.spec.externalTrafficPolicy"]);
        assert!(
            out.contains("FIELD: externalTrafficPolicy <string>"),
            "{out}"
        );
        let out = k.ok(&["explain", "deployments.spec.replicas"]);
        assert!(out.contains("GROUP:      apps"), "{out}");
    })
    .await
    .unwrap();
}
