//! The authenticated datagram: framing, signing, verification, replay
//! rejection and reassembly. Pure and synchronous: the wall clock comes in as
//! `now_ms`, so every rule is tested without sockets.
//!
//! ```text
//! offset  size  field
//!      0     4  magic "HLG" + format version 0x02
//!      4     1  fragment index (0-based)
//!      5     1  fragment count (1..=MAX_FRAGMENTS)
//!      6     1  tag count t (1..=MAX_KEYS)
//!      7     8  sender id: random per opened socket, big-endian
//!     15     8  sequence number: per sender, +1 per message, big-endian
//!     23     8  timestamp: sender wall clock, ms since the Unix epoch
//!     31    16  destination IP: the receiver's address as the sender
//!               addressed it, IPv6 (IPv4 as ::ffff:a.b.c.d)
//!     47     2  destination UDP port, big-endian
//!     49     n  payload (a chitchat envelope, or one fragment of it)
//!   49+n  32·t  HMAC-SHA256 over bytes [0, 49+n), one per key of the
//!               sender, in key-file order
//! ```
//!
//! A frame carries one tag per configured key, and is accepted when any tag
//! verifies under any accepted key. With one key that is plain
//! HMAC-SHA256 (81 bytes of overhead). During a rotation (`[B, A]`: B is the
//! new key) frames carry both tags, so nodes still on `[A]` and nodes
//! already on `[B]` both talk to the rotating ones: a rotation is two rolling
//! restarts, `[A]` → `[B, A]` → `[B]`, and never splits the cluster.
//!
//! Everything but the tags is under the MAC, so nothing in a frame is
//! trusted before a tag checks out; only the magic and the tag count are read
//! first, to find the tags and to skip the HMAC for traffic that is not ours.
//!
//! The destination binds a frame to its receiver. Without it, a frame
//! captured on its way to one node could be replayed, within the replay
//! window, to every other node from a spoofed source: each would take it for
//! a fresh message and answer the spoofed address with a large reply (an
//! amplifier), and open a loopback port for it. The receiver drops a frame
//! whose destination is not itself ([`Reject::Misdirected`]), so a captured
//! frame is accepted at most once, by the node it was sent to.
//!
//! Version 1 frames (no destination) are rejected as
//! [`Reject::OtherVersion`], never misread: agents before and after the
//! change do not gossip with each other.

use std::collections::HashMap;
use std::collections::hash_map::Entry;
use std::net::{IpAddr, Ipv6Addr, SocketAddr};

use hmac::Mac;
use hmac::digest::{CtOutput, generic_array::GenericArray};

use super::keys::{GossipKeys, MAX_KEYS};

/// The frame format this agent writes and reads.
pub const VERSION: u8 = 2;
pub const MAGIC: [u8; 4] = [b'H', b'L', b'G', VERSION];
pub const HEADER_LEN: usize = 49;
pub const TAG_LEN: usize = 32;
/// Bytes a frame adds to its payload with one key.
pub const OVERHEAD: usize = HEADER_LEN + TAG_LEN;
/// Bytes a frame adds to its payload at most (during a key rotation).
pub const MAX_OVERHEAD: usize = HEADER_LEN + TAG_LEN * MAX_KEYS;
/// The largest UDP payload over IPv4 (65 535 − 20 IP − 8 UDP); chitchat
/// fills its own messages up to exactly this.
pub const MAX_DATAGRAM: usize = 65_507;
/// Two fragments carry anything chitchat can emit (at most [`MAX_DATAGRAM`]
/// bytes, since its encoder itself writes to a UDP socket).
pub const MAX_FRAGMENTS: u8 = 2;
/// The largest message we send, with the largest overhead.
pub const MAX_MESSAGE: usize = (MAX_DATAGRAM - MAX_OVERHEAD) * MAX_FRAGMENTS as usize;
// Anything chitchat emits fits in two fragments, even during a rotation.
const _: () = assert!(MAX_MESSAGE >= MAX_DATAGRAM);
/// Smallest split size that still carries any chitchat message in two.
const MIN_MAX_DATAGRAM: usize = MAX_DATAGRAM.div_ceil(2) + MAX_OVERHEAD;

/// How far back a sequence number may lag the highest seen from its sender
/// and still be accepted once: UDP reorders, but never by this much.
const SEQ_WINDOW: u64 = 128;
/// Half-received messages kept at once; the rest wait in the kernel or are
/// lost like any UDP datagram.
const MAX_PARTIAL: usize = 64;
/// A fragment whose sibling has not come within this is dropped.
const PARTIAL_TIMEOUT_MS: u64 = 5_000;
/// Senders remembered for replay rejection. Only frames with a valid MAC
/// create an entry, so the bound is for safety, not for defence.
const MAX_SENDERS: usize = 16_384;

/// Why a datagram was dropped.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Reject {
    /// Larger than any frame we send.
    Oversized,
    /// Too short, not our magic, or header fields out of range.
    Malformed,
    /// Our magic with another format version: an agent of another release
    /// that cannot talk to this one.
    OtherVersion { version: u8 },
    /// No accepted key produces its tag: wrong key, corruption, forgery.
    BadMac,
    /// Timestamp outside the replay window (a replay, or a badly wrong
    /// clock): the sender's clock minus ours.
    Stale { skew_ms: i64 },
    /// Sequence number already seen from that sender.
    Replayed,
    /// Authentic, but addressed to another node: a replay of a frame
    /// captured on its way there (or a peer that reaches this node on an
    /// address it does not know as its own; see `transport`).
    Misdirected { to: SocketAddr },
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Header {
    pub fragment: u8,
    pub fragments: u8,
    pub tags: u8,
    pub sender: u64,
    pub seq: u64,
    pub timestamp_ms: u64,
    /// The receiver, as the sender addressed it.
    pub destination: SocketAddr,
}

impl Header {
    fn write(&self, out: &mut Vec<u8>) {
        out.extend_from_slice(&MAGIC);
        out.push(self.fragment);
        out.push(self.fragments);
        out.push(self.tags);
        out.extend_from_slice(&self.sender.to_be_bytes());
        out.extend_from_slice(&self.seq.to_be_bytes());
        out.extend_from_slice(&self.timestamp_ms.to_be_bytes());
        let ip = match self.destination.ip() {
            IpAddr::V4(v4) => v4.to_ipv6_mapped(),
            IpAddr::V6(v6) => v6,
        };
        out.extend_from_slice(&ip.octets());
        out.extend_from_slice(&self.destination.port().to_be_bytes());
    }

    fn read(bytes: &[u8]) -> Header {
        let u64_at = |at: usize| {
            let mut b = [0u8; 8];
            b.copy_from_slice(&bytes[at..at + 8]);
            u64::from_be_bytes(b)
        };
        let mut ip = [0u8; 16];
        ip.copy_from_slice(&bytes[31..47]);
        let port = u16::from_be_bytes([bytes[47], bytes[48]]);
        Header {
            fragment: bytes[4],
            fragments: bytes[5],
            tags: bytes[6],
            sender: u64_at(7),
            seq: u64_at(15),
            timestamp_ms: u64_at(23),
            destination: canonical(SocketAddr::new(Ipv6Addr::from(ip).into(), port)),
        }
    }
}

/// Appends one frame signed under every key to `out`; `header.tags` is
/// overwritten with the key count.
pub fn seal_one(keys: &GossipKeys, header: &Header, payload: &[u8], out: &mut Vec<u8>) {
    let start = out.len();
    Header {
        tags: keys.len() as u8,
        ..*header
    }
    .write(out);
    out.extend_from_slice(payload);
    let end = out.len();
    for mut mac in keys.macs() {
        mac.update(&out[start..end]);
        let tag = mac.finalize().into_bytes();
        out.extend_from_slice(&tag);
    }
}

/// Checks size, magic and tag; returns the header and the payload. Replay
/// and freshness are the caller's ([`Inbound`]) business.
pub fn open_one<'a>(keys: &GossipKeys, datagram: &'a [u8]) -> Result<(Header, &'a [u8]), Reject> {
    if datagram.len() > MAX_DATAGRAM {
        return Err(Reject::Oversized);
    }
    if datagram.len() >= 4 && datagram[..3] == MAGIC[..3] && datagram[3] != VERSION {
        return Err(Reject::OtherVersion {
            version: datagram[3],
        });
    }
    if datagram.len() < OVERHEAD || datagram[..4] != MAGIC {
        return Err(Reject::Malformed);
    }
    let tags = datagram[6] as usize;
    if tags == 0 || tags > MAX_KEYS || datagram.len() < HEADER_LEN + TAG_LEN * tags {
        return Err(Reject::Malformed);
    }
    let (signed, tags) = datagram.split_at(datagram.len() - TAG_LEN * tags);
    // One HMAC per accepted key, compared in constant time with every tag.
    let verified = keys.macs().any(|mut mac| {
        mac.update(signed);
        let expected = mac.finalize();
        tags.chunks_exact(TAG_LEN)
            .any(|tag| expected == CtOutput::new(GenericArray::clone_from_slice(tag)))
    });
    if !verified {
        return Err(Reject::BadMac);
    }
    let header = Header::read(signed);
    if header.fragments == 0
        || header.fragments > MAX_FRAGMENTS
        || header.fragment >= header.fragments
    {
        return Err(Reject::Malformed);
    }
    Ok((header, &signed[HEADER_LEN..]))
}

/// A datagram whose tag verified under one of the keys: what the wire
/// reader queues for chitchat's socket, so that nothing unauthenticated
/// is kept (see `transport`). Only [`Verified::open`] makes one.
#[derive(Debug)]
pub struct Verified {
    header: Header,
    datagram: Vec<u8>,
    payload_end: usize,
}

impl Verified {
    /// Checks `datagram` as [`open_one`] does and keeps a copy.
    pub fn open(keys: &GossipKeys, datagram: &[u8]) -> Result<Verified, Reject> {
        let (header, payload) = open_one(keys, datagram)?;
        Ok(Verified {
            header,
            datagram: datagram.to_vec(),
            payload_end: HEADER_LEN + payload.len(),
        })
    }

    pub fn payload(&self) -> &[u8] {
        &self.datagram[HEADER_LEN..self.payload_end]
    }

    /// Bytes kept, for the reader's bound on what it queues.
    pub fn len(&self) -> usize {
        self.datagram.len()
    }

    pub fn is_empty(&self) -> bool {
        self.datagram.is_empty()
    }
}

/// Whether an unfragmented frame's payload starts with `prefix`, without
/// verifying anything: only to route a datagram to the verifier that will
/// (a forged answer just fails verification there).
pub fn payload_starts_with(datagram: &[u8], prefix: &[u8]) -> bool {
    datagram.len() >= OVERHEAD + prefix.len()
        && datagram[..4] == MAGIC
        && datagram[5] == 1
        && datagram[HEADER_LEN..].starts_with(prefix)
}

/// `addr` with an IPv4-mapped IPv6 address turned into IPv4 and no IPv6 flow
/// label or scope, so that the same endpoint compares equal however a socket
/// API spelled it.
pub fn canonical(addr: SocketAddr) -> SocketAddr {
    SocketAddr::new(addr.ip().to_canonical(), addr.port())
}

/// The sending half: numbers, stamps, splits and signs messages.
#[derive(Debug)]
pub struct Outbound {
    sender: u64,
    next_seq: u64,
    max_datagram: usize,
}

impl Outbound {
    pub fn new(sender: u64) -> Outbound {
        Outbound {
            sender,
            next_seq: 1,
            max_datagram: MAX_DATAGRAM,
        }
    }

    /// Splits at a smaller size (clamped to what two fragments of the
    /// largest message need). Only tests want this: it makes chitchat's
    /// ordinary large messages take the fragment path.
    pub fn with_max_datagram(mut self, bytes: usize) -> Outbound {
        self.max_datagram = bytes.clamp(MIN_MAX_DATAGRAM, MAX_DATAGRAM);
        self
    }

    /// The datagrams for one message to `to`, in order. A message that fits
    /// one datagram is sent whole; a larger one (chitchat fills its replies
    /// up to the UDP limit, which our overhead then exceeds) is split evenly
    /// in two.
    pub fn seal(
        &mut self,
        keys: &GossipKeys,
        payload: &[u8],
        to: SocketAddr,
        now_ms: u64,
    ) -> Result<Vec<Vec<u8>>, Reject> {
        let per_frame = self.max_datagram - HEADER_LEN - TAG_LEN * keys.len();
        let fragments = payload.len().div_ceil(per_frame).max(1);
        if fragments > MAX_FRAGMENTS as usize {
            return Err(Reject::Oversized);
        }
        let chunk = payload.len().div_ceil(fragments).max(1);
        let seq = self.next_seq;
        self.next_seq += 1;
        let mut frames = Vec::with_capacity(fragments);
        let mut parts = payload.chunks(chunk);
        for fragment in 0..fragments {
            let part = parts.next().unwrap_or_default();
            let header = Header {
                fragment: fragment as u8,
                fragments: fragments as u8,
                tags: keys.len() as u8,
                sender: self.sender,
                seq,
                timestamp_ms: now_ms,
                destination: to,
            };
            let mut frame = Vec::with_capacity(part.len() + MAX_OVERHEAD);
            seal_one(keys, &header, part, &mut frame);
            frames.push(frame);
        }
        Ok(frames)
    }
}

/// What [`Inbound::accept`] made of a valid datagram.
#[derive(Debug, PartialEq, Eq)]
pub enum Accepted<'a> {
    /// A whole message in one datagram.
    Whole(&'a [u8]),
    /// The last missing fragment arrived: the message, reassembled.
    Reassembled(Vec<u8>),
    /// A fragment, kept until its sibling arrives.
    Pending,
}

/// Which sequence numbers of one sender were seen: the highest, and a bitmap
/// of the [`SEQ_WINDOW`] before it (as IPsec and WireGuard do).
#[derive(Debug)]
struct SeqWindow {
    highest: u64,
    /// Bit `i` set: `highest - i` was seen.
    seen: u128,
    last_ms: u64,
}

impl SeqWindow {
    fn is_new(&self, seq: u64) -> bool {
        if seq > self.highest {
            return true;
        }
        let behind = self.highest - seq;
        behind < SEQ_WINDOW && self.seen & (1u128 << behind) == 0
    }

    fn mark(&mut self, seq: u64, now_ms: u64) {
        if seq > self.highest {
            let shift = seq - self.highest;
            self.seen = if shift >= SEQ_WINDOW {
                0
            } else {
                self.seen << shift
            };
            self.highest = seq;
            self.seen |= 1;
        } else {
            self.seen |= 1u128 << (self.highest - seq);
        }
        self.last_ms = now_ms;
    }
}

#[derive(Debug)]
struct Partial {
    parts: Vec<Option<Vec<u8>>>,
    first_ms: u64,
}

/// The receiving half: freshness, replay and reassembly state for every
/// sender heard from.
#[derive(Debug)]
pub struct Inbound {
    window_ms: u64,
    senders: HashMap<u64, SeqWindow>,
    partial: HashMap<(u64, u64), Partial>,
    next_sweep_ms: u64,
}

impl Inbound {
    /// `window_ms`: how far a frame's timestamp may be from our clock, either
    /// way. It has to cover clock skew between nodes; it also bounds how long
    /// a captured frame stays replayable to a node that has not seen it.
    pub fn new(window_ms: u64) -> Inbound {
        Inbound {
            window_ms,
            senders: HashMap::new(),
            partial: HashMap::new(),
            next_sweep_ms: 0,
        }
    }

    /// Checks one datagram: tag, destination (`for_us` says whether an
    /// address is this receiver's), freshness, replay; then reassembles.
    /// Nothing of a rejected frame is remembered, so a misdirected frame
    /// does not use up its sequence number here.
    pub fn accept<'a>(
        &mut self,
        keys: &GossipKeys,
        datagram: &'a [u8],
        now_ms: u64,
        for_us: impl FnOnce(SocketAddr) -> bool,
    ) -> Result<Accepted<'a>, Reject> {
        let (header, payload) = open_one(keys, datagram)?;
        self.accept_opened(header, payload, now_ms, for_us)
    }

    /// [`Inbound::accept`] of a datagram whose tag [`open_one`] already
    /// checked (the wire reader checks it before it queues anything, see
    /// `transport`): destination, freshness, replay, reassembly.
    pub fn accept_verified<'a>(
        &mut self,
        datagram: &'a Verified,
        now_ms: u64,
        for_us: impl FnOnce(SocketAddr) -> bool,
    ) -> Result<Accepted<'a>, Reject> {
        self.accept_opened(datagram.header, datagram.payload(), now_ms, for_us)
    }

    fn accept_opened<'a>(
        &mut self,
        header: Header,
        payload: &'a [u8],
        now_ms: u64,
        for_us: impl FnOnce(SocketAddr) -> bool,
    ) -> Result<Accepted<'a>, Reject> {
        if !for_us(header.destination) {
            return Err(Reject::Misdirected {
                to: header.destination,
            });
        }
        if header.timestamp_ms.abs_diff(now_ms) > self.window_ms {
            let skew_ms = (header.timestamp_ms as i128 - now_ms as i128)
                .clamp(i64::MIN as i128, i64::MAX as i128) as i64;
            return Err(Reject::Stale { skew_ms });
        }
        self.sweep(now_ms);
        if let Some(window) = self.senders.get(&header.sender)
            && !window.is_new(header.seq)
        {
            return Err(Reject::Replayed);
        }
        if header.fragments == 1 {
            self.mark(header.sender, header.seq, now_ms);
            return Ok(Accepted::Whole(payload));
        }
        let key = (header.sender, header.seq);
        if !self.partial.contains_key(&key) && self.partial.len() >= MAX_PARTIAL {
            let oldest = self
                .partial
                .iter()
                .min_by_key(|(_, p)| p.first_ms)
                .map(|(k, _)| *k);
            if let Some(oldest) = oldest {
                self.partial.remove(&oldest);
            }
        }
        let entry = self.partial.entry(key).or_insert_with(|| Partial {
            parts: vec![None; header.fragments as usize],
            first_ms: now_ms,
        });
        if entry.parts.len() != header.fragments as usize {
            // Same sender and sequence but a different count: only a buggy or
            // key-holding hostile sender does that. Keep neither.
            self.partial.remove(&key);
            return Err(Reject::Malformed);
        }
        entry.parts[header.fragment as usize] = Some(payload.to_vec());
        if entry.parts.iter().any(Option::is_none) {
            return Ok(Accepted::Pending);
        }
        let parts = match self.partial.entry(key) {
            Entry::Occupied(e) => e.remove().parts,
            Entry::Vacant(_) => unreachable!("entry inserted above"),
        };
        self.mark(header.sender, header.seq, now_ms);
        Ok(Accepted::Reassembled(
            parts.into_iter().flatten().flatten().collect(),
        ))
    }

    fn mark(&mut self, sender: u64, seq: u64, now_ms: u64) {
        if !self.senders.contains_key(&sender) && self.senders.len() >= MAX_SENDERS {
            let oldest = self
                .senders
                .iter()
                .min_by_key(|(_, w)| w.last_ms)
                .map(|(k, _)| *k);
            if let Some(oldest) = oldest {
                self.senders.remove(&oldest);
            }
        }
        self.senders
            .entry(sender)
            .or_insert(SeqWindow {
                highest: seq,
                seen: 0,
                last_ms: now_ms,
            })
            .mark(seq, now_ms);
    }

    /// Forgets senders silent for two windows: any frame of theirs we saw
    /// carried a timestamp at most `last + window`, which is by now outside
    /// the window, so it is rejected as stale without the sequence state.
    fn sweep(&mut self, now_ms: u64) {
        if now_ms < self.next_sweep_ms {
            return;
        }
        self.next_sweep_ms = now_ms.saturating_add(self.window_ms.max(1_000));
        let keep_after = now_ms.saturating_sub(2 * self.window_ms);
        self.senders.retain(|_, w| w.last_ms >= keep_after);
        let partial_after = now_ms.saturating_sub(PARTIAL_TIMEOUT_MS);
        self.partial.retain(|_, p| p.first_ms >= partial_after);
    }

    /// Senders currently remembered (for tests and metrics).
    pub fn senders(&self) -> usize {
        self.senders.len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn keys(bytes: &[&[u8; 32]]) -> GossipKeys {
        GossipKeys::from_keys(bytes).unwrap()
    }

    const KA: &[u8; 32] = &[0xa; 32];
    const KB: &[u8; 32] = &[0xb; 32];
    const NOW: u64 = 1_700_000_000_000;
    const WINDOW: u64 = 30_000;
    /// The receiver in these tests.
    const ME: SocketAddr = SocketAddr::new(IpAddr::V4(std::net::Ipv4Addr::new(10, 0, 0, 1)), 7934);

    fn for_me(to: SocketAddr) -> bool {
        to == ME
    }

    fn seal(k: &GossipKeys, out: &mut Outbound, payload: &[u8], at: u64) -> Vec<Vec<u8>> {
        out.seal(k, payload, ME, at).unwrap()
    }

    #[test]
    fn round_trip_and_overhead() {
        let k = keys(&[KA]);
        let mut out = Outbound::new(7);
        let frames = seal(&k, &mut out, b"hello", NOW);
        assert_eq!(frames.len(), 1);
        assert_eq!(frames[0].len(), 5 + OVERHEAD);
        let mut inb = Inbound::new(WINDOW);
        assert_eq!(
            inb.accept(&k, &frames[0], NOW, for_me),
            Ok(Accepted::Whole(&b"hello"[..]))
        );
    }

    #[test]
    fn empty_payload_is_one_frame() {
        let k = keys(&[KA]);
        let frames = seal(&k, &mut Outbound::new(1), b"", NOW);
        assert_eq!(frames.len(), 1);
        let mut inb = Inbound::new(WINDOW);
        assert_eq!(
            inb.accept(&k, &frames[0], NOW, for_me),
            Ok(Accepted::Whole(&[][..]))
        );
    }

    #[test]
    fn every_single_bit_flip_is_rejected() {
        let k = keys(&[KA]);
        let frame = seal(&k, &mut Outbound::new(1), b"payload", NOW).remove(0);
        for byte in 0..frame.len() {
            for bit in 0..8 {
                let mut bad = frame.clone();
                bad[byte] ^= 1 << bit;
                let got = Inbound::new(WINDOW).accept(&k, &bad, NOW, for_me);
                assert!(
                    matches!(
                        got,
                        Err(Reject::BadMac | Reject::Malformed | Reject::OtherVersion { .. })
                    ),
                    "flip at {byte}:{bit} gave {got:?}"
                );
            }
        }
    }

    #[test]
    fn truncations_and_junk_are_rejected() {
        let k = keys(&[KA]);
        let frame = seal(&k, &mut Outbound::new(1), b"payload", NOW).remove(0);
        for len in 0..frame.len() {
            let got = Inbound::new(WINDOW).accept(&k, &frame[..len], NOW, for_me);
            assert!(
                matches!(got, Err(Reject::BadMac | Reject::Malformed)),
                "truncated to {len}: {got:?}"
            );
        }
        let junk: Vec<u8> = (0..200u32).map(|i| (i * 37 % 251) as u8).collect();
        assert_eq!(
            Inbound::new(WINDOW).accept(&k, &junk, NOW, for_me),
            Err(Reject::Malformed)
        );
        // Our magic and a plausible tag count, but no valid tag.
        let mut magic_junk = MAGIC.to_vec();
        magic_junk.extend_from_slice(&junk);
        magic_junk[6] = 1;
        assert_eq!(
            Inbound::new(WINDOW).accept(&k, &magic_junk, NOW, for_me),
            Err(Reject::BadMac)
        );
        let huge = vec![0u8; MAX_DATAGRAM + 1];
        assert_eq!(
            Inbound::new(WINDOW).accept(&k, &huge, NOW, for_me),
            Err(Reject::Oversized)
        );
    }

    #[test]
    fn rotation_carries_a_tag_per_key_and_accepts_any() {
        let a = keys(&[KA]);
        let b = keys(&[KB]);
        let ba = keys(&[KB, KA]);
        let from_a = seal(&a, &mut Outbound::new(1), b"x", NOW).remove(0);
        let from_b = seal(&b, &mut Outbound::new(2), b"x", NOW).remove(0);
        let from_ba = seal(&ba, &mut Outbound::new(3), b"x", NOW).remove(0);
        assert_eq!(from_ba.len(), from_a.len() + TAG_LEN);
        let ok = |k: &GossipKeys, f: &[u8]| Inbound::new(WINDOW).accept(k, f, NOW, for_me).is_ok();
        // [B, A] talks with [A] and with [B], both ways.
        assert!(ok(&ba, &from_a) && ok(&a, &from_ba));
        assert!(ok(&ba, &from_b) && ok(&b, &from_ba));
        // [A] and [B] do not.
        assert_eq!(
            Inbound::new(WINDOW).accept(&a, &from_b, NOW, for_me),
            Err(Reject::BadMac)
        );
        assert_eq!(
            Inbound::new(WINDOW).accept(&b, &from_a, NOW, for_me),
            Err(Reject::BadMac)
        );
        // Dropping the tag a receiver could verify leaves nothing it accepts.
        let mut only_b = from_ba.clone();
        only_b.truncate(from_ba.len() - TAG_LEN);
        only_b[6] = 1;
        assert_eq!(
            Inbound::new(WINDOW).accept(&a, &only_b, NOW, for_me),
            Err(Reject::BadMac)
        );
    }

    #[test]
    fn frames_outside_the_window_are_stale() {
        let k = keys(&[KA]);
        let mut out = Outbound::new(1);
        let old = seal(&k, &mut out, b"x", NOW - WINDOW - 1).remove(0);
        let future = seal(&k, &mut out, b"x", NOW + WINDOW + 1).remove(0);
        let edge = seal(&k, &mut out, b"x", NOW - WINDOW).remove(0);
        let mut inb = Inbound::new(WINDOW);
        assert_eq!(
            inb.accept(&k, &old, NOW, for_me),
            Err(Reject::Stale {
                skew_ms: -(WINDOW as i64) - 1
            })
        );
        assert_eq!(
            inb.accept(&k, &future, NOW, for_me),
            Err(Reject::Stale {
                skew_ms: WINDOW as i64 + 1
            })
        );
        assert!(inb.accept(&k, &edge, NOW, for_me).is_ok());
    }

    #[test]
    fn replays_are_rejected_reordering_is_not() {
        let k = keys(&[KA]);
        let mut out = Outbound::new(9);
        let frames: Vec<Vec<u8>> = (0..5)
            .map(|_| seal(&k, &mut out, b"m", NOW).remove(0))
            .collect();
        let mut inb = Inbound::new(WINDOW);
        // Arrive as 0, 3, 1, 4, 2: all new.
        for i in [0, 3, 1, 4, 2] {
            assert!(inb.accept(&k, &frames[i], NOW, for_me).is_ok(), "frame {i}");
        }
        for (i, frame) in frames.iter().enumerate() {
            assert_eq!(
                inb.accept(&k, frame, NOW + 10, for_me),
                Err(Reject::Replayed),
                "frame {i}"
            );
        }
        // Another sender's sequence numbers are independent.
        let other = seal(&k, &mut Outbound::new(10), b"m", NOW).remove(0);
        assert!(inb.accept(&k, &other, NOW, for_me).is_ok());
    }

    #[test]
    fn far_behind_sequence_is_rejected() {
        let k = keys(&[KA]);
        let mut out = Outbound::new(3);
        let first = seal(&k, &mut out, b"m", NOW).remove(0);
        let mut later = Vec::new();
        for _ in 0..SEQ_WINDOW + 1 {
            later = seal(&k, &mut out, b"m", NOW).remove(0);
        }
        let mut inb = Inbound::new(WINDOW);
        assert!(inb.accept(&k, &later, NOW, for_me).is_ok());
        assert_eq!(inb.accept(&k, &first, NOW, for_me), Err(Reject::Replayed));
    }

    #[test]
    fn silent_senders_are_forgotten_and_their_frames_stay_stale() {
        let k = keys(&[KA]);
        let frame = seal(&k, &mut Outbound::new(5), b"m", NOW).remove(0);
        let mut inb = Inbound::new(WINDOW);
        assert!(inb.accept(&k, &frame, NOW, for_me).is_ok());
        let fresh = seal(&k, &mut Outbound::new(6), b"m", NOW + 3 * WINDOW).remove(0);
        assert!(inb.accept(&k, &fresh, NOW + 3 * WINDOW, for_me).is_ok());
        assert_eq!(inb.senders(), 1, "sender 5 swept");
        assert!(matches!(
            inb.accept(&k, &frame, NOW + 3 * WINDOW, for_me),
            Err(Reject::Stale { .. })
        ));
    }

    #[test]
    fn large_messages_split_in_two_and_reassemble_in_any_order() {
        let k = keys(&[KA]);
        let payload: Vec<u8> = (0..MAX_DATAGRAM).map(|i| (i % 253) as u8).collect();
        let mut out = Outbound::new(4);
        let frames = seal(&k, &mut out, &payload, NOW);
        assert_eq!(frames.len(), 2);
        assert!(frames.iter().all(|f| f.len() <= MAX_DATAGRAM));
        let mut inb = Inbound::new(WINDOW);
        assert_eq!(
            inb.accept(&k, &frames[1], NOW, for_me),
            Ok(Accepted::Pending)
        );
        // A duplicate of a pending fragment changes nothing.
        assert_eq!(
            inb.accept(&k, &frames[1], NOW, for_me),
            Ok(Accepted::Pending)
        );
        let whole = inb.accept(&k, &frames[0], NOW, for_me);
        assert!(
            whole == Ok(Accepted::Reassembled(payload.clone())),
            "not reassembled"
        );
        // Once delivered, either fragment again is a replay.
        assert_eq!(
            inb.accept(&k, &frames[0], NOW, for_me),
            Err(Reject::Replayed)
        );
        assert_eq!(
            inb.accept(&k, &frames[1], NOW, for_me),
            Err(Reject::Replayed)
        );
        // The largest single-frame payload is not split.
        let max_whole = vec![1u8; MAX_DATAGRAM - OVERHEAD];
        let frames = seal(&k, &mut out, &max_whole, NOW);
        assert_eq!(frames.len(), 1);
        assert_eq!(frames[0].len(), MAX_DATAGRAM);
        let too_big = vec![0u8; 2 * (MAX_DATAGRAM - OVERHEAD) + 1];
        assert!(matches!(
            out.seal(&k, &too_big, ME, NOW),
            Err(Reject::Oversized)
        ));
    }

    #[test]
    fn a_frame_is_accepted_only_by_the_receiver_it_was_addressed_to() {
        let k = keys(&[KA]);
        let other: SocketAddr = "10.0.0.2:7934".parse().unwrap();
        let to_other = Outbound::new(8)
            .seal(&k, b"syn", other, NOW)
            .unwrap()
            .remove(0);
        // Replayed to us: authentic, recent, never seen, and still refused.
        let mut inb = Inbound::new(WINDOW);
        assert_eq!(
            inb.accept(&k, &to_other, NOW, for_me),
            Err(Reject::Misdirected { to: other })
        );
        assert_eq!(inb.senders(), 0, "nothing of it is remembered");
        // The node it was for takes it.
        assert_eq!(
            Inbound::new(WINDOW).accept(&k, &to_other, NOW, |to| to == other),
            Ok(Accepted::Whole(&b"syn"[..]))
        );
        // Rewriting the destination to ours breaks the tag.
        let mut redirected = to_other.clone();
        let IpAddr::V4(me) = ME.ip() else {
            unreachable!()
        };
        redirected[31..47].copy_from_slice(&me.to_ipv6_mapped().octets());
        redirected[47..49].copy_from_slice(&ME.port().to_be_bytes());
        assert_eq!(
            inb.accept(&k, &redirected, NOW, for_me),
            Err(Reject::BadMac)
        );
    }

    #[test]
    fn destinations_of_both_families_round_trip() {
        let k = keys(&[KA]);
        for (to, seen) in [
            ("10.0.0.1:7934", "10.0.0.1:7934"),
            ("[fd00::1]:1", "[fd00::1]:1"),
            ("[::ffff:10.0.0.1]:7934", "10.0.0.1:7934"),
        ] {
            let to: SocketAddr = to.parse().unwrap();
            let frame = Outbound::new(1).seal(&k, b"x", to, NOW).unwrap().remove(0);
            let (header, payload) = open_one(&k, &frame).unwrap();
            assert_eq!(header.destination, seen.parse::<SocketAddr>().unwrap());
            assert_eq!(payload, b"x");
        }
    }

    #[test]
    fn another_format_version_is_named_not_misread() {
        let k = keys(&[KA]);
        let mut frame = seal(&k, &mut Outbound::new(1), b"x", NOW).remove(0);
        frame[3] = 1;
        assert_eq!(
            Inbound::new(WINDOW).accept(&k, &frame, NOW, for_me),
            Err(Reject::OtherVersion { version: 1 })
        );
        // Short as a version 1 frame with an empty payload was.
        assert_eq!(
            open_one(&k, &frame[..63]).map(|_| ()),
            Err(Reject::OtherVersion { version: 1 })
        );
    }

    #[test]
    fn inconsistent_fragment_header_is_malformed() {
        let k = keys(&[KA]);
        for (fragment, fragments) in [(0u8, 0u8), (2, 2), (0, MAX_FRAGMENTS + 1)] {
            let header = Header {
                fragment,
                fragments,
                tags: 1,
                sender: 1,
                seq: 1,
                timestamp_ms: NOW,
                destination: ME,
            };
            let mut frame = Vec::new();
            seal_one(&k, &header, b"x", &mut frame);
            assert_eq!(
                Inbound::new(WINDOW).accept(&k, &frame, NOW, for_me),
                Err(Reject::Malformed),
                "{fragment}/{fragments}"
            );
        }
    }
}
