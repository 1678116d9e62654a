//! Whether the host would answer ARP for a VIP on a network it does not
//! belong to.
//!
//! Linux answers an ARP request for any of its addresses on any interface
//! (`arp_ignore=0`, the default), and may use any of its addresses as the
//! sender of its own ARP requests (`arp_announce=0`). With every VIP on the
//! default-route interface that is harmless. Once advertisements put VIPs
//! on another interface (a VLAN, a second network), a VIP meant for one
//! network is also claimed on the other by whichever host holds it: a
//! client there sends it to the wrong host. `arp_ignore=1` answers only for
//! addresses of the interface the request came in on; `arp_announce=2`
//! takes the sender address from the interface's own. (`arp_filter=1`
//! does not help: the reply's route leads back out of the interface the
//! request came in on.) IPv6 neighbour discovery answers only for
//! addresses of the receiving interface, so it needs nothing.
//!
//! The agent reads these settings and never writes them (the unit keeps
//! `ProtectKernelTunables=yes`): it says what to set. Pure: the shell
//! reads `/proc/sys`, this judges.

use std::collections::{BTreeMap, BTreeSet};
use std::fmt;

/// One interface's settings, or `all`'s.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Sysctls {
    pub arp_ignore: u8,
    pub arp_announce: u8,
}

/// An interface that would answer for, or announce, VIPs held on others.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Exposure {
    pub interface: String,
    /// The interfaces whose VIPs it exposes.
    pub vips_on: Vec<String>,
    /// The settings in force there (the larger of `all` and its own).
    pub in_force: Sysctls,
}

impl fmt::Display for Exposure {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let mut set = Vec::new();
        if self.in_force.arp_ignore < 1 {
            set.push(format!(
                "answers ARP for the VIPs on {} (arp_ignore={}; set net.ipv4.conf.all.arp_ignore=1)",
                self.vips_on.join(", "),
                self.in_force.arp_ignore
            ));
        }
        if self.in_force.arp_announce < 2 {
            set.push(format!(
                "may announce them as the sender of its ARP requests (arp_announce={}; set net.ipv4.conf.all.arp_announce=2)",
                self.in_force.arp_announce
            ));
        }
        write!(f, "{} {}", self.interface, set.join(" and "))
    }
}

/// The interfaces that expose VIPs of others. `held_on`: the interfaces
/// that hold IPv4 VIPs here; `announce`: the default-route interface;
/// `links`: the Ethernet interfaces with carrier, other than the virtual
/// one. Checked only once VIPs sit on an interface other than the default
/// one, or on more than one: until then every VIP shares the default
/// interface with the host's own address, which Linux exposes the same way.
pub fn exposures(
    held_on: &BTreeSet<String>,
    announce: Option<&str>,
    links: &[String],
    all: Sysctls,
    by_interface: &BTreeMap<String, Sysctls>,
) -> Vec<Exposure> {
    let only_default = held_on.len() <= 1 && held_on.iter().all(|i| Some(i.as_str()) == announce);
    if held_on.is_empty() || only_default {
        return Vec::new();
    }
    links
        .iter()
        .filter_map(|link| {
            let own = by_interface.get(link).copied().unwrap_or_default();
            let in_force = Sysctls {
                arp_ignore: own.arp_ignore.max(all.arp_ignore),
                arp_announce: own.arp_announce.max(all.arp_announce),
            };
            let vips_on: Vec<String> = held_on.iter().filter(|i| *i != link).cloned().collect();
            (!vips_on.is_empty() && (in_force.arp_ignore < 1 || in_force.arp_announce < 2)).then(
                || Exposure {
                    interface: link.clone(),
                    vips_on,
                    in_force,
                },
            )
        })
        .collect()
}

/// Reads `net.ipv4.conf.NAME.arp_ignore` and `arp_announce`; `None` when
/// the interface has no such directory (gone, or not IPv4).
pub fn read(name: &str) -> Option<Sysctls> {
    let get = |key: &str| -> Option<u8> {
        std::fs::read_to_string(format!("/proc/sys/net/ipv4/conf/{name}/{key}"))
            .ok()?
            .trim()
            .parse()
            .ok()
    };
    Some(Sysctls {
        arp_ignore: get("arp_ignore")?,
        arp_announce: get("arp_announce")?,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn set(v: &[&str]) -> BTreeSet<String> {
        v.iter().map(|s| s.to_string()).collect()
    }

    fn links() -> Vec<String> {
        vec!["eth0".into(), "eth1".into()]
    }

    const DEFAULTS: Sysctls = Sysctls {
        arp_ignore: 0,
        arp_announce: 0,
    };
    const SAFE: Sysctls = Sysctls {
        arp_ignore: 1,
        arp_announce: 2,
    };

    #[test]
    fn vips_on_the_default_interface_alone_need_nothing() {
        let none = BTreeMap::new();
        assert!(exposures(&set(&[]), Some("eth0"), &links(), DEFAULTS, &none).is_empty());
        assert!(exposures(&set(&["eth0"]), Some("eth0"), &links(), DEFAULTS, &none).is_empty());
    }

    #[test]
    fn vips_on_a_second_network_are_exposed_on_the_first_at_the_kernels_defaults() {
        let none = BTreeMap::new();
        let x = exposures(
            &set(&["eth0", "eth1"]),
            Some("eth0"),
            &links(),
            DEFAULTS,
            &none,
        );
        assert_eq!(x.len(), 2);
        assert_eq!(x[0].interface, "eth0");
        assert_eq!(x[0].vips_on, vec!["eth1".to_string()]);
        let text = x[0].to_string();
        assert!(
            text.contains("eth0 answers ARP for the VIPs on eth1 (arp_ignore=0; set net.ipv4.conf.all.arp_ignore=1)")
                && text.contains("arp_announce=2"),
            "{text}"
        );
        // Only on the VLAN, not the default interface: still exposed on it.
        let x = exposures(&set(&["eth1"]), Some("eth0"), &links(), DEFAULTS, &none);
        assert_eq!(x.len(), 1);
        assert_eq!(x[0].interface, "eth0");
    }

    /// The larger of `all` and the interface's own is in force, as in the
    /// kernel, for both settings.
    #[test]
    fn the_documented_settings_either_for_all_or_per_interface_close_it() {
        let none = BTreeMap::new();
        let held = set(&["eth0", "eth1"]);
        assert!(exposures(&held, Some("eth0"), &links(), SAFE, &none).is_empty());
        let per: BTreeMap<String, Sysctls> =
            [("eth0".to_string(), SAFE), ("eth1".to_string(), SAFE)].into();
        assert!(exposures(&held, Some("eth0"), &links(), DEFAULTS, &per).is_empty());
        let half: BTreeMap<String, Sysctls> = [("eth0".to_string(), SAFE)].into();
        let x = exposures(&held, Some("eth0"), &links(), DEFAULTS, &half);
        assert_eq!(x.len(), 1);
        assert_eq!(x[0].interface, "eth1");
        let ignore_only = Sysctls {
            arp_ignore: 1,
            arp_announce: 0,
        };
        let x = exposures(&held, Some("eth0"), &links(), ignore_only, &none);
        assert_eq!(x.len(), 2);
        assert!(!x[0].to_string().contains("arp_ignore="), "{}", x[0]);
    }
}
