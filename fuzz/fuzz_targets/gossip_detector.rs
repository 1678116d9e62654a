//! A failure-detector message from a key holder (the bytes after the
//! payload mark, as the transport hands them over once the frame
//! verified), fed to a running `Detector` that has one peer. foca decodes
//! it; whatever it says, the detector task must keep running (a panic
//! there would freeze every view's member list) and keep answering its
//! peer.

#![no_main]

use std::net::SocketAddr;
use std::sync::{Mutex, OnceLock};
use std::time::Duration;

use lbnodeagent::gossip::{Detector, MemProbes, PROBE_MARK, Peer, ProbeLink, ProbeNet};
use libfuzzer_sys::fuzz_target;

struct Rig {
    runtime: tokio::runtime::Runtime,
    detector: Detector,
    _peer: Detector,
    rogue: ProbeLink,
    target: SocketAddr,
}

fn rig() -> &'static Mutex<Rig> {
    static RIG: OnceLock<Mutex<Rig>> = OnceLock::new();
    RIG.get_or_init(|| {
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .expect("runtime");
        let net = MemProbes::default();
        let a = Peer::new("a", 1, "10.0.0.1:7934".parse().unwrap());
        let b = Peer::new("b", 1, "10.0.0.2:7934".parse().unwrap());
        let (detector, peer, rogue) = runtime.block_on(async {
            let period = Duration::from_millis(100);
            let detector = Detector::start(a.clone(), period, net.attach(a.addr).unwrap());
            let peer = Detector::start(b.clone(), period, net.attach(b.addr).unwrap());
            peer.announce(vec![a.clone()]);
            let mut up = detector.up();
            tokio::time::timeout(Duration::from_secs(10), up.wait_for(|up| !up.is_empty()))
                .await
                .expect("the two detectors meet")
                .expect("detector running");
            let rogue = net.attach("10.0.0.3:7934".parse().unwrap()).unwrap();
            (detector, peer, rogue)
        });
        Mutex::new(Rig {
            runtime,
            detector,
            _peer: peer,
            rogue,
            target: a.addr,
        })
    })
}

fuzz_target!(|data: &[u8]| {
    let mut guard = rig().lock().unwrap_or_else(|p| p.into_inner());
    let rig = &mut *guard;
    let message = [&PROBE_MARK[..], data].concat();
    rig.rogue.send.send(rig.target, &message);
    let up = rig.detector.up();
    rig.runtime.block_on(async {
        // Let the detector take the message and anything it triggers.
        for _ in 0..8 {
            tokio::task::yield_now().await;
        }
    });
    assert!(
        up.has_changed().is_ok(),
        "the detector task stopped on a message"
    );
});
