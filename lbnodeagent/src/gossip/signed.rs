//! Gossip state that only its own node can write: each node signs a
//! manifest of its keys with its own identity key (see `identity`), and
//! peers merge state in a node's name only where that node's manifest
//! vouches for it.
//!
//! The shared gossip key proves membership. Without more, any key holder
//! could publish state in another node's name: a `leaving` status, or a
//! forged higher version of a key, which chitchat would keep over the real
//! one from then on (a version only grows), hiding the owner's state for
//! the rest of its run. So:
//!
//! - After every change of its own state, a node sets the key
//!   [`KEY_MANIFEST`] last: every other key with its version and a hash of
//!   its value, and the node's Ed25519 signature over that, its name, its
//!   generation and the manifest's own version. A node's keys travel in
//!   version order, so a delta that carries a change carries the manifest
//!   after it.
//! - Before a delta from any peer reaches chitchat, each node's part of it
//!   is checked ([`check`]) against that node's key from its record: it is
//!   kept up to the last manifest in it, whose signature must verify; every
//!   key-value before that must be one the manifest names (same version,
//!   same hash); and every key the manifest names above the version the
//!   delta starts from must be there. What does not pass is dropped whole
//!   for that node, so the receiver's copy of a node's state is always one
//!   the node signed, complete: a relay can withhold a node's news (a
//!   later round brings it from another), never forge or hide it.
//! - Nodes never delete keys (an emptied VIP chunk is set to ""), so a
//!   tombstone, a garbage-collection version or a bare "max version" in a
//!   node's name are never theirs and are dropped with the rest.
//!
//! The cost: one signature per change of a node's state (about 20 µs), a
//! manifest of about 50 bytes per key (12 keys at rest, 600 bytes), and one
//! verification per change received (about 50 µs; a change relayed by
//! several peers is verified again for each copy that arrives before the
//! first is merged).

use std::collections::HashMap;

use base64::Engine as _;
use chitchat::{ChitchatId, Deserializable, NodeState, Serializable};
use sha2::{Digest, Sha256};

use crate::identity::{NodeKey, PublicId};

/// The key that carries a node's signed manifest.
pub const KEY_MANIFEST: &str = "manifest";
/// Bytes of a value's hash in a manifest.
const HASH_LEN: usize = 16;
/// What the signature covers starts with this.
const DOMAIN: &[u8] = b"hostlb gossip manifest v1\0";

fn value_hash(value: &str) -> [u8; HASH_LEN] {
    let d = Sha256::digest(value.as_bytes());
    let mut h = [0u8; HASH_LEN];
    h.copy_from_slice(&d[..HASH_LEN]);
    h
}

/// What the signature covers.
fn signed_message(id: &ChitchatId, version: u64, entries: &str) -> Vec<u8> {
    let mut m = Vec::with_capacity(DOMAIN.len() + id.node_id.len() + 20 + entries.len());
    m.extend_from_slice(DOMAIN);
    m.extend_from_slice(id.node_id.as_bytes());
    m.push(0);
    m.extend_from_slice(&id.generation_id.to_be_bytes());
    m.extend_from_slice(&version.to_be_bytes());
    m.extend_from_slice(entries.as_bytes());
    m
}

/// `key@version#hash ...` for `kvs`, sorted by key.
fn entries_of<'a>(kvs: impl Iterator<Item = (&'a str, u64, &'a str)>) -> String {
    let mut kvs: Vec<(&str, u64, &str)> = kvs.filter(|(k, _, _)| *k != KEY_MANIFEST).collect();
    kvs.sort_unstable_by_key(|(k, _, _)| *k);
    let mut out = String::new();
    for (k, version, value) in kvs {
        if !out.is_empty() {
            out.push(' ');
        }
        out.push_str(k);
        out.push('@');
        out.push_str(&version.to_string());
        out.push('#');
        out.push_str(&hex::encode(value_hash(value)));
    }
    out
}

/// Signs `state` (this node's own) after a change: sets [`KEY_MANIFEST`]
/// last, unless the manifest already names every key at its version.
pub fn sign_state(state: &mut NodeState, key: &NodeKey) {
    let entries = entries_of(
        state
            .key_values_including_deleted()
            .map(|(k, v)| (k, v.version, v.value.as_str())),
    );
    if state
        .get(KEY_MANIFEST)
        .and_then(|m| m.split_once(' ').map(|(_, e)| e))
        .is_some_and(|e| e == entries)
    {
        return;
    }
    let version = state.max_version() + 1;
    let id = state.chitchat_id().clone();
    let signature = key.sign(&signed_message(&id, version, &entries));
    let sig = base64::engine::general_purpose::STANDARD_NO_PAD.encode(signature);
    state.set(KEY_MANIFEST, format!("{sig} {entries}"));
    debug_assert_eq!(
        state.get_versioned(KEY_MANIFEST).map(|v| v.version),
        Some(version),
        "the manifest's version is the one signed"
    );
}

/// One key-value of a node's part of a delta, as it travels.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Kv {
    pub key: String,
    pub value: String,
    pub version: u64,
    /// Set, not a tombstone.
    pub set: bool,
}

/// A node's part of a delta.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct NodePart {
    pub id: ChitchatId,
    pub last_gc_version: u64,
    pub from_version_excluded: u64,
    pub kvs: Vec<Kv>,
    /// A bare max version (chitchat sends one for a state without keys).
    pub max_version: Option<u64>,
}

/// Why a node's part was dropped.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Refusal {
    /// No manifest in it: nothing vouches for what it carries (a change
    /// cut from its manifest by the datagram's size comes whole later).
    NoManifest,
    /// The manifest's signature is not the node's.
    BadSignature,
    /// A key-value the manifest does not name as it is.
    NotInManifest,
    /// A key the manifest names, newer than the delta's start, is missing.
    Incomplete,
    /// A tombstone, garbage-collection version or bare max version, which
    /// no node of this release sends.
    Shape,
}

impl Refusal {
    pub fn as_str(self) -> &'static str {
        match self {
            Refusal::NoManifest => "no_manifest",
            Refusal::BadSignature => "bad_signature",
            Refusal::NotInManifest => "not_in_manifest",
            Refusal::Incomplete => "incomplete",
            Refusal::Shape => "shape",
        }
    }
}

/// Checks `part` against its node's key: how many of its key-values to
/// keep (up to and including its last manifest), or why none.
pub fn check(part: &NodePart, key: &PublicId) -> Result<usize, Refusal> {
    if part.last_gc_version != 0 || part.max_version.is_some() || part.kvs.iter().any(|kv| !kv.set)
    {
        return Err(Refusal::Shape);
    }
    let at = part
        .kvs
        .iter()
        .rposition(|kv| kv.key == KEY_MANIFEST)
        .ok_or(Refusal::NoManifest)?;
    let manifest = &part.kvs[at];
    let (sig, entries) = manifest
        .value
        .split_once(' ')
        .unwrap_or((manifest.value.as_str(), ""));
    let sig: [u8; 64] = base64::engine::general_purpose::STANDARD_NO_PAD
        .decode(sig)
        .ok()
        .and_then(|s| s.try_into().ok())
        .ok_or(Refusal::BadSignature)?;
    if !key.verifies(&signed_message(&part.id, manifest.version, entries), &sig) {
        return Err(Refusal::BadSignature);
    }
    let mut named: HashMap<&str, (u64, &str)> = HashMap::new();
    for e in entries.split(' ').filter(|e| !e.is_empty()) {
        let (k, rest) = e.split_once('@').ok_or(Refusal::NotInManifest)?;
        let (v, h) = rest.split_once('#').ok_or(Refusal::NotInManifest)?;
        let v: u64 = v.parse().map_err(|_| Refusal::NotInManifest)?;
        named.insert(k, (v, h));
    }
    let mut present = 0;
    for kv in &part.kvs[..at] {
        match named.get(kv.key.as_str()) {
            Some((v, h)) if *v == kv.version && *h == hex::encode(value_hash(&kv.value)) => {
                present += 1;
            }
            _ => return Err(Refusal::NotInManifest),
        }
    }
    let newer = named
        .values()
        .filter(|(v, _)| *v > part.from_version_excluded)
        .count();
    if present != newer {
        return Err(Refusal::Incomplete);
    }
    Ok(at + 1)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn id() -> ChitchatId {
        ChitchatId::new("node-a", 7, "10.0.0.1:7934".parse().unwrap())
    }

    fn key() -> NodeKey {
        NodeKey::from_seed([1; 32])
    }

    /// The node's whole state after `sets`, signed after each batch, as the
    /// key-values a delta from `from` would carry.
    fn signed_part(batches: &[&[(&str, &str)]], from: u64) -> NodePart {
        let mut state = chitchat_state();
        for batch in batches {
            for (k, v) in *batch {
                state.set(*k, *v);
            }
            sign_state(&mut state, &key());
        }
        let mut kvs: Vec<Kv> = state
            .key_values_including_deleted()
            .filter(|(_, v)| v.version > from)
            .map(|(k, v)| Kv {
                key: k.to_string(),
                value: v.value.clone(),
                version: v.version,
                set: true,
            })
            .collect();
        kvs.sort_by_key(|kv| kv.version);
        NodePart {
            id: id(),
            last_gc_version: 0,
            from_version_excluded: from,
            kvs,
            max_version: None,
        }
    }

    fn chitchat_state() -> NodeState {
        let config = chitchat::ChitchatConfig {
            chitchat_id: id(),
            cluster_id: "t".into(),
            gossip_interval: std::time::Duration::from_millis(100),
            listen_addr: "10.0.0.1:7934".parse().unwrap(),
            seed_nodes: Vec::new(),
            failure_detector_config: chitchat::FailureDetectorConfig::default(),
            marked_for_deletion_grace_period: std::time::Duration::from_secs(60),
            catchup_callback: None,
            extra_liveness_predicate: None,
            protocol_version: chitchat::ProtocolVersion::V1,
        };
        let mut c = chitchat::Chitchat::with_chitchat_id_and_seeds(
            config,
            tokio::sync::watch::channel(Default::default()).1,
            Vec::new(),
        );
        c.self_node_state().clone()
    }

    #[test]
    fn a_signed_state_passes_whole_and_from_any_start() {
        let batches: &[&[(&str, &str)]] = &[
            &[("status", "alive"), ("vips.0", "10.0.0.9")],
            &[("vips.0", "10.0.0.9 10.0.0.10")],
        ];
        let whole = signed_part(batches, 0);
        let k = key().public();
        assert_eq!(check(&whole, &k), Ok(whole.kvs.len()));
        // From the first manifest on: only the second batch.
        let later = signed_part(batches, 3);
        assert_eq!(check(&later, &k), Ok(later.kvs.len()));
    }

    #[test]
    fn another_key_a_forged_value_or_version_and_a_tombstone_are_refused() {
        let batches: &[&[(&str, &str)]] = &[&[("status", "alive"), ("vips.0", "10.0.0.9")]];
        let k = key().public();
        let good = signed_part(batches, 0);
        let other = NodeKey::from_seed([2; 32]).public();
        assert_eq!(check(&good, &other), Err(Refusal::BadSignature));
        let mut leaving = good.clone();
        leaving.kvs[0].value = "leaving".into();
        assert_eq!(check(&leaving, &k), Err(Refusal::NotInManifest));
        // A forged higher version of a key, to hide the real one: the
        // manifest names it at its own version.
        let mut higher = good.clone();
        let status = higher.kvs.iter_mut().find(|kv| kv.key == "status").unwrap();
        status.version = 1_000_000;
        higher.kvs.sort_by_key(|kv| kv.version);
        assert!(check(&higher, &k).is_err());
        let mut tomb = good.clone();
        tomb.kvs[0].set = false;
        assert_eq!(check(&tomb, &k), Err(Refusal::Shape));
        let mut gc = good.clone();
        gc.last_gc_version = 5;
        assert_eq!(check(&gc, &k), Err(Refusal::Shape));
        let mut bare = good;
        bare.max_version = Some(1_000_000);
        assert_eq!(check(&bare, &k), Err(Refusal::Shape));
    }

    /// A relay that withholds a key the manifest names (a node's status,
    /// to keep it out of the election) gets nothing merged; what comes
    /// after the last manifest is cut off, and waits for its own.
    #[test]
    fn a_part_missing_a_named_key_is_refused_and_one_past_its_manifest_is_cut() {
        let batches: &[&[(&str, &str)]] = &[&[("status", "alive"), ("vips.0", "10.0.0.9")]];
        let k = key().public();
        let mut withheld = signed_part(batches, 0);
        withheld.kvs.retain(|kv| kv.key != "status");
        assert_eq!(check(&withheld, &k), Err(Refusal::Incomplete));
        let mut more = signed_part(batches, 0);
        let n = more.kvs.len();
        more.kvs.push(Kv {
            key: "vips.0".into(),
            value: "10.6.6.6".into(),
            version: 99,
            set: true,
        });
        assert_eq!(check(&more, &k), Ok(n));
        let mut none = signed_part(batches, 0);
        none.kvs.retain(|kv| kv.key != KEY_MANIFEST);
        assert_eq!(check(&none, &k), Err(Refusal::NoManifest));
    }

    #[test]
    fn an_unchanged_state_is_not_signed_again() {
        let mut state = chitchat_state();
        state.set("status", "alive");
        sign_state(&mut state, &key());
        let v = state.max_version();
        sign_state(&mut state, &key());
        assert_eq!(state.max_version(), v);
        state.set("status", "alive");
        sign_state(&mut state, &key());
        assert_eq!(state.max_version(), v, "an equal value changes nothing");
        state.set("status", "leaving");
        sign_state(&mut state, &key());
        assert_eq!(state.max_version(), v + 2, "the change and its manifest");
    }
}

/// What became of one node's part of a delta.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Outcome {
    /// Kept whole.
    Kept,
    /// Kept up to its last manifest; the rest waits for its own.
    Cut,
    /// Dropped: its node's identity is not known yet (its record not
    /// listed, or it names none that parses).
    Unknown,
    Refused(Refusal),
}

/// What [`filter_message`] made of a chitchat message.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Filtered {
    /// Every node's part passed whole (or it carries no delta).
    Unchanged,
    /// The message with only what passed.
    Replaced(Vec<u8>),
    /// Not readable as a chitchat message: dropped (chitchat could not
    /// read it either).
    Unreadable,
}

/// chitchat's envelope: a magic number, the protocol version (which
/// selects the digest's encoding), the message type.
const ENVELOPE_MAGIC: u16 = 45_139;
const SYN_ACK: u8 = 1;
const ACK: u8 = 2;

/// Filters a chitchat message (its bytes, as they reach chitchat's codec)
/// before chitchat applies its delta: each node's part is checked against
/// its node's identity (see [`check`]); a node whose record names no
/// identity (an agent of an earlier release) passes as before. `seen` is
/// told of every part that was not kept whole. Done on the wire form,
/// which chitchat's public decoders read, because chitchat keeps its delta
/// type to itself; the message rebuilt carries the same digest and the
/// parts that passed, in uncompressed blocks.
pub fn filter_message(
    message: &[u8],
    identities: &crate::identity::Identities,
    mut seen: impl FnMut(&ChitchatId, Outcome),
) -> Filtered {
    use crate::identity::Known;
    let Some(header) = message.get(..4) else {
        return Filtered::Unchanged;
    };
    if u16::from_le_bytes([header[0], header[1]]) != ENVELOPE_MAGIC {
        return Filtered::Unchanged;
    }
    let (version, kind) = (header[2], header[3]);
    let body = &message[4..];
    let delta_at = match kind {
        SYN_ACK => match skip_digest(version, body) {
            Ok(n) => 4 + n,
            Err(_) => return Filtered::Unreadable,
        },
        ACK => 4,
        _ => return Filtered::Unchanged,
    };
    let parts = match parts_of_wire(&message[delta_at..]) {
        Ok(parts) => parts,
        Err(_) => return Filtered::Unreadable,
    };
    let mut kept: Vec<(NodePart, usize)> = Vec::with_capacity(parts.len());
    let mut whole = true;
    for part in parts {
        let outcome = match identities.of(&part.id.node_id) {
            None => Err(Outcome::Unknown),
            Some(Known::NoIdentity) => Ok(part.kvs.len()),
            Some(Known::Key(key)) => check(&part, &key).map_err(Outcome::Refused),
        };
        match outcome {
            Ok(n) if n == part.kvs.len() => kept.push((part, n)),
            Ok(n) => {
                whole = false;
                seen(&part.id, Outcome::Cut);
                kept.push((part, n));
            }
            Err(o) => {
                whole = false;
                if matches!(o, Outcome::Refused(_)) {
                    // Perhaps a new key the records will tell.
                    identities.want();
                }
                seen(&part.id, o);
            }
        }
    }
    if whole {
        return Filtered::Unchanged;
    }
    let mut out = message[..delta_at].to_vec();
    out.extend_from_slice(&encode(&kept));
    Filtered::Replaced(out)
}

/// The length of the digest at the start of `body`, in the encoding of
/// protocol `version`: V0, a count and the entries; V1, a block stream
/// (skipped block by block, not decompressed).
fn skip_digest(version: u8, body: &[u8]) -> anyhow::Result<usize> {
    let mut buf = body;
    match version {
        0 => {
            let n = u16::deserialize(&mut buf)?;
            for _ in 0..n {
                ChitchatId::deserialize(&mut buf)?;
                for _ in 0..3 {
                    u64::deserialize(&mut buf)?;
                }
            }
        }
        1 => loop {
            let kind = u8::deserialize(&mut buf)?;
            if kind == 0 {
                break;
            }
            anyhow::ensure!(kind <= 2, "unknown block type {kind}");
            let len = usize::from(u16::deserialize(&mut buf)?);
            anyhow::ensure!(buf.len() >= len, "a block past the end");
            buf = &buf[len..];
        },
        _ => anyhow::bail!("unknown protocol version {version}"),
    }
    Ok(body.len() - buf.len())
}

/// The wire form of a delta of `parts`, each with its first `n`
/// key-values: the operations, in uncompressed blocks.
fn encode(parts: &[(NodePart, usize)]) -> Vec<u8> {
    let mut ops = Vec::new();
    for (part, n) in parts {
        ops.push(0u8);
        part.id.serialize(&mut ops);
        part.last_gc_version.serialize(&mut ops);
        part.from_version_excluded.serialize(&mut ops);
        for kv in &part.kvs[..*n] {
            ops.push(1u8);
            kv.key.serialize(&mut ops);
            kv.value.serialize(&mut ops);
            kv.version.serialize(&mut ops);
            ops.push(if kv.set { 0 } else { 1 });
        }
        if let Some(max) = part.max_version
            && *n == part.kvs.len()
        {
            ops.push(2u8);
            max.serialize(&mut ops);
        }
    }
    let mut wire = Vec::with_capacity(ops.len() + ops.len() / 60_000 * 3 + 4);
    for block in ops.chunks(usize::from(u16::MAX)) {
        wire.push(2u8);
        (block.len() as u16).serialize(&mut wire);
        wire.extend_from_slice(block);
    }
    wire.push(0u8);
    wire
}

/// A delta's node parts, read from its wire form: a stream of blocks
/// (zstd-compressed or not) holding operations, each a node (its id, last
/// GC version, the version it starts after), a key-value (key, value,
/// version, deletion status) or a bare max version. chitchat keeps the
/// parsed form to itself; the wire form is its own serialization, read
/// here with its own public decoders.
fn parts_of_wire(wire: &[u8]) -> anyhow::Result<Vec<NodePart>> {
    let mut buf = wire;
    let mut ops = Vec::new();
    loop {
        let kind = u8::deserialize(&mut buf)?;
        match kind {
            0 => break,
            1 | 2 => {
                let len = usize::from(u16::deserialize(&mut buf)?);
                anyhow::ensure!(buf.len() >= len, "a block past the end");
                let (block, rest) = buf.split_at(len);
                buf = rest;
                if kind == 1 {
                    ops.extend(zstd::bulk::decompress(block, usize::from(u16::MAX))?);
                } else {
                    ops.extend_from_slice(block);
                }
            }
            _ => anyhow::bail!("unknown block type {kind}"),
        }
    }
    let mut ops = ops.as_slice();
    let mut parts: Vec<NodePart> = Vec::new();
    while !ops.is_empty() {
        match u8::deserialize(&mut ops)? {
            0 => {
                let id = ChitchatId::deserialize(&mut ops)?;
                let last_gc_version = u64::deserialize(&mut ops)?;
                let from_version_excluded = u64::deserialize(&mut ops)?;
                parts.push(NodePart {
                    id,
                    last_gc_version,
                    from_version_excluded,
                    kvs: Vec::new(),
                    max_version: None,
                });
            }
            1 => {
                let key = String::deserialize(&mut ops)?;
                let value = String::deserialize(&mut ops)?;
                let version = u64::deserialize(&mut ops)?;
                let status = u8::deserialize(&mut ops)?;
                let part = parts
                    .last_mut()
                    .ok_or_else(|| anyhow::anyhow!("a key-value before any node"))?;
                part.kvs.push(Kv {
                    key,
                    value,
                    version,
                    set: status == 0,
                });
            }
            2 => {
                let max = u64::deserialize(&mut ops)?;
                parts
                    .last_mut()
                    .ok_or_else(|| anyhow::anyhow!("a max version before any node"))?
                    .max_version = Some(max);
            }
            op => anyhow::bail!("unknown operation {op}"),
        }
    }
    Ok(parts)
}

#[cfg(test)]
mod delta_tests {
    use super::*;
    use crate::identity::{Identities, Known};

    fn part_of(
        node: &str,
        generation: u64,
        key: Option<&NodeKey>,
        kvs: &[(&str, &str)],
    ) -> NodePart {
        let id = ChitchatId::new(node, generation, "10.0.0.1:7934".parse().unwrap());
        let mut kvs: Vec<Kv> = kvs
            .iter()
            .enumerate()
            .map(|(i, (k, v))| Kv {
                key: k.to_string(),
                value: v.to_string(),
                version: i as u64 + 1,
                set: true,
            })
            .collect();
        if let Some(key) = key {
            let version = kvs.len() as u64 + 1;
            let entries = entries_of(
                kvs.iter()
                    .map(|kv| (kv.key.as_str(), kv.version, kv.value.as_str())),
            );
            let sig = base64::engine::general_purpose::STANDARD_NO_PAD
                .encode(key.sign(&signed_message(&id, version, &entries)));
            kvs.push(Kv {
                key: KEY_MANIFEST.into(),
                value: format!("{sig} {entries}"),
                version,
                set: true,
            });
        }
        NodePart {
            id,
            last_gc_version: 0,
            from_version_excluded: 0,
            kvs,
            max_version: None,
        }
    }

    /// A SYN-ACK of protocol 0 with an empty digest, or an ACK.
    fn message(ack: bool, parts: &[(NodePart, usize)]) -> Vec<u8> {
        let mut m = ENVELOPE_MAGIC.to_le_bytes().to_vec();
        m.push(0);
        if ack {
            m.push(ACK);
        } else {
            m.push(SYN_ACK);
            m.extend_from_slice(&[0, 0]);
        }
        m.extend_from_slice(&encode(parts));
        m
    }

    /// chitchat's own decoder takes the wire form of a delta (it rebuilds
    /// its delta and checks the versions' order): an ACK's field names
    /// the type it has no name for outside chitchat.
    fn chitchat_reads(delta: &[u8]) -> bool {
        let d: anyhow::Result<_> = Deserializable::deserialize(&mut &delta[..]);
        d.map(|delta| chitchat::ChitchatMessage::Ack { delta })
            .is_ok()
    }

    /// Each node's part is kept or dropped by its own identity: a's,
    /// signed, passes; b's, forged by a key holder in b's name, is
    /// dropped; an older agent's, unsigned, passes; an unknown node's
    /// waits. What is left reads back as chitchat reads it.
    #[test]
    fn each_nodes_part_is_kept_or_dropped_by_its_own_identity() {
        let (a, b, forger) = (
            NodeKey::from_seed([1; 32]),
            NodeKey::from_seed([2; 32]),
            NodeKey::from_seed([3; 32]),
        );
        let parts = vec![
            (part_of("a", 1, Some(&a), &[("status", "alive")]), 2),
            (part_of("b", 1, Some(&forger), &[("status", "leaving")]), 2),
            (part_of("old", 1, None, &[("status", "alive")]), 1),
            (
                part_of("stranger", 1, Some(&forger), &[("status", "alive")]),
                2,
            ),
        ];
        let ids = Identities::new();
        ids.set("a", Known::Key(a.public()));
        ids.set("b", Known::Key(b.public()));
        ids.set("old", Known::NoIdentity);
        for ack in [true, false] {
            let m = message(ack, &parts);
            let at = if ack { 4 } else { 6 };
            assert_eq!(
                parts_of_wire(&m[at..]).unwrap(),
                parts.iter().map(|(p, _)| p.clone()).collect::<Vec<_>>()
            );
            let mut seen = Vec::new();
            let Filtered::Replaced(out) =
                filter_message(&m, &ids, |id, o| seen.push((id.node_id.to_string(), o)))
            else {
                panic!("parts dropped");
            };
            assert_eq!(&out[..at], &m[..at], "the envelope and digest unchanged");
            assert!(chitchat_reads(&out[at..]));
            let kept: Vec<String> = parts_of_wire(&out[at..])
                .unwrap()
                .into_iter()
                .map(|p| p.id.node_id.to_string())
                .collect();
            assert_eq!(kept, ["a", "old"]);
            assert_eq!(
                seen,
                [
                    ("b".to_string(), Outcome::Refused(Refusal::BadSignature)),
                    ("stranger".to_string(), Outcome::Unknown)
                ]
            );
            assert!(ids.take_wanted(), "the records are asked for again");
        }
    }

    /// A message whose parts all pass goes on as it came; junk in the
    /// shape of a delta is not read.
    #[test]
    fn a_message_that_passes_whole_is_left_alone() {
        let a = NodeKey::from_seed([1; 32]);
        let ids = Identities::new();
        ids.set("a", Known::Key(a.public()));
        let m = message(
            true,
            &[(part_of("a", 1, Some(&a), &[("status", "alive")]), 2)],
        );
        assert_eq!(
            filter_message(&m, &ids, |_, _| panic!("all kept")),
            Filtered::Unchanged
        );
        let mut junk = m[..4].to_vec();
        junk.extend_from_slice(&[2, 0xff, 0xff, 1]);
        assert_eq!(filter_message(&junk, &ids, |_, _| {}), Filtered::Unreadable);
        assert_eq!(
            filter_message(b"not chitchat", &ids, |_, _| {}),
            Filtered::Unchanged
        );
    }
}
