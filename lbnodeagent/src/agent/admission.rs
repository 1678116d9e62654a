//! Whether the Service policy is in force for this agent's credential,
//! checked rather than assumed.
//!
//! RBAC lets every agent patch Services; only the ValidatingAdmissionPolicy
//! of `deploy/agent/policy.yaml` confines those patches to the
//! `hostlb.io/announcing-*` annotations. On a cluster where it is missing,
//! or not enforced (Kubernetes 1.28 and 1.29 without the feature gate: the
//! objects apply and nothing happens), one host's credential can rewrite
//! any Service's selector. So the agent asks the API server: a
//! server-side dry run of a patch the policy refuses (a label on an
//! existing Service), under its own identity. Refused by the policy: in
//! force. Accepted: not, and the agent says so (log, `/readyz`, its
//! record's `Degraded`). Nothing is written either way.

use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;

use k8s_openapi::api::core::v1::Service;
use kube::api::{Patch, PatchParams};
use kube::{Api, Client};
use tracing::{debug, error, info, warn};

use super::report::FIELD_MANAGER;
use super::telemetry::Telemetry;
use super::watches::ServiceRecords;

/// The label the dry run would set; never written.
pub const PROBE_LABEL: &str = "hostlb.io/policy-probe";
/// How often the policy is checked again once known: a policy deleted
/// later is seen within this.
const AGAIN: Duration = Duration::from_secs(600);
/// How often while it cannot be known (the server away).
const RETRY: Duration = Duration::from_secs(15);
/// How often the Services are looked at until there is one to try on.
const NO_SERVICE_YET: Duration = Duration::from_secs(2);

/// What the dry run said.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Policy {
    /// The policy refused the patch.
    InForce,
    /// The server would have taken the patch: any Service can be
    /// rewritten with this credential.
    NotInForce,
    /// RBAC does not let this credential patch Services at all (so it
    /// cannot rewrite them either, nor write its annotations).
    NoPatchRight(String),
    /// No answer that says (the server away, no Service to try on).
    Unknown(String),
}

/// The policy's refusals name what a node agent may change; RBAC's and
/// others' do not.
const POLICY_WORDS: &str = "a node agent may change only";

/// Judges the dry run's answer.
pub fn judge(answer: &Result<(), kube::Error>) -> Policy {
    match answer {
        Ok(()) => Policy::NotInForce,
        Err(kube::Error::Api(s)) if s.message.contains(POLICY_WORDS) => Policy::InForce,
        Err(kube::Error::Api(s)) if s.code == 403 => Policy::NoPatchRight(s.message.clone()),
        Err(e) => Policy::Unknown(e.to_string()),
    }
}

/// The patch the policy refuses, as a dry run: a label on the Service.
pub async fn dry_run(client: &Client, namespace: &str, name: &str) -> Result<(), kube::Error> {
    let api: Api<Service> = Api::namespaced(client.clone(), namespace);
    let params = PatchParams {
        dry_run: true,
        field_manager: Some(FIELD_MANAGER.into()),
        ..PatchParams::default()
    };
    let patch = serde_json::json!({"metadata": {"labels": {PROBE_LABEL: "dry-run"}}});
    api.patch(name, &params, &Patch::Merge(&patch))
        .await
        .map(drop)
}

/// Checks the policy once a Service is known, and again every [`AGAIN`];
/// tells the telemetry, which makes the record `Degraded` while it is not
/// in force.
pub(super) fn start(
    client: Client,
    services: ServiceRecords,
    telemetry: Arc<Telemetry>,
) -> tokio::task::JoinHandle<()> {
    tokio::spawn(async move {
        let mut last: Option<Policy> = None;
        loop {
            let Some((ns, name)) = services.any() else {
                tokio::time::sleep(NO_SERVICE_YET).await;
                continue;
            };
            let policy = judge(&dry_run(&client, &ns, &name).await);
            telemetry
                .policy_open
                .store(policy == Policy::NotInForce, Ordering::Relaxed);
            if last.as_ref() != Some(&policy) {
                match &policy {
                    Policy::InForce => info!(
                        "the Service policy is in force: this agent's credential changes only the announcing annotations of Services"
                    ),
                    Policy::NotInForce => error!(
                        "the Service policy is not in force: this agent's credential can rewrite any Service (its selector, its externalIPs); apply deploy/agent/policy.yaml (policy-v1beta1.yaml on Kubernetes 1.28 and 1.29, with the ValidatingAdmissionPolicy feature gate and API on)"
                    ),
                    Policy::NoPatchRight(why) => warn!(
                        reason = %why,
                        "this agent may not patch Services: it cannot write their announcing annotations (check deploy/agent/rbac.yaml)"
                    ),
                    Policy::Unknown(why) => {
                        debug!(reason = %why, "cannot tell yet whether the Service policy is in force")
                    }
                }
            }
            let wait = match policy {
                Policy::Unknown(_) => RETRY,
                _ => AGAIN,
            };
            last = Some(policy);
            tokio::time::sleep(wait).await;
        }
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn refused(code: u16, message: &str) -> Result<(), kube::Error> {
        Err(kube::Error::Api(Box::new(
            kube::core::Status::failure(message, "").with_code(code),
        )))
    }

    #[test]
    fn only_the_policys_refusal_means_it_is_in_force() {
        assert_eq!(judge(&Ok(())), Policy::NotInForce);
        assert_eq!(
            judge(&refused(
                422,
                "services \"web\" is forbidden: ValidatingAdmissionPolicy 'hostlb-agent-services' with binding 'hostlb-agent-services' denied request: a node agent may change only the hostlb.io/announcing-* annotations of a Service, not its labels"
            )),
            Policy::InForce
        );
        assert!(matches!(
            judge(&refused(
                403,
                "services \"web\" is forbidden: User \"x\" cannot patch resource"
            )),
            Policy::NoPatchRight(_)
        ));
        assert!(matches!(
            judge(&refused(500, "etcdserver: request timed out")),
            Policy::Unknown(_)
        ));
    }
}
