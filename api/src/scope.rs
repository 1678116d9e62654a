//! Which objects belong to this hostlb installation: the namespace holding
//! pools and advertisements, and the Services hostlb handles. The allocator
//! and the agent must agree on both, so both use this.

use k8s_openapi::api::core::v1::Service;

use crate::annotations::{DEFAULT_LOAD_BALANCER_CLASS, SYSTEM_NAMESPACE};

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Scope {
    /// Pools and advertisements are read from this namespace only.
    pub namespace: String,
    /// Services with this `spec.loadBalancerClass`, or none, are handled.
    pub load_balancer_class: String,
}

impl Default for Scope {
    fn default() -> Self {
        Scope {
            namespace: SYSTEM_NAMESPACE.to_string(),
            load_balancer_class: DEFAULT_LOAD_BALANCER_CLASS.to_string(),
        }
    }
}

impl Scope {
    /// `type: LoadBalancer` with no class or our class.
    pub fn handles(&self, svc: &Service) -> bool {
        let Some(spec) = &svc.spec else { return false };
        spec.type_.as_deref() == Some("LoadBalancer")
            && self.takes_class(spec.load_balancer_class.as_deref())
    }

    /// Whether a LoadBalancer Service of `class` is ours: no class, or
    /// ours (for records that keep the class alone).
    pub fn takes_class(&self, class: Option<&str>) -> bool {
        class.is_none_or(|c| c == self.load_balancer_class)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn svc(t: &str, class: Option<&str>) -> Service {
        let mut spec = serde_json::json!({"type": t});
        if let Some(c) = class {
            spec["loadBalancerClass"] = serde_json::json!(c);
        }
        serde_json::from_value(serde_json::json!({"metadata": {"name": "s"}, "spec": spec}))
            .unwrap()
    }

    #[test]
    fn handled_services() {
        let scope = Scope::default();
        assert!(scope.handles(&svc("LoadBalancer", None)));
        assert!(scope.handles(&svc("LoadBalancer", Some("hostlb.io/lb"))));
        assert!(!scope.handles(&svc("LoadBalancer", Some("other.io/lb"))));
        assert!(!scope.handles(&svc("ClusterIP", None)));
        assert!(!scope.handles(
            &serde_json::from_value(serde_json::json!({"metadata": {"name": "s"}})).unwrap()
        ));
    }
}
