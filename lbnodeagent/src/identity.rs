//! Each node's identity of its own, for everything that makes another
//! node act: its beats (owner, relay and leaving) and the gossip state the
//! others elect from.
//!
//! The shared gossip key proves membership, not identity: every host holds
//! it, so one compromised host could otherwise speak for all the others
//! (a leaving beat in the owner's name, a forged higher version of its
//! state). Here each node has an Ed25519 key, made at its agent's first
//! start and kept in the run directory (`identity.key`, mode 0600); its
//! public key goes in the node's own `NodeAgent` record, which only that
//! node's credential may write (per-node identities, docs/agent.md). Peers
//! learn it from the records ([`Identities`]) and verify against it before
//! they act, and before they merge gossip state in that node's name.
//!
//! Two uses, by cost:
//! - What one node tells all, or what others relay (its gossip state's
//!   manifest, its leaving beat): an Ed25519 signature, verifiable by
//!   anyone with the record.
//! - What one node tells one other, many times a second (owner beats,
//!   relays): an HMAC under a key only the two share, derived by X25519
//!   from each one's key and the other's public key (the same key, as
//!   Ed25519 and X25519 are one curve). An HMAC is a microsecond where a
//!   signature's check is tens.
//!
//! Rotating a node's key: delete its `identity.key` (or let a reboot
//! clear the run directory) and restart the agent; it makes a new one and
//! writes it into its record at start, and peers list the records again
//! when a node's state or beats no longer verify.

use std::collections::HashMap;
use std::fmt;
use std::io::Write as _;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, RwLock};

use base64::Engine as _;
use ed25519_dalek::{Signature, Signer, SigningKey, VerifyingKey};
use hmac::{Hmac, Mac};
use sha2::Sha256;
use zeroize::Zeroizing;

/// The file in the run directory.
pub const KEY_FILE: &str = "identity.key";
/// How a public key is written in a record: this prefix, then base64.
const PREFIX: &str = "ed25519:";

#[derive(Debug, thiserror::Error)]
pub enum IdentityError {
    #[error("cannot read the node's identity key {}: {source}", path.display())]
    Read {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error(
        "the node's identity key {} is not 64 hex digits; delete it and the agent makes a new one",
        path.display()
    )]
    Malformed { path: PathBuf },
    #[error(
        "{} holds this node's identity key and others may read or write it (mode {mode:04o}); make it the agent's alone: chmod 600 {0}",
        path.display()
    )]
    Mode { path: PathBuf, mode: u32 },
    #[error("cannot write the node's identity key {}: {source}", path.display())]
    Write {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("cannot make a key: the system's random source failed: {0}")]
    Random(String),
}

/// A node's public key, as its record publishes it.
#[derive(Clone, Copy, PartialEq, Eq)]
pub struct PublicId(VerifyingKey);

impl fmt::Display for PublicId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let b64 = base64::engine::general_purpose::STANDARD_NO_PAD.encode(self.0.as_bytes());
        write!(f, "{PREFIX}{b64}")
    }
}

impl fmt::Debug for PublicId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "PublicId({self})")
    }
}

impl std::str::FromStr for PublicId {
    type Err = String;
    fn from_str(s: &str) -> Result<PublicId, String> {
        let b64 = s
            .strip_prefix(PREFIX)
            .ok_or_else(|| format!("not {PREFIX}<base64>"))?;
        let bytes = base64::engine::general_purpose::STANDARD_NO_PAD
            .decode(b64.trim_end_matches('='))
            .map_err(|e| e.to_string())?;
        let bytes: [u8; 32] = bytes.try_into().map_err(|_| "not 32 bytes".to_string())?;
        let key = VerifyingKey::from_bytes(&bytes).map_err(|e| e.to_string())?;
        // A weak key signs nothing of its own; such a record is forged.
        if key.is_weak() {
            return Err("a weak key".into());
        }
        Ok(PublicId(key))
    }
}

impl PublicId {
    /// Whether `signature` is this node's over `message` (strict: no
    /// malleable encodings).
    pub fn verifies(&self, message: &[u8], signature: &[u8; 64]) -> bool {
        self.0
            .verify_strict(message, &Signature::from_bytes(signature))
            .is_ok()
    }

    pub fn as_bytes(&self) -> &[u8; 32] {
        self.0.as_bytes()
    }
}

/// This node's key. Its secret part is wiped from memory when dropped.
pub struct NodeKey {
    signing: SigningKey,
}

impl fmt::Debug for NodeKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "NodeKey({})", self.public())
    }
}

impl NodeKey {
    /// From a 32-byte seed (tests and benchmarks).
    pub fn from_seed(seed: [u8; 32]) -> NodeKey {
        NodeKey {
            signing: SigningKey::from_bytes(&seed),
        }
    }

    /// A new random key.
    pub fn generate() -> Result<NodeKey, IdentityError> {
        let mut seed = Zeroizing::new([0u8; 32]);
        getrandom(&mut *seed)?;
        Ok(NodeKey::from_seed(*seed))
    }

    /// The key in `dir`'s [`KEY_FILE`] if there is one (what `cleanup`
    /// speaks for a dead run with: it makes none); why not, logged.
    pub fn load_existing(dir: &Path) -> Option<NodeKey> {
        if !dir.join(KEY_FILE).exists() {
            tracing::warn!(dir = %dir.display(), "no identity key of this node's agent: peers that know its identity take nothing said in its name without it");
            return None;
        }
        NodeKey::load_or_create(dir)
            .inspect_err(|e| tracing::warn!(error = %e, "cannot read this node's identity key"))
            .ok()
    }

    /// The key in `dir`'s [`KEY_FILE`], made and written first if there is
    /// none (mode 0600 from its first byte, whole or not at all). A file
    /// that group or others may read or write is refused, as the gossip
    /// key is.
    pub fn load_or_create(dir: &Path) -> Result<NodeKey, IdentityError> {
        let path = dir.join(KEY_FILE);
        match std::fs::read_to_string(&path) {
            Ok(text) => {
                use std::os::unix::fs::PermissionsExt as _;
                let mode = std::fs::metadata(&path)
                    .map_err(|source| IdentityError::Read {
                        path: path.clone(),
                        source,
                    })?
                    .permissions()
                    .mode()
                    & 0o777;
                if mode & 0o077 != 0 {
                    return Err(IdentityError::Mode { path, mode });
                }
                let text = Zeroizing::new(text);
                let mut seed = Zeroizing::new([0u8; 32]);
                hex::decode_to_slice(text.trim(), &mut *seed)
                    .map_err(|_| IdentityError::Malformed { path: path.clone() })?;
                Ok(NodeKey::from_seed(*seed))
            }
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                std::fs::create_dir_all(dir).map_err(|source| IdentityError::Write {
                    path: path.clone(),
                    source,
                })?;
                let key = NodeKey::generate()?;
                key.write_new(&path)?;
                tracing::info!(file = %path.display(), public = %key.public(), "made this node's identity key");
                Ok(key)
            }
            Err(source) => Err(IdentityError::Read { path, source }),
        }
    }

    /// Writes the seed beside `path`, synced, then links it into place:
    /// never a half-written key, never one replaced.
    fn write_new(&self, path: &Path) -> Result<(), IdentityError> {
        use std::os::unix::fs::OpenOptionsExt as _;
        let err = |source| IdentityError::Write {
            path: path.to_path_buf(),
            source,
        };
        let staged = path.with_extension(format!("new-{}", std::process::id()));
        let mut f = std::fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .mode(0o600)
            .open(&staged)
            .map_err(err)?;
        let hex = Zeroizing::new(hex::encode(self.signing.to_bytes()));
        let written = f
            .write_all(hex.as_bytes())
            .and_then(|()| f.write_all(b"\n"))
            .and_then(|()| f.sync_all());
        let linked = written.and_then(|()| std::fs::hard_link(&staged, path));
        let _ = std::fs::remove_file(&staged);
        linked.map_err(err)
    }

    pub fn public(&self) -> PublicId {
        PublicId(self.signing.verifying_key())
    }

    /// This node's signature over `message`.
    pub fn sign(&self, message: &[u8]) -> [u8; 64] {
        self.signing.sign(message).to_bytes()
    }

    /// The key this node and `peer` (and nobody else) share: X25519 of
    /// this node's secret with the peer's public key, through
    /// HMAC-SHA256 with both public keys in order. `None` for a public key
    /// whose point makes no secret (a low-order point: a forged record).
    pub fn pair_key(&self, peer: &PublicId) -> Option<PairKey> {
        let mine = self.public();
        let shared = Zeroizing::new(
            peer.0
                .to_montgomery()
                .mul_clamped(self.signing.to_scalar_bytes())
                .to_bytes(),
        );
        if shared.iter().all(|b| *b == 0) {
            return None;
        }
        let mut mac = <Hmac<Sha256> as Mac>::new_from_slice(&*shared).expect("any key length");
        mac.update(b"hostlb pair key v1");
        let (a, b) = if mine.as_bytes() <= peer.as_bytes() {
            (mine, *peer)
        } else {
            (*peer, mine)
        };
        mac.update(a.as_bytes());
        mac.update(b.as_bytes());
        Some(PairKey(Zeroizing::new(mac.finalize().into_bytes().into())))
    }
}

/// A key two nodes share (see [`NodeKey::pair_key`]).
#[derive(Clone)]
pub struct PairKey(Zeroizing<[u8; 32]>);

impl fmt::Debug for PairKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("PairKey(..)")
    }
}

/// Bytes of a [`PairKey`] tag: 128 bits, as for HMAC-SHA256-128.
pub const TAG_LEN: usize = 16;

impl PairKey {
    /// The tag of `message` under this key.
    pub fn tag(&self, message: &[u8]) -> [u8; TAG_LEN] {
        let mut mac = <Hmac<Sha256> as Mac>::new_from_slice(&*self.0).expect("any key length");
        mac.update(message);
        let full = mac.finalize().into_bytes();
        let mut out = [0u8; TAG_LEN];
        out.copy_from_slice(&full[..TAG_LEN]);
        out
    }

    /// Whether `tag` is `message`'s, compared in constant time.
    pub fn verifies(&self, message: &[u8], tag: &[u8]) -> bool {
        let mut mac = <Hmac<Sha256> as Mac>::new_from_slice(&*self.0).expect("any key length");
        mac.update(message);
        mac.verify_truncated_left(tag).is_ok() && tag.len() == TAG_LEN
    }
}

fn getrandom(out: &mut [u8]) -> Result<(), IdentityError> {
    use std::io::Read as _;
    std::fs::File::open("/dev/urandom")
        .and_then(|mut f| f.read_exact(out))
        .map_err(|e| IdentityError::Random(e.to_string()))
}

/// What one record says of its node's identity.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum RecordSays<'a> {
    /// Not written by its agent yet (no status): nothing known.
    NotWritten,
    /// Written by an agent of a protocol before identities.
    OlderAgent,
    /// Written by an agent that has one, without it.
    Missing,
    /// This key, as written.
    Key(&'a str),
}

impl<'a> RecordSays<'a> {
    /// From a record's status: its identity, and the protocol it says.
    pub fn of(status: Option<&'a hostlb_api::NodeAgentStatus>) -> RecordSays<'a> {
        let Some(s) = status.filter(|s| s.heartbeat_time.is_some()) else {
            return RecordSays::NotWritten;
        };
        match (
            &s.identity,
            s.protocol.unwrap_or(crate::model::PROTOCOL_UNSAID),
        ) {
            (Some(key), _) => RecordSays::Key(key),
            (None, p) if p >= crate::model::PROTOCOL_IDENTITY => RecordSays::Missing,
            (None, _) => RecordSays::OlderAgent,
        }
    }
}

/// What the records say of a node's identity.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Known {
    /// Its record publishes this key: what it says counts only under it.
    Key(PublicId),
    /// Its record publishes none: an agent of a release before identities,
    /// mid-upgrade, whose word counts as it did then (by the shared key
    /// and the address it comes from).
    NoIdentity,
}

/// Every node's identity as the records last said, shared by the loop
/// (which lists the records) and whatever verifies (the gossip transport,
/// the beats). A node not in it is not known yet: what it says waits,
/// and [`Identities::want`] asks the loop to list the records again.
#[derive(Default)]
pub struct Identities {
    known: RwLock<HashMap<String, Known>>,
    wanted: AtomicBool,
    /// Wakes whoever lists the records when one is wanted.
    notify: tokio::sync::Notify,
    /// Nodes met and not known yet, and when a list of the records first
    /// left them unknown (`None`: none read since they were met). They
    /// count as members not yet confirmed, so a starting agent does not
    /// take itself for alone while its peers' records are read.
    pending: std::sync::Mutex<HashMap<String, Option<std::time::Instant>>>,
}

/// How long a node met and never known counts as pending once a list of
/// the records has left it unknown: past it, a name nobody's record
/// carries (a forger's invention) is no reason to wait. Until a list is
/// read it stays pending, however long: an agent started while the API
/// server is unreachable meets its peers in gossip and cannot read their
/// records, and had it forgotten them by the server's return it would
/// elect as if alone.
pub const PENDING_FOR: std::time::Duration = std::time::Duration::from_secs(10);

impl fmt::Debug for Identities {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Identities({} known)", self.read().len())
    }
}

impl Identities {
    pub fn new() -> Arc<Identities> {
        Arc::default()
    }

    fn read(&self) -> std::sync::RwLockReadGuard<'_, HashMap<String, Known>> {
        self.known.read().unwrap_or_else(|e| e.into_inner())
    }

    /// What is known of `node`; `None` (and a list wanted) when nothing.
    pub fn of(&self, node: &str) -> Option<Known> {
        let known = self.read().get(node).copied();
        if known.is_none() {
            self.pending
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .entry(node.to_string())
                .or_insert(None);
            self.want();
        }
        known
    }

    /// Asks for the records to be listed again: a node met whose identity
    /// is unknown, or whose word does not verify (it may have a new key).
    pub fn want(&self) {
        if !self.wanted.swap(true, Ordering::Relaxed) {
            self.notify.notify_one();
        }
    }

    /// A list still wanted that cannot be asked for yet (the last one was
    /// too recent): noted for the agent's next tick, without waking its
    /// loop, which would otherwise find the same refusal at once, forever.
    pub fn want_later(&self) {
        self.wanted.store(true, Ordering::Relaxed);
    }

    /// Resolves when a list is wanted.
    pub async fn wanted(&self) {
        self.notify.notified().await
    }

    /// Nodes met whose identity is not known, each until [`PENDING_FOR`]
    /// after a list of the records first left it unknown.
    pub fn pending(&self) -> usize {
        self.pending_at(std::time::Instant::now())
    }

    fn pending_at(&self, now: std::time::Instant) -> usize {
        let mut p = self.pending.lock().unwrap_or_else(|e| e.into_inner());
        p.retain(|_, listed| listed.is_none_or(|t| now.saturating_duration_since(t) < PENDING_FOR));
        p.len()
    }

    /// Whether a list was asked for since the last call.
    pub fn take_wanted(&self) -> bool {
        self.wanted.swap(false, Ordering::Relaxed)
    }

    /// Replaces what is known with `records`: each node and what its
    /// record says of its identity. A record whose key does not parse, or
    /// that should name one and does not, makes its node unknown: nothing
    /// in its name counts. Returns those, for the log.
    pub fn learn<'a>(
        &self,
        records: impl IntoIterator<Item = (&'a str, RecordSays<'a>)>,
    ) -> Vec<(String, String)> {
        self.learn_at(records, std::time::Instant::now())
    }

    fn learn_at<'a>(
        &self,
        records: impl IntoIterator<Item = (&'a str, RecordSays<'a>)>,
        now: std::time::Instant,
    ) -> Vec<(String, String)> {
        let mut bad = Vec::new();
        let mut known = HashMap::new();
        for (node, says) in records {
            match says {
                RecordSays::NotWritten => {}
                RecordSays::OlderAgent => {
                    known.insert(node.to_string(), Known::NoIdentity);
                }
                RecordSays::Missing => bad.push((
                    node.to_string(),
                    "its agent has an identity but the record does not show it (a NodeAgent CRD older than the agent drops the field: apply deploy/crds)".to_string(),
                )),
                RecordSays::Key(text) => match text.parse::<PublicId>() {
                    Ok(key) => {
                        known.insert(node.to_string(), Known::Key(key));
                    }
                    Err(why) => bad.push((node.to_string(), why)),
                },
            }
        }
        {
            let mut pending = self.pending.lock().unwrap_or_else(|e| e.into_inner());
            pending.retain(|node, _| !known.contains_key(node));
            for listed in pending.values_mut() {
                listed.get_or_insert(now);
            }
        }
        *self.known.write().unwrap_or_else(|e| e.into_inner()) = known;
        bad
    }

    /// Sets one node's identity (this node's own, at start; tests).
    pub fn set(&self, node: &str, known: Known) {
        self.known
            .write()
            .unwrap_or_else(|e| e.into_inner())
            .insert(node.to_string(), known);
    }

    /// Nodes known, for status and tests.
    pub fn len(&self) -> usize {
        self.read().len()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn key(n: u8) -> NodeKey {
        NodeKey::from_seed([n; 32])
    }

    /// A want that must wait is kept for the next tick and wakes nobody;
    /// a fresh one wakes the loop once.
    #[tokio::test(start_paused = true)]
    async fn a_want_kept_for_later_does_not_wake_the_loop() {
        async fn woken(ids: &Identities) -> bool {
            tokio::time::timeout(std::time::Duration::from_millis(50), ids.wanted())
                .await
                .is_ok()
        }
        let ids = Identities::new();
        ids.want();
        assert!(woken(&ids).await);
        assert!(ids.take_wanted());
        ids.want_later();
        assert!(!woken(&ids).await, "a want kept for later woke the loop");
        assert!(ids.take_wanted(), "and it is still there for the tick");
        assert!(!ids.take_wanted());
    }

    #[test]
    fn a_public_key_round_trips_through_its_record_form() {
        let k = key(1).public();
        let text = k.to_string();
        assert!(text.starts_with("ed25519:"), "{text}");
        assert_eq!(text.parse::<PublicId>().unwrap(), k);
        assert!("ed25519:AAAA".parse::<PublicId>().is_err());
        assert!("rsa:abc".parse::<PublicId>().is_err());
        // The identity point (all zero but the first byte) is weak.
        let mut weak = [0u8; 32];
        weak[0] = 1;
        let b64 = base64::engine::general_purpose::STANDARD_NO_PAD.encode(weak);
        assert!(format!("ed25519:{b64}").parse::<PublicId>().is_err());
    }

    #[test]
    fn signatures_verify_only_under_their_own_key_and_message() {
        let (a, b) = (key(1), key(2));
        let sig = a.sign(b"leaving");
        assert!(a.public().verifies(b"leaving", &sig));
        assert!(!b.public().verifies(b"leaving", &sig));
        assert!(!a.public().verifies(b"staying", &sig));
    }

    /// Two nodes derive the same pair key from each one's own secret; a
    /// third derives another with either.
    #[test]
    fn a_pair_key_is_shared_by_its_two_nodes_alone() {
        let (a, b, c) = (key(1), key(2), key(3));
        let ab = a.pair_key(&b.public()).unwrap();
        let ba = b.pair_key(&a.public()).unwrap();
        let tag = ab.tag(b"beat");
        assert!(ba.verifies(b"beat", &tag));
        assert!(!ba.verifies(b"beat!", &tag));
        let cb = c.pair_key(&b.public()).unwrap();
        assert!(!cb.verifies(b"beat", &tag), "c cannot speak for a to b");
        let ca = c.pair_key(&a.public()).unwrap();
        assert!(!ca.verifies(b"beat", &tag));
        assert!(!ab.verifies(b"beat", &tag[..8]), "a short tag is no tag");
    }

    #[test]
    fn a_key_is_made_once_privately_and_kept() {
        let dir = tempfile::tempdir().unwrap();
        let first = NodeKey::load_or_create(dir.path()).unwrap();
        let again = NodeKey::load_or_create(dir.path()).unwrap();
        assert_eq!(first.public(), again.public(), "kept across restarts");
        use std::os::unix::fs::PermissionsExt as _;
        let path = dir.path().join(KEY_FILE);
        let mode = std::fs::metadata(&path).unwrap().permissions().mode() & 0o777;
        assert_eq!(mode, 0o600);
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o644)).unwrap();
        assert!(matches!(
            NodeKey::load_or_create(dir.path()),
            Err(IdentityError::Mode { .. })
        ));
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o600)).unwrap();
        std::fs::write(&path, "not hex").unwrap();
        assert!(matches!(
            NodeKey::load_or_create(dir.path()),
            Err(IdentityError::Malformed { .. })
        ));
        // Deleted: a new one (a rotation).
        std::fs::remove_file(&path).unwrap();
        let rotated = NodeKey::load_or_create(dir.path()).unwrap();
        assert_ne!(rotated.public(), first.public());
    }

    #[test]
    fn identities_come_from_the_records_and_unknown_nodes_ask_for_them() {
        let ids = Identities::new();
        let a = key(1).public().to_string();
        let bad = ids.learn([
            ("a", RecordSays::Key(a.as_str())),
            ("old", RecordSays::OlderAgent),
            ("x", RecordSays::Key("junk")),
            ("pruned", RecordSays::Missing),
            ("new", RecordSays::NotWritten),
        ]);
        assert_eq!(bad.len(), 2);
        assert_eq!(ids.of("a"), Some(Known::Key(key(1).public())));
        assert_eq!(ids.of("old"), Some(Known::NoIdentity));
        assert!(!ids.take_wanted(), "nothing wanted of known nodes");
        assert_eq!(ids.pending(), 0);
        for (node, what) in [
            ("x", "a record whose key does not parse"),
            ("pruned", "a record that should name a key and does not"),
            ("new", "a record its agent has not written yet"),
        ] {
            assert_eq!(ids.of(node), None, "{what}");
            assert!(ids.take_wanted(), "{what}: the records are wanted");
        }
        assert!(!ids.take_wanted());
        assert_eq!(ids.pending(), 3, "met and not known: unconfirmed members");
        let a = key(1).public().to_string();
        ids.learn([("new", RecordSays::Key(a.as_str()))]);
        assert_eq!(ids.pending(), 2, "known now");
    }

    /// A node met stays pending until a list of the records has left it
    /// unknown for `PENDING_FOR`: met while no list can be read (the API
    /// server unreachable), it is not forgotten meanwhile.
    #[test]
    fn a_node_met_stays_pending_until_a_list_leaves_it_unknown_for_a_while() {
        let ids = Identities::new();
        let t0 = std::time::Instant::now();
        assert_eq!(ids.of("b"), None);
        assert_eq!(ids.pending_at(t0 + PENDING_FOR * 6), 1, "no list read yet");
        let listed = t0 + PENDING_FOR * 6;
        ids.learn_at([("c", RecordSays::OlderAgent)], listed);
        assert_eq!(ids.pending_at(listed + PENDING_FOR / 2), 1);
        assert_eq!(
            ids.pending_at(listed + PENDING_FOR),
            0,
            "a list has not carried it for PENDING_FOR"
        );
    }
}
