//! One allocator replica run in-process as a given identity, for the
//! controller tests (test server), the real-server tests and benchmark.

use std::sync::Arc;
use std::time::Duration;

use hostlb_allocator::controller::{self, Config, telemetry::Telemetry};
use kube::Client;
use tokio::sync::watch;
use tokio::task::JoinHandle;

pub struct Replica {
    stop: watch::Sender<bool>,
    task: JoinHandle<Result<(), controller::Error>>,
    pub telemetry: Arc<Telemetry>,
    /// How long [`Replica::stop`] may take.
    stop_within: Duration,
}

/// A replica with the identity `identity` over `config`, which must stop
/// within `stop_within` when asked.
pub fn start(
    config: &kube::Config,
    identity: &str,
    leader_election: bool,
    stop_within: Duration,
) -> Replica {
    let mut config = config.clone();
    controller::prepare_client(&mut config, identity);
    let mut cfg = Config::for_test(identity);
    cfg.leader_election = leader_election;
    let telemetry = Telemetry::new();
    let (stop, stopped) = watch::channel(false);
    let task = tokio::spawn(controller::run(
        Client::try_from(config).unwrap(),
        cfg,
        telemetry.clone(),
        stopped,
    ));
    Replica {
        stop,
        task,
        telemetry,
        stop_within,
    }
}

impl Replica {
    /// Dies on the spot, as a killed process: the Lease is not released.
    pub fn kill(self) {
        self.task.abort();
    }

    /// Stops it and checks it ended without an error.
    pub async fn stop(self) {
        self.stop.send(true).unwrap();
        tokio::time::timeout(self.stop_within, self.task)
            .await
            .expect("the replica stops in time")
            .unwrap()
            .unwrap();
    }
}
