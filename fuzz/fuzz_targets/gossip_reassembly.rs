//! A stream of signed frames from a few key-holding senders, through one
//! receiver: replay windows, fragment reassembly, the pending-message and
//! sender bounds, and the sweeps as the clock moves, in any order.
#![no_main]

use std::collections::HashMap;
use std::net::SocketAddr;

use arbitrary::Arbitrary;
use lbnodeagent::gossip::GossipKeys;
use lbnodeagent::gossip::frame::{Accepted, Header, Inbound, Outbound, Reject, seal_one};
use libfuzzer_sys::fuzz_target;

const START: u64 = 1_700_000_000_000;
const WINDOW: u64 = 30_000;

#[derive(Arbitrary, Debug)]
enum Op {
    /// One frame with any header a key holder could write.
    Frame {
        sender: u8,
        seq: u16,
        fragment: u8,
        fragments: u8,
        /// Timestamp relative to the receiver's clock, in ms.
        skew: i32,
        payload: Vec<u8>,
    },
    /// A whole message from a well-behaved sender, in some fragment order.
    Message {
        sender: u8,
        payload: Vec<u8>,
        reverse: bool,
    },
    /// The receiver's clock moves on.
    Wait { ms: u32 },
}

fuzz_target!(|ops: Vec<Op>| {
    let keys = GossipKeys::from_keys(&[[7u8; 32]]).expect("test key");
    let me: SocketAddr = "10.0.0.1:7934".parse().expect("address");
    let mut inbound = Inbound::new(WINDOW);
    let mut now = START;
    let mut outbound: HashMap<u8, Outbound> = HashMap::new();
    for op in ops {
        match op {
            Op::Frame {
                sender,
                seq,
                fragment,
                fragments,
                skew,
                payload,
            } => {
                let header = Header {
                    fragment,
                    fragments,
                    tags: 1,
                    sender: u64::from(sender % 8),
                    seq: u64::from(seq),
                    timestamp_ms: now.saturating_add_signed(i64::from(skew)),
                    destination: me,
                };
                let mut frame = Vec::new();
                seal_one(&keys, &header, &payload, &mut frame);
                match inbound.accept(&keys, &frame, now, |to| to == me) {
                    Ok(Accepted::Whole(body)) => assert_eq!(body, &payload[..]),
                    Ok(Accepted::Reassembled(body)) => assert!(body.len() >= payload.len()),
                    Ok(Accepted::Pending) => assert!(fragments > 1),
                    Err(Reject::Stale { skew_ms }) => assert_eq!(skew_ms, i64::from(skew)),
                    Err(Reject::Replayed | Reject::Malformed) => {}
                    Err(other) => panic!("{other:?} for a signed frame to us"),
                }
            }
            Op::Message {
                sender,
                payload,
                reverse,
            } => {
                // Its own sender ids, so the manual frames cannot replay them.
                let out = outbound
                    .entry(sender % 4)
                    .or_insert_with(|| Outbound::new(1_000 + u64::from(sender % 4)));
                let mut frames = out.seal(&keys, &payload, me, now).expect("fits");
                if reverse {
                    frames.reverse();
                }
                let last = frames.len() - 1;
                for (i, frame) in frames.iter().enumerate() {
                    let got = inbound.accept(&keys, frame, now, |to| to == me);
                    match got {
                        Ok(Accepted::Whole(body)) => assert_eq!(body, &payload[..]),
                        Ok(Accepted::Reassembled(body)) => assert_eq!(body, payload),
                        Ok(Accepted::Pending) => assert!(i < last),
                        Err(e) => panic!("fresh message rejected: {e:?}"),
                    }
                }
            }
            Op::Wait { ms } => now += u64::from(ms),
        }
        assert!(inbound.senders() <= 12);
    }
});
