//! What a node publishes in gossip, and how it is written as chitchat
//! key-values.
//!
//! | key | value |
//! |---|---|
//! | `version` | agent version |
//! | `protocol` | [`PROTOCOL`]: the version of what agents exchange; absent from agents before the key, which speak protocol 1 |
//! | `status` | `starting`, `alive` or `leaving` |
//! | `onlink.v4`, `onlink.v6` | JSON list of `{"if", "prefix", "announce", "nogw"}`; `nogw` (only when `true`): the interface's default gateway of that family stopped answering (see `agent::upstream`) |
//! | `virtual` | `true` / `false` |
//! | `macs` | MACs of the announce interfaces, space-separated (conflict detection names the host behind a MAC) |
//! | `vips.0`, `vips.1`, … | held VIPs, space-separated, sorted, each value ≤ [`VIPS_CHUNK_BYTES`] |
//! | `detector` | `swim`: the node runs the SWIM failure detector (see `detector`); peers without it are judged by chitchat's, so a rolling upgrade keeps every node's view of the others |
//! | `drained` | `true` while the node's operator has drained it, else `false`: it then wins only VIPs no other node can serve |
//! | `revision` | the newest resourceVersion the node's watches have seen: two live nodes that both hold a VIP because their views of the cluster differ let the one with the newer view keep it |
//! | `view` | a digest of what the node's watches hold that the election reads, 16 hex digits: resourceVersions also move on writes that change nothing the election reads (the agents' own annotations), so two nodes whose revisions differ but whose digests agree have the same view |
//! | `behind` | peers the node has found behind its view of the cluster for a hand-over's time, space-separated: a node that came to the same view later (it restarted) takes their orphaned VIPs without waiting for them again |
//! | `vipchunks` | how many `vips.N` keys are in use: set after a chunk is emptied, so a peer hears of it through a key change |
//! | `manifest` | every other key with its version and a hash of its value, signed with the node's own key, set last after every change (see `signed`) |
//!
//! `status` is written last when a node starts. chitchat sends a node's keys
//! in version order, so a peer that has `status` has everything else: a
//! member never shows up half-described. VIPs are split over several keys
//! because chitchat never splits one value, and a value larger than a
//! datagram would never be sent at all. Chunks no longer needed are
//! emptied, never deleted (a tombstone is nothing a node's signed manifest
//! can vouch for; see `signed`), and `vipchunks` is set after them: a
//! delta carries keys in version order, and the peer that applies the new
//! count has applied the emptied chunks before it, and rebuilds its view at
//! once (see `membership`, whose rounds at rest are too far apart to wait
//! for). Decoding is lenient: unknown keys
//! and unparsable entries are skipped, so a newer agent can add to the format
//! without breaking an older one mid-upgrade.

use std::collections::BTreeSet;
use std::net::IpAddr;

use chitchat::NodeState;
use hostlb_api::{Family, Prefix};
use serde::{Deserialize, Serialize};

use crate::election::{NodeName, OnLink};
pub use crate::model::{LocalState, MemberInfo, PROTOCOL, PROTOCOL_UNSAID, Status};

pub const KEY_VERSION: &str = "version";
pub const KEY_PROTOCOL: &str = "protocol";
pub const KEY_STATUS: &str = "status";
pub const KEY_ONLINK_V4: &str = "onlink.v4";
pub const KEY_ONLINK_V6: &str = "onlink.v6";
pub const KEY_VIRTUAL: &str = "virtual";
pub const KEY_MACS: &str = "macs";
pub const KEY_DETECTOR: &str = "detector";
pub const KEY_REVISION: &str = "revision";
pub const KEY_DRAINED: &str = "drained";
pub const KEY_VIEW: &str = "view";
pub const KEY_BEHIND: &str = "behind";
pub const KEY_VIP_CHUNKS: &str = "vipchunks";
pub const DETECTOR_SWIM: &str = "swim";
pub const KEY_VIPS_PREFIX: &str = "vips.";
/// Bound on one `vips.N` value: small against the 64 KiB datagram, large
/// enough that a node with 1 000 IPv4 VIPs needs only a handful of keys.
pub const VIPS_CHUNK_BYTES: usize = 4_000;

#[derive(Serialize, Deserialize)]
struct OnLinkWire {
    #[serde(rename = "if")]
    interface: String,
    prefix: String,
    #[serde(default)]
    announce: bool,
    /// Written only when set: agents from before the field read the rest.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    nogw: bool,
}

fn encode_on_link(on_link: &[OnLink], family: Family) -> String {
    let entries: Vec<OnLinkWire> = on_link
        .iter()
        .filter(|o| o.prefix.family() == family)
        .map(|o| OnLinkWire {
            interface: o.interface.clone(),
            prefix: o.prefix.to_string(),
            announce: o.announce,
            nogw: o.upstream_lost,
        })
        .collect();
    serde_json::to_string(&entries).expect("strings and bools always serialize")
}

fn decode_on_link(text: &str, family: Family, out: &mut Vec<OnLink>) {
    let Ok(entries) = serde_json::from_str::<Vec<OnLinkWire>>(text) else {
        tracing::debug!(value = text, "unparsable on-link list in gossip; ignored");
        return;
    };
    for entry in entries {
        match entry.prefix.parse::<Prefix>() {
            Ok(prefix) if prefix.family() == family => out.push(OnLink {
                prefix,
                interface: entry.interface,
                announce: entry.announce,
                upstream_lost: entry.nogw,
            }),
            _ => tracing::debug!(
                prefix = entry.prefix,
                "bad on-link prefix in gossip; ignored"
            ),
        }
    }
}

/// Sorted VIPs cut into values of at most [`VIPS_CHUNK_BYTES`].
fn vip_chunks(vips: &BTreeSet<IpAddr>) -> Vec<String> {
    let mut chunks = Vec::new();
    let mut current = String::new();
    for ip in vips {
        let text = ip.to_string();
        if !current.is_empty() && current.len() + 1 + text.len() > VIPS_CHUNK_BYTES {
            chunks.push(std::mem::take(&mut current));
        }
        if !current.is_empty() {
            current.push(' ');
        }
        current.push_str(&text);
    }
    if !current.is_empty() {
        chunks.push(current);
    }
    chunks
}

fn vip_key(index: usize) -> String {
    format!("{KEY_VIPS_PREFIX}{index}")
}

/// Key-values for a node that is starting, `status` last (see module doc).
pub fn initial_key_values(agent_version: &str, local: &LocalState) -> Vec<(String, String)> {
    let mut kvs = vec![
        (KEY_VERSION.to_string(), agent_version.to_string()),
        (KEY_PROTOCOL.to_string(), PROTOCOL.to_string()),
        (
            KEY_ONLINK_V4.to_string(),
            encode_on_link(&local.on_link, Family::V4),
        ),
        (
            KEY_ONLINK_V6.to_string(),
            encode_on_link(&local.on_link, Family::V6),
        ),
        (KEY_VIRTUAL.to_string(), local.virtual_mode.to_string()),
        (KEY_MACS.to_string(), spaced(&local.macs)),
        (KEY_DETECTOR.to_string(), DETECTOR_SWIM.to_string()),
        (KEY_REVISION.to_string(), local.revision.to_string()),
        (KEY_VIEW.to_string(), encode_digest(local.digest)),
        (KEY_DRAINED.to_string(), local.drained.to_string()),
        (KEY_BEHIND.to_string(), spaced(&local.behind)),
    ];
    let chunks = vip_chunks(&local.vips);
    let count = chunks.len();
    kvs.extend(
        chunks
            .into_iter()
            .enumerate()
            .map(|(i, chunk)| (vip_key(i), chunk)),
    );
    kvs.push((KEY_VIP_CHUNKS.to_string(), count.to_string()));
    kvs.push((KEY_STATUS.to_string(), local.status.as_str().to_string()));
    kvs
}

/// Writes `local` into our own node state. Unchanged keys are left alone
/// (chitchat's `set` is a no-op for an equal value), so only what changed is
/// gossiped.
pub fn publish(node: &mut NodeState, local: &LocalState) {
    node.set(KEY_ONLINK_V4, encode_on_link(&local.on_link, Family::V4));
    node.set(KEY_ONLINK_V6, encode_on_link(&local.on_link, Family::V6));
    node.set(KEY_VIRTUAL, local.virtual_mode.to_string());
    node.set(KEY_MACS, spaced(&local.macs));
    node.set(KEY_REVISION, local.revision.to_string());
    node.set(KEY_VIEW, encode_digest(local.digest));
    // Before `status`, so that a peer that sees this node alive knows
    // whether it is drained.
    // Set, never deleted: a peer hears of a deletion only a gossip round
    // late.
    node.set(KEY_DRAINED, local.drained.to_string());
    node.set(KEY_BEHIND, spaced(&local.behind));
    let chunks = vip_chunks(&local.vips);
    let count = chunks.len();
    let stale: Vec<String> = node
        .iter_prefix(KEY_VIPS_PREFIX)
        .map(|(key, _)| key.to_string())
        .filter(|key| {
            key[KEY_VIPS_PREFIX.len()..]
                .parse::<usize>()
                .map_or(true, |i| i >= chunks.len())
        })
        .collect();
    for (i, chunk) in chunks.into_iter().enumerate() {
        node.set(vip_key(i), chunk);
    }
    // Emptied, never deleted: a deletion is a tombstone, which no node's
    // signed manifest vouches for (see `signed`).
    for key in stale {
        node.set(&key, "");
    }
    node.set(KEY_VIP_CHUNKS, count.to_string());
    node.set(KEY_STATUS, local.status.as_str());
}

/// A node's published state, or `None` while its `status` has not arrived.
pub fn decode(node: &NodeState) -> Option<MemberInfo> {
    let status = Status::parse(node.get(KEY_STATUS)?);
    let mut on_link = Vec::new();
    if let Some(text) = node.get(KEY_ONLINK_V4) {
        decode_on_link(text, Family::V4, &mut on_link);
    }
    if let Some(text) = node.get(KEY_ONLINK_V6) {
        decode_on_link(text, Family::V6, &mut on_link);
    }
    let mut vips = BTreeSet::new();
    for (_, value) in node.iter_prefix(KEY_VIPS_PREFIX) {
        vips.extend(
            value
                .value
                .split_ascii_whitespace()
                .filter_map(|ip| ip.parse::<IpAddr>().ok()),
        );
    }
    let id = node.chitchat_id();
    Some(MemberInfo {
        node: NodeName::from(&*id.node_id),
        generation: id.generation_id,
        gossip_addr: id.gossip_advertise_addr,
        agent_version: node.get(KEY_VERSION).unwrap_or_default().to_string(),
        protocol: node
            .get(KEY_PROTOCOL)
            .and_then(|p| p.parse().ok())
            .unwrap_or(PROTOCOL_UNSAID),
        status,
        virtual_mode: node.get(KEY_VIRTUAL) == Some("true"),
        on_link: on_link.into(),
        vips: vips.into(),
        macs: node
            .get(KEY_MACS)
            .unwrap_or_default()
            .split_ascii_whitespace()
            .filter_map(|m| m.parse().ok())
            .collect::<BTreeSet<_>>()
            .into(),
        revision: node
            .get(KEY_REVISION)
            .and_then(|r| r.parse().ok())
            .unwrap_or(0),
        digest: node
            .get(KEY_VIEW)
            .and_then(|d| u64::from_str_radix(d, 16).ok()),
        drained: node.get(KEY_DRAINED) == Some("true"),
        behind: node
            .get(KEY_BEHIND)
            .unwrap_or_default()
            .split_ascii_whitespace()
            .map(NodeName::from)
            .collect::<BTreeSet<_>>()
            .into(),
    })
}

/// A view's digest as published: empty before the first view.
fn encode_digest(digest: Option<u64>) -> String {
    digest.map(|d| format!("{d:016x}")).unwrap_or_default()
}

/// A set's items, space-separated (MACs, node names).
fn spaced<T: std::fmt::Display>(items: &BTreeSet<T>) -> String {
    items.iter().map(T::to_string).collect::<Vec<_>>().join(" ")
}

/// Whether the node's liveness comes from the SWIM detector rather than
/// chitchat's heartbeats.
pub fn runs_detector(node: &NodeState) -> bool {
    node.get(KEY_DETECTOR) == Some(DETECTOR_SWIM)
}

/// chitchat's `extra_liveness_predicate`: a leaving node (or one whose state
/// has not arrived yet) is not live. A starting one is: it gossips and is
/// gossiped with like any other, it only does not stand in elections.
pub fn is_live(node: &NodeState) -> bool {
    matches!(
        node.get(KEY_STATUS),
        Some(s) if s == Status::Alive.as_str() || s == Status::Starting.as_str()
    )
}

/// The node said it is leaving (a graceful stop, or `cleanup` speaking for
/// a killed agent).
pub fn is_leaving(node: &NodeState) -> bool {
    node.get(KEY_STATUS) == Some(Status::Leaving.as_str())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn on_link(prefix: &str, interface: &str, announce: bool) -> OnLink {
        OnLink {
            prefix: prefix.parse().unwrap(),
            interface: interface.to_string(),
            announce,
            upstream_lost: false,
        }
    }

    #[test]
    fn vip_chunks_are_bounded_and_cover_everything() {
        let vips: BTreeSet<IpAddr> = (0..2_000u32)
            .map(|i| IpAddr::from([10, (i >> 16) as u8, (i >> 8) as u8, i as u8]))
            .chain((0..300u32).map(|i| IpAddr::from([0x2001, 0xdb8, 0, 0, 0, 0, 0xffff, i as u16])))
            .collect();
        let chunks = vip_chunks(&vips);
        assert!(chunks.len() > 1);
        assert!(chunks.iter().all(|c| c.len() <= VIPS_CHUNK_BYTES));
        let back: BTreeSet<IpAddr> = chunks
            .iter()
            .flat_map(|c| c.split(' '))
            .map(|ip| ip.parse().unwrap())
            .collect();
        assert_eq!(back, vips);
        assert!(vip_chunks(&BTreeSet::new()).is_empty());
    }

    #[test]
    fn status_is_written_last() {
        let kvs = initial_key_values("1.2.3", &LocalState::default());
        assert_eq!(kvs.last().unwrap(), &("status".into(), "alive".into()));
    }

    #[test]
    fn on_link_round_trips_per_family() {
        let list = vec![
            on_link("10.0.0.0/24", "eth0", true),
            on_link("2001:db8::/64", "eth0", true),
            on_link("192.168.7.0/24", "eth1,odd", false),
            OnLink {
                upstream_lost: true,
                ..on_link("10.9.0.0/24", "eth2", false)
            },
        ];
        let v4 = encode_on_link(&list, Family::V4);
        let v6 = encode_on_link(&list, Family::V6);
        assert!(!v4.contains("2001"), "{v4}");
        // Said only where the gateway is lost: an older agent reads the
        // same value as it always did everywhere else.
        assert_eq!(v4.matches("nogw").count(), 1, "{v4}");
        let mut back = Vec::new();
        decode_on_link(&v4, Family::V4, &mut back);
        decode_on_link(&v6, Family::V6, &mut back);
        back.sort();
        let mut want = list.clone();
        want.sort();
        assert_eq!(back, want);
    }

    #[test]
    fn decoding_skips_what_it_cannot_read() {
        let mut out = Vec::new();
        decode_on_link("not json", Family::V4, &mut out);
        decode_on_link(
            r#"[{"if":"eth0","prefix":"10.1.0.0/16","announce":true,"future":1},
                {"if":"eth0","prefix":"bogus"},
                {"if":"eth0","prefix":"2001:db8::/64"}]"#,
            Family::V4,
            &mut out,
        );
        assert_eq!(out, vec![on_link("10.1.0.0/16", "eth0", true)]);
    }

    #[test]
    fn unknown_status_is_not_alive() {
        assert_eq!(Status::parse("alive"), Status::Alive);
        assert_eq!(Status::parse("starting"), Status::Starting);
        assert_eq!(Status::parse("draining"), Status::Leaving);
        for s in [Status::Alive, Status::Starting, Status::Leaving] {
            assert_eq!(Status::parse(s.as_str()), s);
        }
    }
}
