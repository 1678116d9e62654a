//! The fuzzer's bytes as a gossip message from a key holder: signed with the
//! test key, sent over loopback UDP to a real `AuthSocket`, verified, and
//! handed to chitchat's envelope decoder the way the agent hands it every
//! message. chitchat keeps its decoder crate-private, so this path (its own
//! `UdpSocket` behind our transport) is the only public way in.
//!
//! After each message a valid one from a second peer follows: when it
//! arrives, chitchat has decoded (or dropped) the fuzzer's message before it,
//! since both go through the one codec socket in order.
#![no_main]

use std::net::{Ipv4Addr, SocketAddr, UdpSocket};
use std::sync::{Mutex, OnceLock};
use std::time::Duration;

use chitchat::transport::{Socket, UdpSocket as CodecSocket};
use chitchat::{ChitchatEnvelope, ChitchatMessage, ProtocolVersion};
use lbnodeagent::gossip::frame::Outbound;
use lbnodeagent::gossip::{AuthSocket, AuthTransport, GossipKeys, WallClock};
use libfuzzer_sys::fuzz_target;

const NOW: u64 = 1_700_000_000_000;

struct Rig {
    runtime: tokio::runtime::Runtime,
    keys: GossipKeys,
    socket: AuthSocket,
    to: SocketAddr,
    peer: UdpSocket,
    peer_out: Outbound,
    closer: UdpSocket,
    closer_out: Outbound,
    /// chitchat's own encoding of a `BadCluster` envelope.
    closing_message: Vec<u8>,
}

fn rig() -> &'static Mutex<Rig> {
    static RIG: OnceLock<Mutex<Rig>> = OnceLock::new();
    RIG.get_or_init(|| {
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .expect("runtime");
        let keys = GossipKeys::from_keys(&[[7u8; 32]]).expect("test key");
        let transport = AuthTransport::with_clock(
            keys.clone(),
            Duration::from_secs(30),
            WallClock::from_fn(|| NOW),
        );
        let (socket, closing_message) = runtime.block_on(async {
            let socket = transport
                .open_socket((Ipv4Addr::LOCALHOST, 0).into())
                .await
                .expect("gossip socket");
            let mut encoder = CodecSocket::open((Ipv4Addr::LOCALHOST, 0).into())
                .await
                .expect("codec socket");
            let sink = UdpSocket::bind((Ipv4Addr::LOCALHOST, 0)).expect("sink");
            encoder
                .send(sink.local_addr().expect("sink address"), closing_envelope())
                .await
                .expect("encode");
            let mut buf = vec![0u8; 65_536];
            let len = sink.recv(&mut buf).expect("encoded envelope");
            buf.truncate(len);
            (socket, buf)
        });
        let to = socket.local_addr().expect("socket address");
        let bind = || UdpSocket::bind((Ipv4Addr::LOCALHOST, 0)).expect("peer socket");
        Mutex::new(Rig {
            runtime,
            keys,
            socket,
            to,
            peer: bind(),
            peer_out: Outbound::new(1),
            closer: bind(),
            closer_out: Outbound::new(2),
            closing_message,
        })
    })
}

fn closing_envelope() -> ChitchatEnvelope {
    ChitchatEnvelope {
        version: ProtocolVersion::V0,
        message: ChitchatMessage::BadCluster,
    }
}

fuzz_target!(|data: &[u8]| {
    let mut guard = rig().lock().unwrap_or_else(|p| p.into_inner());
    let rig = &mut *guard;
    let Ok(frames) = rig.peer_out.seal(&rig.keys, data, rig.to, NOW) else {
        return;
    };
    for frame in frames {
        rig.peer.send_to(&frame, rig.to).expect("send");
    }
    let closing = rig
        .closer_out
        .seal(&rig.keys, &rig.closing_message, rig.to, NOW)
        .expect("small message");
    for frame in closing {
        rig.closer.send_to(&frame, rig.to).expect("send");
    }
    let peer = rig.peer.local_addr().expect("peer address");
    let closer = rig.closer.local_addr().expect("closer address");
    let socket = &mut rig.socket;
    rig.runtime.block_on(async {
        loop {
            let got = tokio::time::timeout(Duration::from_secs(10), socket.recv())
                .await
                .expect("the closing message arrives")
                .expect("socket works");
            if got.from_addr == closer {
                assert_eq!(got.envelope, closing_envelope());
                break;
            }
            assert_eq!(
                got.from_addr, peer,
                "decoded message from nobody we sent as"
            );
        }
    });
});
