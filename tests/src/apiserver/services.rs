//! What the real API server fills in on a Service, so clients see the shape
//! they see on a cluster: type, IP families and policy (from the cluster's
//! service families), cluster IPs, node ports, traffic policies. Values
//! allocated once are kept on update, as the real server keeps them.

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

use serde_json::{Value, json};

use super::error::Cause;

/// The cluster's service networks and the next free values in them.
#[derive(Clone, Debug)]
pub struct ServiceNetwork {
    /// `IPv4`, `IPv6` or both, primary first: a dual-stack cluster serves both.
    pub families: Vec<String>,
    next_ip: [u32; 2],
    next_node_port: u32,
}

impl Default for ServiceNetwork {
    fn default() -> Self {
        ServiceNetwork {
            families: vec!["IPv4".into(), "IPv6".into()],
            // 10.96.0.1 and fd00:96::1 are the `kubernetes` Service's.
            next_ip: [16, 16],
            next_node_port: 30000,
        }
    }
}

fn family_of(ip: &str) -> Option<&'static str> {
    match ip.parse::<IpAddr>().ok()? {
        IpAddr::V4(_) => Some("IPv4"),
        IpAddr::V6(_) => Some("IPv6"),
    }
}

fn invalid(field: &str, value: &Value, message: &str) -> Cause {
    Cause {
        reason: "FieldValueInvalid",
        field: field.into(),
        message: format!("Invalid value: {value}: {message}"),
    }
}

impl ServiceNetwork {
    fn allocate_ip(&mut self, family: &str) -> String {
        if family == "IPv4" {
            let n = self.next_ip[0];
            self.next_ip[0] += 1;
            Ipv4Addr::from(u32::from(Ipv4Addr::new(10, 96, 0, 0)) + n).to_string()
        } else {
            let n = self.next_ip[1];
            self.next_ip[1] += 1;
            Ipv6Addr::from(
                u128::from("fd00:96::".parse::<Ipv6Addr>().expect("literal")) + n as u128,
            )
            .to_string()
        }
    }

    fn allocate_node_port(&mut self) -> u32 {
        let p = self.next_node_port;
        self.next_node_port = if p >= 32767 { 30000 } else { p + 1 };
        p
    }

    /// Fill in a Service's spec on create (`old` is None) or update.
    pub fn fill_in(&mut self, obj: &mut Value, old: Option<&Value>) -> Result<(), Vec<Cause>> {
        let old_spec = old
            .and_then(|o| o.get("spec"))
            .cloned()
            .unwrap_or(json!({}));
        if !obj.get("spec").is_some_and(Value::is_object) {
            obj["spec"] = json!({});
        }
        let spec = obj["spec"].as_object_mut().expect("made an object");
        let ty = spec
            .get("type")
            .and_then(Value::as_str)
            .unwrap_or("ClusterIP")
            .to_string();
        spec.insert("type".into(), json!(ty));
        if ty == "ExternalName" {
            return Ok(());
        }
        spec.entry("sessionAffinity").or_insert(json!("None"));
        spec.entry("internalTrafficPolicy")
            .or_insert(json!("Cluster"));
        let external = ty == "NodePort" || ty == "LoadBalancer";
        if external {
            spec.entry("externalTrafficPolicy")
                .or_insert(json!("Cluster"));
        }
        if ty == "LoadBalancer" {
            spec.entry("allocateLoadBalancerNodePorts")
                .or_insert(json!(true));
        }
        // Omitted on update: the allocated values stay.
        for k in ["clusterIP", "clusterIPs", "ipFamilies", "ipFamilyPolicy"] {
            if !spec.contains_key(k)
                && let Some(v) = old_spec.get(k)
            {
                spec.insert(k.into(), v.clone());
            }
        }
        let mut causes = Vec::new();
        if let (Some(was), Some(now)) = (old_spec.get("clusterIP"), spec.get("clusterIP"))
            && was != now
        {
            causes.push(invalid("spec.clusterIPs[0]", now, "field is immutable"));
        }

        // Node ports: kept for the same port and protocol, else allocated.
        let node_ports = external
            && spec
                .get("allocateLoadBalancerNodePorts")
                .and_then(Value::as_bool)
                .unwrap_or(true);
        let old_ports = old_spec
            .get("ports")
            .and_then(Value::as_array)
            .cloned()
            .unwrap_or_default();
        let mut ports = spec
            .get("ports")
            .and_then(Value::as_array)
            .cloned()
            .unwrap_or_default();
        for p in ports.iter_mut().filter(|p| p.is_object()) {
            if p.get("protocol").is_none() {
                p["protocol"] = json!("TCP");
            }
            if p.get("targetPort").is_none()
                && let Some(port) = p.get("port").cloned()
            {
                p["targetPort"] = port;
            }
            if node_ports && p.get("nodePort").is_none() {
                let kept = old_ports.iter().find_map(|o| {
                    (o.get("port") == p.get("port") && o.get("protocol") == p.get("protocol"))
                        .then(|| o.get("nodePort").cloned())
                        .flatten()
                });
                p["nodePort"] = kept.unwrap_or_else(|| json!(self.allocate_node_port()));
            }
        }
        if spec.contains_key("ports") {
            spec.insert("ports".into(), Value::Array(ports));
        }

        // IP families and policy, as the real server infers them.
        let given: Vec<Value> = spec
            .get("ipFamilies")
            .and_then(Value::as_array)
            .cloned()
            .unwrap_or_default();
        let mut families: Vec<String> = Vec::new();
        for (i, f) in given.iter().enumerate() {
            let field = format!("spec.ipFamilies[{i}]");
            match f.as_str() {
                Some(s @ ("IPv4" | "IPv6")) if families.iter().any(|x| x == s) => {
                    causes.push(Cause {
                        reason: "FieldValueDuplicate",
                        field,
                        message: format!("Duplicate value: {f}"),
                    })
                }
                Some(s @ ("IPv4" | "IPv6")) if !self.families.iter().any(|x| x == s) => {
                    causes.push(invalid(&field, f, "not configured on this cluster"))
                }
                Some(s @ ("IPv4" | "IPv6")) => families.push(s.to_string()),
                _ => causes.push(Cause {
                    reason: "FieldValueNotSupported",
                    field,
                    message: format!(
                        "Unsupported value: {f}: supported values: \"IPv4\", \"IPv6\""
                    ),
                }),
            }
        }
        let given_ips: Vec<String> = spec
            .get("clusterIPs")
            .and_then(Value::as_array)
            .map(|a| {
                a.iter()
                    .filter_map(|v| v.as_str().map(String::from))
                    .collect()
            })
            .or_else(|| {
                spec.get("clusterIP")
                    .and_then(Value::as_str)
                    .filter(|s| !s.is_empty())
                    .map(|s| vec![s.to_string()])
            })
            .unwrap_or_default();
        let headless = given_ips.first().is_some_and(|ip| ip == "None");
        let policy = match spec.get("ipFamilyPolicy") {
            None | Some(Value::Null) if given.len() == 2 || given_ips.len() == 2 => {
                "RequireDualStack".to_string()
            }
            None | Some(Value::Null) => "SingleStack".to_string(),
            Some(v) => match v.as_str() {
                Some(s @ ("SingleStack" | "PreferDualStack" | "RequireDualStack")) => s.to_string(),
                _ => {
                    causes.push(Cause {
                        reason: "FieldValueNotSupported",
                        field: "spec.ipFamilyPolicy".into(),
                        message: format!("Unsupported value: {v}: supported values: \"PreferDualStack\", \"RequireDualStack\", \"SingleStack\""),
                    });
                    "SingleStack".to_string()
                }
            },
        };
        let dual = self.families.len() == 2;
        if policy == "RequireDualStack" && !dual {
            causes.push(invalid(
                "spec.ipFamilyPolicy",
                &json!(policy),
                "this cluster is not configured for dual-stack services",
            ));
        }
        if policy == "SingleStack" && given.len() > 1 {
            causes.push(invalid(
                "spec.ipFamilies",
                &json!(given),
                "when spec.ipFamilyPolicy is SingleStack, only one family may be given",
            ));
        }
        if !causes.is_empty() {
            return Err(causes);
        }
        if families.is_empty() {
            let primary = given_ips
                .first()
                .and_then(|ip| family_of(ip))
                .map(str::to_string)
                .unwrap_or_else(|| self.families[0].clone());
            families.push(primary);
        }
        if policy != "SingleStack" && dual && families.len() == 1 {
            let other = if families[0] == "IPv4" {
                "IPv6"
            } else {
                "IPv4"
            };
            families.push(other.to_string());
        }
        spec.insert("ipFamilyPolicy".into(), json!(policy));
        spec.insert("ipFamilies".into(), json!(families));

        let ips: Vec<String> = if headless {
            vec!["None".to_string()]
        } else {
            families
                .iter()
                .enumerate()
                .map(|(i, f)| match given_ips.get(i) {
                    Some(ip) => ip.clone(),
                    None => self.allocate_ip(f),
                })
                .collect()
        };
        spec.insert("clusterIP".into(), json!(ips[0]));
        spec.insert("clusterIPs".into(), json!(ips));
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn defaulted(net: &mut ServiceNetwork, spec: Value) -> Result<Value, Vec<Cause>> {
        let mut obj = json!({"spec": spec});
        net.fill_in(&mut obj, None)?;
        Ok(obj["spec"].clone())
    }

    #[test]
    fn a_load_balancer_gets_what_the_real_server_fills_in() {
        let mut net = ServiceNetwork::default();
        let s = defaulted(
            &mut net,
            json!({"type": "LoadBalancer", "ports": [{"port": 80}]}),
        )
        .unwrap();
        assert_eq!(s["ipFamilyPolicy"], "SingleStack");
        assert_eq!(s["ipFamilies"], json!(["IPv4"]));
        assert_eq!(s["clusterIPs"], json!(["10.96.0.16"]));
        assert_eq!(s["clusterIP"], "10.96.0.16");
        assert_eq!(
            s["ports"],
            json!([{"port": 80, "protocol": "TCP", "targetPort": 80, "nodePort": 30000}])
        );
        assert_eq!(s["externalTrafficPolicy"], "Cluster");
        assert_eq!(s["allocateLoadBalancerNodePorts"], true);
    }

    #[test]
    fn families_follow_the_policy_and_the_cluster() {
        let mut net = ServiceNetwork::default();
        let s = defaulted(&mut net, json!({"ipFamilyPolicy": "PreferDualStack"})).unwrap();
        assert_eq!(s["ipFamilies"], json!(["IPv4", "IPv6"]));
        assert_eq!(s["clusterIPs"], json!(["10.96.0.16", "fd00:96::10"]));
        let s = defaulted(&mut net, json!({"ipFamilies": ["IPv6", "IPv4"]})).unwrap();
        assert_eq!(s["ipFamilyPolicy"], "RequireDualStack");
        assert_eq!(s["clusterIPs"], json!(["fd00:96::11", "10.96.0.17"]));
        let s = defaulted(&mut net, json!({"clusterIP": "None"})).unwrap();
        assert_eq!(s["clusterIPs"], json!(["None"]));

        net.families = vec!["IPv4".into()];
        let s = defaulted(&mut net, json!({"ipFamilyPolicy": "PreferDualStack"})).unwrap();
        assert_eq!(s["ipFamilies"], json!(["IPv4"]));
        let e = defaulted(&mut net, json!({"ipFamilyPolicy": "RequireDualStack"})).unwrap_err();
        assert_eq!(e[0].field, "spec.ipFamilyPolicy");
        let e = defaulted(&mut net, json!({"ipFamilies": ["IPv6"]})).unwrap_err();
        assert_eq!(
            e[0].message,
            "Invalid value: \"IPv6\": not configured on this cluster"
        );
    }

    #[test]
    fn allocated_values_are_kept_on_update() {
        let mut net = ServiceNetwork::default();
        let mut old = json!({"spec": {"type": "LoadBalancer", "ports": [{"port": 80}]}});
        net.fill_in(&mut old, None).unwrap();
        let mut new =
            json!({"spec": {"type": "LoadBalancer", "ports": [{"port": 80}, {"port": 443}]}});
        net.fill_in(&mut new, Some(&old)).unwrap();
        assert_eq!(new["spec"]["clusterIP"], old["spec"]["clusterIP"]);
        assert_eq!(new["spec"]["ports"][0]["nodePort"], 30000);
        assert_eq!(new["spec"]["ports"][1]["nodePort"], 30001);
        let mut moved = json!({"spec": {"clusterIP": "10.96.9.9"}});
        let e = net.fill_in(&mut moved, Some(&old)).unwrap_err();
        assert_eq!(e[0].field, "spec.clusterIPs[0]");
    }
}
