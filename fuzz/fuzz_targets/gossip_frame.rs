//! One datagram from anyone on the LAN, through the frame decoder.
//!
//! Unsigned, the bytes can only be rejected before or at the MAC, which is
//! all an attacker without the key reaches. Then the same bytes are read as
//! header and payload and signed with the test key, so the header checks
//! behind the MAC (fragment fields, tag count, destination) and
//! `Inbound::accept` see every value a key holder could send.
#![no_main]

use std::net::{IpAddr, Ipv6Addr, SocketAddr};

use lbnodeagent::gossip::GossipKeys;
use lbnodeagent::gossip::frame::{
    Accepted, HEADER_LEN, Header, Inbound, MAGIC, MAX_DATAGRAM, MAX_FRAGMENTS, Reject, TAG_LEN,
    canonical, open_one, seal_one,
};
use libfuzzer_sys::fuzz_target;

const NOW: u64 = 1_700_000_000_000;
const WINDOW: u64 = 30_000;

fuzz_target!(|data: &[u8]| {
    let keys = GossipKeys::from_keys(&[[7u8; 32]]).expect("test key");
    let rotating = GossipKeys::from_keys(&[[8u8; 32], [7u8; 32]]).expect("test keys");

    // As received, under the test key (the seeds hold frames signed with it)
    // and under a key nobody gave the fuzzer, which must accept nothing.
    for k in [&keys, &rotating] {
        let opened = open_one(k, data).map(|(header, _)| header);
        let accepted = Inbound::new(WINDOW).accept(k, data, NOW, |_| true);
        if let Err(reason) = opened {
            assert_eq!(accepted.map(|_| ()), Err(reason));
        }
    }
    let secret = GossipKeys::from_keys(&[[0x5a_u8; 32]]).expect("secret key");
    let got = open_one(&secret, data);
    assert!(
        matches!(
            got,
            Err(Reject::Oversized
                | Reject::Malformed
                | Reject::BadMac
                | Reject::OtherVersion { .. })
        ),
        "forged bytes gave {got:?}"
    );
    assert!(
        Inbound::new(WINDOW)
            .accept(&secret, data, NOW, |_| true)
            .is_err()
    );

    // Signed: the bytes as a header and payload.
    if data.len() < HEADER_LEN {
        return;
    }
    let u64_at = |at: usize| u64::from_be_bytes(data[at..at + 8].try_into().expect("8 bytes"));
    let ip: [u8; 16] = data[31..47].try_into().expect("16 bytes");
    let header = Header {
        fragment: data[4],
        fragments: data[5],
        tags: data[6],
        sender: u64_at(7),
        seq: u64_at(15),
        timestamp_ms: u64_at(23),
        destination: SocketAddr::new(
            IpAddr::V6(Ipv6Addr::from(ip)),
            u16::from_be_bytes([data[47], data[48]]),
        ),
    };
    let payload = &data[HEADER_LEN..];
    let signer = if data[0] & 1 == 0 { &keys } else { &rotating };
    let mut frame = Vec::new();
    seal_one(signer, &header, payload, &mut frame);
    assert_eq!(
        frame.len(),
        payload.len() + HEADER_LEN + TAG_LEN * signer.len()
    );
    assert_eq!(frame[..4], MAGIC);

    let fragments_ok =
        (1..=MAX_FRAGMENTS).contains(&header.fragments) && header.fragment < header.fragments;
    for receiver in [&keys, &rotating] {
        match open_one(receiver, &frame) {
            Ok((got, body)) => {
                assert!(fragments_ok, "bad fragment fields accepted: {got:?}");
                assert_eq!(body, payload);
                assert_eq!(got.destination, canonical(header.destination));
                assert_eq!(
                    (got.sender, got.seq, got.timestamp_ms),
                    (header.sender, header.seq, header.timestamp_ms)
                );
            }
            Err(Reject::Malformed) => assert!(!fragments_ok, "good frame malformed: {header:?}"),
            Err(Reject::Oversized) => assert!(frame.len() > MAX_DATAGRAM),
            Err(other) => panic!("signed frame rejected as {other:?}"),
        }
    }

    // Through the receiving half, fresh and stale, for us and not.
    let mut inbound = Inbound::new(WINDOW);
    let now = if data[1] & 1 == 0 {
        header.timestamp_ms
    } else {
        NOW
    };
    let for_us = data[2] & 1 == 0;
    match inbound.accept(&keys, &frame, now, |_| for_us) {
        Ok(Accepted::Whole(body)) => {
            assert_eq!(header.fragments, 1);
            assert_eq!(body, payload);
            // The same frame again is a replay.
            assert_eq!(
                inbound.accept(&keys, &frame, now, |_| true),
                Err(Reject::Replayed)
            );
        }
        Ok(Accepted::Pending) => assert!(header.fragments > 1),
        Ok(Accepted::Reassembled(_)) => panic!("one fragment cannot complete a message"),
        Err(Reject::Misdirected { .. }) => assert!(!for_us),
        Err(Reject::Stale { .. }) => assert!(header.timestamp_ms.abs_diff(now) > WINDOW),
        Err(_) => {}
    }
    assert!(inbound.senders() <= 1);
});
