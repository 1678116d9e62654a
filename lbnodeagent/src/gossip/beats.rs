//! Beats: the owner sessions' messages (see the agent core's `sessions`),
//! on the gossip socket beside the failure detector's, signed and
//! replay-checked the same way and under the same sender id.
//!
//! A beat is [`BEAT_MARK`], a format byte, the sender's node name (one
//! length byte, UTF-8), two big-endian u32: milliseconds until the first
//! and the last of the sender's addresses lapse ([`NO_LAPSE`] in both when
//! it holds none with a finite lifetime), and from format 2 a flags byte
//! and the sender's gossip generation (big-endian u64, 0 when unknown:
//! `cleanup` does not know it). 24 to 278 bytes before the frame's own 81.
//! The generation keeps a restarted agent's beats from vouching for its
//! previous run, which peers may still see in gossip holding addresses
//! that are gone. Beats are read by the detector's task, which sees every
//! verified message of its mark family first, and handed on as they are.
//!
//! A *leaving* beat ([`LEAVING`]) is what `cleanup` sends to every peer it
//! knows when the agent is gone: the node's addresses still answer and are
//! removed once others answer for them, so peers take them over at once,
//! as from a node handing over on SIGTERM. An agent of format 1 reads it
//! as an ordinary beat (the flags follow what it knows) and learns the
//! same from gossip, later.
//!
//! A *relay* ([`SILENT`]) is followed by the silent owner's name, lapse
//! and generation, in the same encoding. A format-1 agent reads it as an
//! ordinary beat of the sender, which is true.
//!
//! From format 3 a beat ends with its sender's proof that it is its own
//! ([`Proof`]): a kind byte, a counter (the sender's clock in microseconds,
//! growing through its run) and either an HMAC under the key only sender
//! and receiver share (owner beats and relays, many a second; see
//! `identity`) or the sender's Ed25519 signature (a leaving beat, sent to
//! every peer, by `cleanup` too). The shared gossip key proves only
//! membership; the proof is what lets a receiver believe a beat in a
//! node's name is that node's, and the counter that it is not an old one
//! played back. A format-2 agent reads a format-3 beat as its own, the
//! proof unread.

use std::net::SocketAddr;
use std::time::Duration;

use super::link::BEAT_MARK;

const FORMAT: u8 = 3;
/// Proof kinds (see [`Proof`]).
const PROOF_PAIR: u8 = 1;
const PROOF_SIGNED: u8 = 2;
/// What a leaving beat's signature covers starts with this.
const SIGNED_DOMAIN: &[u8] = b"hostlb beat v1\0";
/// Flag: the sender's agent is gone and its addresses are about to be
/// removed (see the module docs).
pub const LEAVING: u8 = 1;
/// Flag: a relay (see the agent core's sessions): the sender watches the
/// owner named after the sender's own fields and finds it silent.
pub const SILENT: u8 = 2;
/// Flag: the sender watches the receiver, which is to beat it densely (a
/// format-1 beat is taken as saying so: that release answered every beat).
pub const WATCHING: u8 = 4;
/// Both lapse fields when nothing lapses.
pub const NO_LAPSE: u32 = u32::MAX;
/// A leaving beat goes out this many times, [`LEAVING_EVERY`] apart: at
/// 5% datagram loss each way a peer misses all of them about once in 10
/// million, and one lost costs it only that interval.
pub const LEAVING_ROUNDS: u32 = 8;
pub const LEAVING_EVERY: Duration = Duration::from_millis(5);

/// Sends `node`'s leaving beat to every peer, [`LEAVING_ROUNDS`] times,
/// signed with the node's key (`key`; `None` only for an agent that has
/// none, which peers that know its identity refuse), each round under a
/// new count from `counter`: the run's own, so that its other beats, sent
/// meanwhile, never make a later round look played back, nor a round
/// overtake them on the wire ([`Counter::send`]).
pub async fn send_leaving(
    node: &str,
    generation: Option<u64>,
    key: Option<&crate::identity::NodeKey>,
    counter: &Counter,
    peers: &[SocketAddr],
    send: impl Fn(SocketAddr, &[u8]),
) {
    let mut payload = Vec::new();
    let message = BeatMessage {
        node: node.to_string(),
        generation,
        lapse: None,
        leaving: true,
        watching: false,
        silent: None,
    };
    message.encode(&mut payload);
    let body = payload.len();
    for round in 0..LEAVING_ROUNDS {
        if round > 0 {
            tokio::time::sleep(LEAVING_EVERY).await;
        }
        counter.send(|count| {
            if let Some(key) = key {
                payload.truncate(body);
                Proof::sign(&mut payload, count, key);
            }
            for p in peers {
                send(*p, &payload);
            }
        });
    }
}

/// The counter of a beat sent now: the wall clock in microseconds. A
/// run's beats come from one process whose counter only grows
/// ([`Counter`]); `cleanup`, later, speaks for a dead run with a larger one.
pub fn counter_now() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_micros() as u64)
        .unwrap_or(0)
}

/// A sender's counter: [`counter_now`], but always past the last one;
/// and the order its proofs go on the wire in.
#[derive(Debug, Default)]
pub struct Counter(std::sync::Mutex<u64>);

impl Counter {
    /// Runs `send` with the next count, alone: whatever is proved with a
    /// count goes out before anything proved with a later one. A run's
    /// beats come from two tasks (the beat task, and a leave's rounds); if
    /// one took a count and the other sent a later one first (a signature
    /// takes a while, a thread may be preempted), peers would refuse the
    /// earlier one as played back (a reordering the network itself
    /// hardly ever makes on one LAN).
    pub fn send<R>(&self, send: impl FnOnce(u64) -> R) -> R {
        let mut last = self.0.lock().unwrap_or_else(|p| p.into_inner());
        let next = counter_now().max(*last + 1);
        *last = next;
        send(next)
    }
}

/// A beat's proof that it is its sender's (see the module docs).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Proof {
    pub counter: u64,
    pub kind: ProofKind,
    /// The bytes the tag or signature covers: the beat and the proof's
    /// kind and counter.
    pub covered: Vec<u8>,
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ProofKind {
    /// An HMAC under the key sender and receiver share.
    Pair([u8; crate::identity::TAG_LEN]),
    /// The sender's Ed25519 signature.
    Signed([u8; 64]),
}

impl Proof {
    /// Appends a pair proof to the beat in `out`.
    pub fn pair(out: &mut Vec<u8>, counter: u64, key: &crate::identity::PairKey) {
        out.push(PROOF_PAIR);
        out.extend_from_slice(&counter.to_be_bytes());
        let tag = key.tag(out);
        out.extend_from_slice(&tag);
    }

    /// Appends a signed proof to the beat in `out`.
    pub fn sign(out: &mut Vec<u8>, counter: u64, key: &crate::identity::NodeKey) {
        out.push(PROOF_SIGNED);
        out.extend_from_slice(&counter.to_be_bytes());
        let mut signed = SIGNED_DOMAIN.to_vec();
        signed.extend_from_slice(out);
        out.extend_from_slice(&key.sign(&signed));
    }

    /// Whether the proof is `from`'s: its signature, or its tag under the
    /// key this node shares with it (`pair`, derived on demand).
    pub fn verifies(
        &self,
        from: &crate::identity::PublicId,
        pair: impl FnOnce() -> Option<crate::identity::PairKey>,
    ) -> bool {
        match &self.kind {
            ProofKind::Pair(tag) => pair().is_some_and(|k| k.verifies(&self.covered, tag)),
            ProofKind::Signed(sig) => {
                let mut signed = SIGNED_DOMAIN.to_vec();
                signed.extend_from_slice(&self.covered);
                from.verifies(&signed, sig)
            }
        }
    }
}

/// One beat as sent and received.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct BeatMessage {
    pub node: String,
    /// The sender's gossip generation, when it knows it (never 0).
    pub generation: Option<u64>,
    /// Until the first and the last of the sender's addresses lapse.
    pub lapse: Option<(Duration, Duration)>,
    pub leaving: bool,
    pub watching: bool,
    /// A relay: the sender watches this owner and finds it silent.
    pub silent: Option<Subject>,
}

/// A relay's silent owner: its name, run, and lapse as its last beat said.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Subject {
    pub node: String,
    pub generation: Option<u64>,
    pub lapse: Option<(Duration, Duration)>,
}

impl BeatMessage {
    pub fn encode(&self, out: &mut Vec<u8>) {
        out.clear();
        out.extend_from_slice(&BEAT_MARK);
        out.push(FORMAT);
        put_node(out, &self.node, self.lapse);
        let mut flags = 0;
        if self.leaving {
            flags |= LEAVING;
        }
        if self.silent.is_some() {
            flags |= SILENT;
        }
        if self.watching {
            flags |= WATCHING;
        }
        out.push(flags);
        out.extend_from_slice(&self.generation.unwrap_or(0).to_be_bytes());
        if let Some(s) = &self.silent {
            put_node(out, &s.node, s.lapse);
            out.extend_from_slice(&s.generation.unwrap_or(0).to_be_bytes());
        }
    }

    /// `None` for anything that is not a beat of a known format. Longer
    /// messages are read up to what this format knows, so a later format
    /// may append fields.
    pub fn decode(payload: &[u8]) -> Option<BeatMessage> {
        Self::decode_proved(payload).map(|(m, _)| m)
    }

    /// [`BeatMessage::decode`], and the beat's proof when it carries one
    /// (format 3 and later).
    pub fn decode_proved(payload: &[u8]) -> Option<(BeatMessage, Option<Proof>)> {
        let (message, format, rest) = Self::decode_body(payload)?;
        let proof = (format >= 3).then(|| {
            let at = payload.len() - rest.len();
            let mut r = Reader(rest);
            let kind = r.byte()?;
            let counter = u64::from_be_bytes(r.take(8)?.try_into().ok()?);
            let covered = payload[..at + 9].to_vec();
            let kind = match kind {
                PROOF_PAIR => ProofKind::Pair(r.take(crate::identity::TAG_LEN)?.try_into().ok()?),
                PROOF_SIGNED => ProofKind::Signed(r.take(64)?.try_into().ok()?),
                _ => return None,
            };
            Some(Proof {
                counter,
                kind,
                covered,
            })
        });
        Some((message, proof.flatten()))
    }

    /// The beat, its format and what follows it.
    fn decode_body(payload: &[u8]) -> Option<(BeatMessage, u8, &[u8])> {
        let mut r = Reader(payload.strip_prefix(&BEAT_MARK)?);
        let format = r.byte()?;
        if format == 0 {
            return None;
        }
        let (node, lapse) = r.node()?;
        let (flags, generation) = if format >= 2 {
            (r.byte()?, r.generation()?)
        } else {
            (WATCHING, None)
        };
        let silent = if flags & SILENT != 0 {
            let (node, lapse) = r.node()?;
            Some(Subject {
                node,
                lapse,
                generation: r.generation()?,
            })
        } else {
            None
        };
        Some((
            BeatMessage {
                node,
                generation,
                lapse,
                leaving: flags & LEAVING != 0,
                watching: flags & WATCHING != 0,
                silent,
            },
            format,
            r.0,
        ))
    }
}

/// A node's name (one length byte, at most 255 bytes of it) and its lapse.
fn put_node(out: &mut Vec<u8>, node: &str, lapse: Option<(Duration, Duration)>) {
    let name = &node.as_bytes()[..node.len().min(u8::MAX as usize)];
    out.push(name.len() as u8);
    out.extend_from_slice(name);
    let ms = |d: Duration| u32::try_from(d.as_millis()).unwrap_or(NO_LAPSE - 1);
    let (first, last) = lapse.map_or((NO_LAPSE, NO_LAPSE), |(f, l)| (ms(f), ms(l)));
    out.extend_from_slice(&first.to_be_bytes());
    out.extend_from_slice(&last.to_be_bytes());
}

struct Reader<'a>(&'a [u8]);

impl Reader<'_> {
    fn take(&mut self, n: usize) -> Option<&[u8]> {
        let (head, rest) = self.0.split_at_checked(n)?;
        self.0 = rest;
        Some(head)
    }

    fn byte(&mut self) -> Option<u8> {
        self.take(1).map(|b| b[0])
    }

    fn u32(&mut self) -> Option<u32> {
        Some(u32::from_be_bytes(self.take(4)?.try_into().ok()?))
    }

    /// 0 is no generation.
    fn generation(&mut self) -> Option<Option<u64>> {
        let g = u64::from_be_bytes(self.take(8)?.try_into().ok()?);
        Some((g != 0).then_some(g))
    }

    fn node(&mut self) -> Option<(String, Option<(Duration, Duration)>)> {
        let len = self.byte()?;
        let node = std::str::from_utf8(self.take(len.into())?)
            .ok()?
            .to_string();
        let (first, last) = (self.u32()?, self.u32()?);
        if node.is_empty() {
            return None;
        }
        let lapse = (first != NO_LAPSE && last != NO_LAPSE).then(|| {
            (
                Duration::from_millis(first.into()),
                Duration::from_millis(last.max(first).into()),
            )
        });
        Some((node, lapse))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_trip_and_size() {
        let mut out = Vec::new();
        for lapse in [
            None,
            Some((Duration::from_millis(4_980), Duration::from_millis(5_000))),
        ] {
            for (leaving, generation) in [(false, Some(1_790_000_000_123)), (true, None)] {
                let mut m = BeatMessage {
                    node: "node-a".into(),
                    generation,
                    lapse,
                    leaving,
                    watching: !leaving,
                    silent: None,
                };
                m.encode(&mut out);
                assert_eq!(out.len(), 4 + 1 + 1 + 6 + 8 + 1 + 8);
                assert_eq!(
                    BeatMessage::decode_proved(&out),
                    Some((m.clone(), None)),
                    "no proof yet"
                );
                assert_eq!(BeatMessage::decode(&out), Some(m.clone()));
                m.silent = Some(Subject {
                    node: "node-bb".into(),
                    generation: Some(9),
                    lapse: lapse.map(|(f, l)| (f * 2, l * 2)),
                });
                m.encode(&mut out);
                assert_eq!(out.len(), 4 + 1 + 1 + 6 + 8 + 1 + 8 + 1 + 7 + 8 + 8);
                assert_eq!(BeatMessage::decode(&out), Some(m));
            }
        }
    }

    /// A beat of the previous release (format 1: no flags byte), as it
    /// sends it, and how that release reads this one's leaving beat.
    #[test]
    fn format_one_is_read_and_reads_ours() {
        let old = b"HLB\x01\x01\x06node-a\x00\x00\x13\x74\x00\x00\x13\x88";
        assert_eq!(
            BeatMessage::decode(old),
            Some(BeatMessage {
                node: "node-a".into(),
                generation: None,
                lapse: Some((Duration::from_millis(4_980), Duration::from_millis(5_000))),
                leaving: false,
                watching: true,
                silent: None,
            })
        );
        let mut ours = Vec::new();
        BeatMessage {
            node: "node-a".into(),
            generation: Some(7),
            lapse: None,
            leaving: true,
            watching: false,
            silent: None,
        }
        .encode(&mut ours);
        // Format 1's reader: format >= 1, then name and lapse; the rest is
        // not looked at.
        assert!(ours[4] >= 1);
        assert_eq!(&ours[5..12], b"\x06node-a");
        assert_eq!(&ours[12..20], &[0xff; 8]);
    }

    #[test]
    fn junk_and_truncations_are_refused_longer_is_read() {
        let mut out = Vec::new();
        BeatMessage {
            node: "n".into(),
            generation: Some(7),
            lapse: None,
            leaving: true,
            watching: false,
            silent: Some(Subject {
                node: "o".into(),
                generation: None,
                lapse: None,
            }),
        }
        .encode(&mut out);
        for cut in 0..out.len() {
            assert_eq!(BeatMessage::decode(&out[..cut]), None, "cut at {cut}");
        }
        let mut longer = out.clone();
        longer.extend_from_slice(b"future fields");
        longer[4] = FORMAT + 1;
        assert_eq!(
            BeatMessage::decode(&longer).map(|m| (
                m.node,
                m.generation,
                m.leaving,
                m.silent.is_some()
            )),
            Some(("n".into(), Some(7), true, true))
        );
        let mut bad = out.clone();
        bad[6] = 0xff;
        assert_eq!(BeatMessage::decode(&bad), None, "not UTF-8");
        assert_eq!(BeatMessage::decode(b"HLS\x01junk"), None);
    }

    /// A beat proves its sender by a tag under the pair key (the receiver
    /// shares it) or by the sender's signature (anyone with its record
    /// checks it); another node's key, or a changed byte, does not.
    #[test]
    fn a_proof_verifies_only_for_its_sender_and_its_bytes() {
        use crate::identity::NodeKey;
        let (a, b, c) = (
            NodeKey::from_seed([1; 32]),
            NodeKey::from_seed([2; 32]),
            NodeKey::from_seed([3; 32]),
        );
        let m = BeatMessage {
            node: "a".into(),
            generation: Some(7),
            lapse: None,
            leaving: false,
            watching: true,
            silent: None,
        };
        let mut out = Vec::new();
        m.encode(&mut out);
        Proof::pair(&mut out, 42, &a.pair_key(&b.public()).unwrap());
        let (got, proof) = BeatMessage::decode_proved(&out).unwrap();
        assert_eq!(got, m);
        let proof = proof.unwrap();
        assert_eq!(proof.counter, 42);
        assert!(proof.verifies(&a.public(), || b.pair_key(&a.public())));
        assert!(
            !proof.verifies(&c.public(), || b.pair_key(&c.public())),
            "c in a's name"
        );
        let mut changed = out.clone();
        changed[6] ^= 1;
        let forged = BeatMessage::decode_proved(&changed).and_then(|(_, p)| p);
        assert!(forged.is_none_or(|p| !p.verifies(&a.public(), || b.pair_key(&a.public()))));

        let mut leaving = Vec::new();
        BeatMessage {
            leaving: true,
            ..m.clone()
        }
        .encode(&mut leaving);
        Proof::sign(&mut leaving, 43, &a);
        let (_, proof) = BeatMessage::decode_proved(&leaving).unwrap();
        let proof = proof.unwrap();
        assert!(proof.verifies(&a.public(), || None));
        assert!(!proof.verifies(&c.public(), || None));
        // A format-2 reader takes it as the beat it is.
        assert_eq!(BeatMessage::decode(&leaving).map(|m| m.leaving), Some(true));
    }

    #[test]
    fn proofs_go_out_in_the_order_of_their_counts() {
        // Two senders, as a run has (its beat task, a leave's rounds),
        // each taking a count and then sending: the wire sees the counts
        // in order, or a peer refuses the earlier one as played back.
        let counter = std::sync::Arc::new(Counter::default());
        let wire = std::sync::Arc::new(std::sync::Mutex::new(Vec::new()));
        let senders: Vec<_> = (0..4)
            .map(|_| {
                let (counter, wire) = (counter.clone(), wire.clone());
                std::thread::spawn(move || {
                    for _ in 0..2_000 {
                        counter.send(|count| {
                            // A proof being made: others may run meanwhile.
                            std::thread::yield_now();
                            wire.lock().unwrap().push(count);
                        });
                    }
                })
            })
            .collect();
        for s in senders {
            s.join().unwrap();
        }
        let wire = wire.lock().unwrap();
        assert_eq!(wire.len(), 8_000);
        assert!(wire.windows(2).all(|w| w[0] < w[1]), "sent out of order");
    }

    #[test]
    fn a_counter_only_grows() {
        let c = Counter::default();
        let mut last = 0;
        for _ in 0..1000 {
            let n = c.send(|count| count);
            assert!(n > last);
            last = n;
        }
    }
}
