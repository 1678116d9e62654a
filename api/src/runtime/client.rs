//! The Kubernetes client both binaries use: from a kubeconfig file (the
//! agent on a host, the allocator run by hand) or from the pod's service
//! account, with a User-Agent that names the program, its build and the
//! instance, so audit logs tell one node or replica from another.

use std::path::{Path, PathBuf};

/// A kubeconfig that cannot be used, or no cluster to be found.
#[derive(Debug, thiserror::Error)]
pub enum ClientError {
    #[error("kubeconfig {}: {message}", path.display())]
    Kubeconfig { path: PathBuf, message: String },
    #[error("finding the cluster (in-cluster or ~/.kube/config): {0}")]
    Infer(String),
    #[error("building the Kubernetes client: {0}")]
    Build(String),
}

/// `hostlb-PROGRAM/VERSION (INSTANCE)`.
pub fn user_agent(program: &str, instance: &str) -> String {
    format!("hostlb-{program}/{} ({instance})", super::VERSION)
}

/// The client configuration: from `kubeconfig`, else inferred (in-cluster,
/// then `~/.kube/config`). The client's own retries of 429/503/504 are
/// off: they back off for minutes per request, during which watches look
/// healthy and a lost Lease's write can still land. Both binaries retry
/// themselves, and say so.
pub async fn config(
    kubeconfig: Option<&Path>,
    program: &str,
    instance: &str,
) -> Result<kube::Config, ClientError> {
    let mut config = match kubeconfig {
        Some(path) => {
            let bad = |message: String| ClientError::Kubeconfig {
                path: path.to_path_buf(),
                message,
            };
            let kc = kube::config::Kubeconfig::read_from(path).map_err(|e| bad(e.to_string()))?;
            kube::Config::from_custom_kubeconfig(kc, &Default::default())
                .await
                .map_err(|e| bad(e.to_string()))?
        }
        None => kube::Config::infer()
            .await
            .map_err(|e| ClientError::Infer(e.to_string()))?,
    };
    prepare(&mut config, program, instance);
    Ok(config)
}

/// Names the program and instance in every request and turns the
/// client's own retries off, on a configuration made elsewhere (a test's).
pub fn prepare(config: &mut kube::Config, program: &str, instance: &str) {
    config.default_retry = false;
    if let Ok(v) = http::HeaderValue::from_str(&user_agent(program, instance)) {
        config.headers.push((http::header::USER_AGENT, v));
    }
}

/// The client, and the API server's URL (for log lines).
pub async fn client(
    kubeconfig: Option<&Path>,
    program: &str,
    instance: &str,
) -> Result<(kube::Client, String), ClientError> {
    let config = config(kubeconfig, program, instance).await?;
    let server = config.cluster_url.to_string();
    let client = kube::Client::try_from(config).map_err(|e| match kubeconfig {
        Some(path) => ClientError::Kubeconfig {
            path: path.to_path_buf(),
            message: e.to_string(),
        },
        None => ClientError::Build(e.to_string()),
    })?;
    Ok((client, server))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_user_agent_names_program_build_and_instance() {
        let ua = user_agent("lbnodeagent", "node-3");
        assert!(ua.starts_with("hostlb-lbnodeagent/"), "{ua}");
        assert!(ua.contains(super::super::VERSION), "{ua}");
        assert!(ua.ends_with(" (node-3)"), "{ua}");
        assert!(http::HeaderValue::from_str(&ua).is_ok());
    }

    #[tokio::test]
    async fn a_missing_kubeconfig_names_its_path() {
        let e = config(Some(Path::new("/nonexistent/kubeconfig")), "x", "y")
            .await
            .unwrap_err();
        assert!(e.to_string().contains("/nonexistent/kubeconfig"), "{e}");
    }

    #[tokio::test]
    async fn the_config_carries_the_user_agent_and_no_retries() {
        let dir = std::env::temp_dir().join(format!("hostlb-client-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("kubeconfig");
        std::fs::write(
            &path,
            "apiVersion: v1\nkind: Config\nclusters:\n- name: c\n  cluster:\n    server: https://10.0.0.1:6443\n\
             users:\n- name: u\n  user:\n    token: t\ncontexts:\n- name: x\n  context:\n    cluster: c\n    user: u\n\
             current-context: x\n",
        )
        .unwrap();
        let c = config(Some(&path), "allocator", "pod-1").await.unwrap();
        std::fs::remove_dir_all(&dir).unwrap();
        assert!(!c.default_retry);
        assert_eq!(c.cluster_url.to_string(), "https://10.0.0.1:6443/");
        let ua = c
            .headers
            .iter()
            .find(|(k, _)| k == http::header::USER_AGENT)
            .map(|(_, v)| v.to_str().unwrap().to_string());
        assert_eq!(ua, Some(user_agent("allocator", "pod-1")));
    }
}
