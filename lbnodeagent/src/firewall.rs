//! The agent's firewall in the kernel: one nftables table, `inet hostlb`,
//! which the core's [`FirewallPlan`] replaces whole.
//!
//! Written through the `nft` binary: it is nftables' own implementation of
//! the netlink protocol, every distribution ships it with the kernel's
//! firewall, and one `nft -f -` of a script that deletes and recreates the
//! table is one kernel transaction, so no packet ever sees half a rule
//! set. The crates that speak nftables over netlink themselves are young
//! or bind the C libraries; the binary needs no more capability than the
//! agent has (CAP_NET_ADMIN, inherited as an ambient capability).
//!
//! The table hooks `prerouting` just before NAT (`dstnat - 10`, after
//! conntrack), so it judges a packet by the VIP it was sent to: kube-proxy
//! (iptables mode, NodePorts on every local address) and CNI portmap
//! (hostPorts) rewrite the destination in `prerouting` at `dstnat`, and a
//! guard in `input` would see their traffic only with its new destination,
//! so `VIP:NODEPORT` reached a NodePort backend. The Service's own ports
//! are open, so what kube-proxy does for them goes on. What the host sends
//! itself (over `lo`) is its own business and passes.

use std::fmt::Write as _;
use std::net::IpAddr;
use std::process::Stdio;
use std::time::Duration;

use tokio::io::AsyncWriteExt;

use crate::model::{Firewall, FirewallPlan};

/// The table's family and name, as `nft` spells them.
pub const TABLE: &str = "inet hostlb";
/// An `nft` run that takes longer is stopped and counted as failed.
pub const NFT_TIMEOUT: Duration = Duration::from_secs(20);

#[derive(Debug, thiserror::Error)]
pub enum FirewallError {
    #[error("cannot run nft: {0} (install the nftables package, or set firewall.enabled = false)")]
    Spawn(std::io::Error),
    #[error("nft refused the rule set: {0}")]
    Refused(String),
    #[error("nft did not finish within {NFT_TIMEOUT:?}")]
    Timeout,
}

/// The whole table as one `nft -f` transaction: created if missing (so the
/// delete cannot fail), deleted, and, when on, written again.
pub fn script(plan: &FirewallPlan) -> String {
    let mut s = format!("table {TABLE}\ndelete table {TABLE}\n");
    if let FirewallPlan::On(f) = plan {
        render(f, &mut s);
    }
    s
}

fn render(f: &Firewall, s: &mut String) {
    let v4 = |ip: &&IpAddr| ip.is_ipv4();
    let v6 = |ip: &&IpAddr| ip.is_ipv6();
    let _ = writeln!(s, "table {TABLE} {{");
    set(s, "vips4", "ipv4_addr", f.vips.iter().filter(v4));
    set(s, "vips6", "ipv6_addr", f.vips.iter().filter(v6));
    let open = |v6: bool| {
        f.open
            .iter()
            .filter(move |(ip, _)| ip.is_ipv6() == v6)
            .map(|(ip, p)| format!("{ip} . {} . {}", p.protocol.as_str(), p.port))
    };
    set(
        s,
        "open4",
        "ipv4_addr . inet_proto . inet_service",
        open(false),
    );
    set(
        s,
        "open6",
        "ipv6_addr . inet_proto . inet_service",
        open(true),
    );
    s.push_str(
        "\tchain prerouting {\n\
         \t\ttype filter hook prerouting priority dstnat - 10; policy accept;\n\
         \t\tiifname \"lo\" accept\n\
         \t\tip daddr @vips4 jump vip4\n\
         \t\tip6 daddr @vips6 jump vip6\n\
         \t}\n\
         \tchain vip4 {\n\
         \t\tct state established,related accept\n\
         \t\tmeta l4proto icmp accept\n\
         \t\tip daddr . meta l4proto . th dport @open4 accept\n\
         \t\tcounter drop\n\
         \t}\n\
         \tchain vip6 {\n\
         \t\tct state established,related accept\n\
         \t\tmeta l4proto ipv6-icmp accept\n\
         \t\tip6 daddr . meta l4proto . th dport @open6 accept\n\
         \t\tcounter drop\n\
         \t}\n\
         }\n",
    );
}

fn set<T: std::fmt::Display>(
    s: &mut String,
    name: &str,
    kind: &str,
    elements: impl Iterator<Item = T>,
) {
    let _ = write!(s, "\tset {name} {{\n\t\ttype {kind}\n");
    let mut first = true;
    for e in elements {
        s.push_str(if first {
            "\t\telements = { "
        } else {
            ",\n\t\t\t"
        });
        first = false;
        let _ = write!(s, "{e}");
    }
    if !first {
        s.push_str(" }\n");
    }
    s.push_str("\t}\n");
}

/// The `nft` program on a `PATH`, if any: what `lbnodeagent check` looks
/// for before the agent needs it.
pub fn nft_in(path: &std::ffi::OsStr) -> Option<std::path::PathBuf> {
    use std::os::unix::fs::PermissionsExt as _;
    std::env::split_paths(path)
        .map(|dir| dir.join("nft"))
        .find(|p| {
            std::fs::metadata(p).is_ok_and(|m| m.is_file() && m.permissions().mode() & 0o111 != 0)
        })
}

/// Puts `plan` in force.
pub async fn apply(plan: &FirewallPlan) -> Result<(), FirewallError> {
    let script = script(plan);
    let run = async {
        let mut child = tokio::process::Command::new("nft")
            .args(["-f", "-"])
            .stdin(Stdio::piped())
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .kill_on_drop(true)
            .spawn()
            .map_err(FirewallError::Spawn)?;
        let mut stdin = child.stdin.take().expect("piped");
        stdin
            .write_all(script.as_bytes())
            .await
            .map_err(FirewallError::Spawn)?;
        drop(stdin);
        let out = child
            .wait_with_output()
            .await
            .map_err(FirewallError::Spawn)?;
        if out.status.success() {
            Ok(())
        } else {
            Err(FirewallError::Refused(
                String::from_utf8_lossy(&out.stderr).trim().to_string(),
            ))
        }
    };
    tokio::time::timeout(NFT_TIMEOUT, run)
        .await
        .unwrap_or(Err(FirewallError::Timeout))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::election::{Protocol, ServicePort};

    #[test]
    fn nft_is_found_only_where_it_is() {
        let dir = tempfile::tempdir().unwrap();
        let path = std::env::join_paths([dir.path()]).unwrap();
        assert_eq!(nft_in(&path), None);
        let nft = dir.path().join("nft");
        std::fs::write(&nft, "#!/bin/sh\n").unwrap();
        assert_eq!(nft_in(&path), None, "not executable");
        use std::os::unix::fs::PermissionsExt as _;
        std::fs::set_permissions(&nft, std::fs::Permissions::from_mode(0o755)).unwrap();
        assert_eq!(nft_in(&path), Some(nft));
    }

    #[test]
    fn the_script_replaces_the_whole_table_in_one_go() {
        let v4: IpAddr = "10.0.1.1".parse().unwrap();
        let v6: IpAddr = "fd00::1:1".parse().unwrap();
        let closed: IpAddr = "10.0.1.2".parse().unwrap();
        let tcp80 = ServicePort {
            protocol: Protocol::Tcp,
            port: 80,
        };
        let udp53 = ServicePort {
            protocol: Protocol::Udp,
            port: 53,
        };
        let f = Firewall {
            vips: [v4, v6, closed].into(),
            open: [(v4, tcp80), (v4, udp53), (v6, tcp80)].into(),
        };
        let s = script(&FirewallPlan::On(f));
        assert!(
            s.starts_with("table inet hostlb\ndelete table inet hostlb\ntable inet hostlb {\n"),
            "{s}"
        );
        assert!(
            s.contains(
                "set vips4 {\n\t\ttype ipv4_addr\n\t\telements = { 10.0.1.1,\n\t\t\t10.0.1.2 }\n\t}"
            ),
            "{s}"
        );
        assert!(
            s.contains("elements = { 10.0.1.1 . tcp . 80,\n\t\t\t10.0.1.1 . udp . 53 }"),
            "{s}"
        );
        assert!(s.contains("elements = { fd00::1:1 . tcp . 80 }"), "{s}");
        assert!(
            s.contains("policy accept;\n\t\tiifname \"lo\" accept\n\t\tip daddr @vips4 jump vip4"),
            "the host's own traffic passes: {s}"
        );
        assert_eq!(
            script(&FirewallPlan::Off),
            "table inet hostlb\ndelete table inet hostlb\n"
        );
        let empty = script(&FirewallPlan::On(Firewall::default()));
        assert!(
            empty.contains("set open6 {\n\t\ttype ipv6_addr . inet_proto . inet_service\n\t}"),
            "an empty set has no elements line: {empty}"
        );
    }
}
