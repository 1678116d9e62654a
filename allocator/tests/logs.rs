//! The daemon's log lines as a pipe, journald or a file receive them.

use std::io::{BufRead, BufReader};
use std::process::{Command, Stdio};
use std::sync::mpsc;
use std::time::Duration;

use hostlb_tests::apiserver::TestServer;

/// `allocator run` against the test server with its stderr on a pipe (not
/// a terminal): debug lines from its first one on, none with an escape.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn logs_to_a_pipe_carry_no_colour_escapes() {
    let server = TestServer::start().await;
    let dir = std::env::temp_dir().join(format!("hostlb-logs-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let kubeconfig = dir.join("kubeconfig");
    server.write_kubeconfig(&kubeconfig).unwrap();
    let mut child = Command::new(env!("CARGO_BIN_EXE_allocator"))
        .args(["run", "--no-leader-election", "--identity", "logs"])
        .arg("--kubeconfig")
        .arg(&kubeconfig)
        .args(["--listen", "127.0.0.1:0"])
        .env("RUST_LOG", "debug")
        .env_remove("NO_COLOR")
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let (tx, rx) = mpsc::channel();
    let stderr = child.stderr.take().unwrap();
    std::thread::spawn(move || {
        for line in BufReader::new(stderr).split(b'\n') {
            let Ok(line) = line else { break };
            if tx.send(line).is_err() {
                break;
            }
        }
    });
    let mut lines: Vec<Vec<u8>> = Vec::new();
    let deadline = std::time::Instant::now() + Duration::from_secs(20);
    // The watches of the controller's loop are running once it logs them
    // failing (no CRDs here) or the first rebuild.
    while !lines.iter().any(|l| {
        let l = String::from_utf8_lossy(l);
        l.contains("watch failed") || l.contains("rebuilt allocations")
    }) {
        let left = deadline.saturating_duration_since(std::time::Instant::now());
        match tokio::task::block_in_place(|| rx.recv_timeout(left)) {
            Ok(l) => lines.push(l),
            Err(_) => break,
        }
    }
    child.kill().unwrap();
    child.wait().unwrap();
    let text: Vec<String> = lines
        .iter()
        .map(|l| String::from_utf8_lossy(l).into_owned())
        .collect();
    assert!(
        text.first()
            .is_some_and(|l| l.contains("allocator starting")),
        "the first line comes from the subscriber: {text:#?}"
    );
    assert!(text.len() > 1, "{text:#?}");
    for l in &lines {
        assert!(
            !l.contains(&0x1b),
            "an escape in {:?}",
            String::from_utf8_lossy(l)
        );
    }
}
