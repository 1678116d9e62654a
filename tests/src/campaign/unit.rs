//! Each node's agent run as systemd runs the packaged unit
//! (`systemd/lbnodeagent.service`): `check` before each start
//! (ExecStartPre), `run` with a notify socket and the watchdog
//! (`WatchdogSec=3s`, then SIGABRT and, after `TimeoutAbortSec=1s`,
//! SIGKILL), `cleanup` after every exit (ExecStopPost), a restart
//! `RestartSec=2s` after any exit (`Restart=always`), SIGTERM and up to
//! `TimeoutStopSec=30s` for a stop, `check` and SIGHUP for a reload. PID 1
//! here is no systemd, and the bed needs to know why each agent stopped:
//! an exit the nemesis did not cause, or a watchdog kill while nothing
//! stalled the agent, is a violation ("restarted by itself").
//!
//! One thread per node carries out the nemesis's commands and watches the
//! process; every step is an [`Event`] with its time.

use std::os::unix::net::UnixDatagram;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::mpsc::{Receiver, RecvTimeoutError, Sender, channel};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

/// The unit's settings that matter here, as `systemd/lbnodeagent.service`
/// has them (a test reads the file and compares).
pub const WATCHDOG_SEC: Duration = Duration::from_secs(3);
pub const TIMEOUT_ABORT_SEC: Duration = Duration::from_secs(1);
pub const RESTART_SEC: Duration = Duration::from_secs(2);
pub const TIMEOUT_STOP_SEC: Duration = Duration::from_secs(30);

/// What the nemesis asks of a unit.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Order {
    /// SIGKILL; `cleanup` after it or not; restart after RestartSec, or
    /// hold until [`Order::Release`].
    Kill {
        cleanup: bool,
        restart: bool,
    },
    /// `systemctl restart`: SIGTERM, wait, cleanup, start at once.
    Restart,
    /// `systemctl reload`.
    Reload,
    Stop,
    Cont,
    /// Starts a held unit.
    Release,
    /// Stops for good (the end of the run): SIGTERM, cleanup.
    Shutdown,
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Event {
    Started {
        pid: u32,
    },
    /// `READY=1` on the notify socket.
    Ready,
    /// `check` (ExecStartPre) failed: systemd counts a failed start and
    /// tries again after RestartSec.
    CheckFailed {
        output: String,
    },
    Stopped,
    Continued,
    Signalled {
        signal: &'static str,
    },
    /// The watchdog fired: no `WATCHDOG=1` for WatchdogSec.
    Watchdog,
    /// The process ended; `asked` when the nemesis (or the watchdog on a
    /// stalled agent) caused it.
    Exited {
        status: String,
        asked: bool,
    },
    Cleanup {
        ok: bool,
        output: String,
    },
    Held,
}

/// One unit's history, shared with the bed.
pub type History = Arc<Mutex<Vec<(Instant, Event)>>>;

/// What a unit runs, and where.
#[derive(Clone, Debug)]
pub struct Spec {
    pub node: String,
    /// The network namespace.
    pub netns: String,
    pub binary: PathBuf,
    pub config: PathBuf,
    pub log: PathBuf,
    /// Where the notify socket is made.
    pub notify: PathBuf,
    pub env: Vec<(String, String)>,
}

pub struct Unit {
    pub node: String,
    tx: Sender<Order>,
    pub history: History,
    /// The running agent's pid (0 when none).
    pub pid: Arc<Mutex<u32>>,
    thread: Option<JoinHandle<()>>,
}

impl Unit {
    pub fn start(spec: Spec) -> Unit {
        let (tx, rx) = channel();
        let history: History = Arc::default();
        let pid = Arc::new(Mutex::new(0));
        let node = spec.node.clone();
        let thread = {
            let (history, pid) = (history.clone(), pid.clone());
            std::thread::Builder::new()
                .name(format!("unit-{node}"))
                .spawn(move || Runner::new(spec, rx, history, pid).run())
                .expect("a thread")
        };
        Unit {
            node,
            tx,
            history,
            pid,
            thread: Some(thread),
        }
    }

    pub fn send(&self, c: Order) {
        let _ = self.tx.send(c);
    }

    pub fn pid(&self) -> u32 {
        *self.pid.lock().unwrap_or_else(|e| e.into_inner())
    }

    pub fn events(&self) -> Vec<(Instant, Event)> {
        self.history
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clone()
    }
}

impl Drop for Unit {
    fn drop(&mut self) {
        let _ = self.tx.send(Order::Shutdown);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

/// Why the process is expected to end, if it is.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Ending {
    Kill {
        cleanup: bool,
        restart: bool,
    },
    Restart,
    Shutdown,
    /// The watchdog's SIGABRT; `stalled` when the nemesis stopped it.
    Watchdog {
        stalled: bool,
    },
}

impl Ending {
    /// A release that comes while a kill that holds the unit is on its way
    /// (the agent not yet exited) ends the hold all the same: the fault
    /// that held it has ended, and nothing would release it later. (Two
    /// faults on one node, the nemesis late on both: the first's kill and
    /// its end, then the second's kill, all within milliseconds.)
    fn released(self) -> Ending {
        match self {
            Ending::Kill {
                cleanup,
                restart: false,
            } => Ending::Kill {
                cleanup,
                restart: true,
            },
            e => e,
        }
    }
}

struct Runner {
    spec: Spec,
    rx: Receiver<Order>,
    history: History,
    pid: Arc<Mutex<u32>>,
    notify: UnixDatagram,
}

impl Runner {
    fn new(spec: Spec, rx: Receiver<Order>, history: History, pid: Arc<Mutex<u32>>) -> Runner {
        let _ = std::fs::remove_file(&spec.notify);
        let notify = UnixDatagram::bind(&spec.notify).expect("a notify socket");
        notify
            .set_nonblocking(true)
            .expect("a non-blocking notify socket");
        Runner {
            spec,
            rx,
            history,
            pid,
            notify,
        }
    }

    fn note(&self, e: Event) {
        self.history
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .push((Instant::now(), e));
    }

    fn command(&self, program: &Path, args: &[&str]) -> Command {
        let mut c = Command::new("ip");
        c.args(["netns", "exec", &self.spec.netns])
            .arg(program)
            .args(args);
        c
    }

    fn config(&self) -> String {
        self.spec.config.display().to_string()
    }

    /// `lbnodeagent check`; its output when it fails.
    fn check(&self) -> Result<(), String> {
        let out = self
            .command(&self.spec.binary, &["check", "--config", &self.config()])
            .output()
            .map_err(|e| e.to_string())?;
        if out.status.success() {
            Ok(())
        } else {
            Err(String::from_utf8_lossy(&out.stderr).trim().to_string())
        }
    }

    fn cleanup(&self) {
        let out = self
            .command(&self.spec.binary, &["cleanup", "--config", &self.config()])
            .output();
        let (ok, output) = match out {
            Ok(o) => (
                o.status.success(),
                format!(
                    "{}{}",
                    String::from_utf8_lossy(&o.stdout).trim(),
                    String::from_utf8_lossy(&o.stderr).trim()
                ),
            ),
            Err(e) => (false, e.to_string()),
        };
        self.note(Event::Cleanup { ok, output });
    }

    fn spawn(&self) -> Option<Child> {
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&self.spec.log)
            .ok()?;
        let mut c = self.command(&self.spec.binary, &["run", "--config", &self.config()]);
        c.env("NOTIFY_SOCKET", &self.spec.notify)
            .env("WATCHDOG_USEC", WATCHDOG_SEC.as_micros().to_string())
            .envs(self.spec.env.iter().map(|(k, v)| (k, v)))
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(log);
        let child = c.spawn().ok()?;
        // `ip netns exec` execs the agent: the same pid.
        *self.pid.lock().unwrap_or_else(|e| e.into_inner()) = child.id();
        self.note(Event::Started { pid: child.id() });
        Some(child)
    }

    /// Waits `d`, answering commands meanwhile; false when told to shut
    /// down.
    fn wait(&self, d: Duration, held: &mut bool) -> bool {
        let until = Instant::now() + d;
        loop {
            let left = until.saturating_duration_since(Instant::now());
            if left.is_zero() && !*held {
                return true;
            }
            let wait = if *held {
                Duration::from_millis(100)
            } else {
                left
            };
            match self.rx.recv_timeout(wait) {
                Ok(Order::Shutdown) | Err(RecvTimeoutError::Disconnected) => return false,
                Ok(Order::Release) => *held = false,
                Ok(Order::Kill { restart: false, .. }) => *held = true,
                Ok(_) | Err(RecvTimeoutError::Timeout) => {}
            }
        }
    }

    fn run(self) {
        let mut held = false;
        loop {
            if let Err(output) = self.check() {
                self.note(Event::CheckFailed { output });
                if !self.wait(RESTART_SEC, &mut held) {
                    return;
                }
                continue;
            }
            let Some(mut child) = self.spawn() else {
                self.note(Event::CheckFailed {
                    output: "the agent could not be spawned".into(),
                });
                if !self.wait(RESTART_SEC, &mut held) {
                    return;
                }
                continue;
            };
            let ending = self.supervise(&mut child);
            *self.pid.lock().unwrap_or_else(|e| e.into_inner()) = 0;
            let (cleanup, restart_now, delay) = match ending {
                Some(Ending::Kill { cleanup, restart }) => {
                    held = !restart;
                    (cleanup, false, true)
                }
                Some(Ending::Restart) => (true, true, false),
                Some(Ending::Shutdown) => {
                    self.cleanup();
                    return;
                }
                Some(Ending::Watchdog { .. }) | None => (true, false, true),
            };
            if cleanup {
                self.cleanup();
            }
            if held {
                self.note(Event::Held);
            }
            if !restart_now && delay && !self.wait(RESTART_SEC, &mut held) {
                return;
            }
        }
    }

    /// Watches the running agent until it exits; why, when it was asked to.
    fn supervise(&self, child: &mut Child) -> Option<Ending> {
        let pid = child.id().to_string();
        // Noted before it is sent, so whatever the signal causes (a line the
        // agent writes, its exit) is never seen ahead of the record of it.
        let signal = |sig: &'static str| {
            self.note(Event::Signalled { signal: sig });
            let _ = Command::new("kill").args(["-s", sig, &pid]).status();
        };
        let mut ending: Option<Ending> = None;
        let mut stopped = false;
        // A stall that ended less than WatchdogSec ago may still fire the
        // watchdog: the agent pings again at its next tick.
        let mut thawed: Option<Instant> = None;
        let mut last_ping = Instant::now();
        let mut abort_at: Option<Instant> = None;
        let mut term_at: Option<Instant> = None;
        // systemd runs a reload asked for while the unit is still starting
        // only once the start job ends (READY=1): the job waits behind it.
        let mut ready = false;
        let mut reload_waits = false;
        let mut buf = [0u8; 512];
        loop {
            while let Ok(n) = self.notify.recv(&mut buf) {
                let msg = String::from_utf8_lossy(&buf[..n]);
                for line in msg.lines() {
                    match line {
                        "WATCHDOG=1" => last_ping = Instant::now(),
                        "READY=1" => {
                            last_ping = Instant::now();
                            ready = true;
                            self.note(Event::Ready);
                        }
                        _ => {}
                    }
                }
            }
            if reload_waits && ready {
                reload_waits = false;
                if ending.is_none() {
                    match self.check() {
                        Ok(()) => signal("HUP"),
                        Err(output) => self.note(Event::CheckFailed { output }),
                    }
                }
            }
            if let Ok(Some(status)) = child.try_wait() {
                self.note(Event::Exited {
                    status: status.to_string(),
                    asked: ending.is_some_and(|e| e != Ending::Watchdog { stalled: false }),
                });
                return ending;
            }
            if abort_at.is_none() && ending.is_none() && last_ping.elapsed() > WATCHDOG_SEC {
                self.note(Event::Watchdog);
                signal("ABRT");
                let stalled = stopped || thawed.is_some_and(|t| t.elapsed() < WATCHDOG_SEC);
                ending = Some(Ending::Watchdog { stalled });
                abort_at = Some(Instant::now());
            }
            if abort_at.is_some_and(|t| t.elapsed() > TIMEOUT_ABORT_SEC) {
                signal("KILL");
                abort_at = None;
            }
            if term_at.is_some_and(|t| t.elapsed() > TIMEOUT_STOP_SEC) {
                signal("KILL");
                term_at = None;
            }
            match self.rx.recv_timeout(Duration::from_millis(5)) {
                Ok(Order::Kill { cleanup, restart }) => {
                    if ending.is_none() {
                        ending = Some(Ending::Kill { cleanup, restart });
                    }
                    signal("KILL");
                }
                Ok(Order::Restart) => {
                    if ending.is_none() {
                        ending = Some(Ending::Restart);
                        signal("TERM");
                        term_at = Some(Instant::now());
                    }
                }
                Ok(Order::Shutdown) | Err(RecvTimeoutError::Disconnected) => {
                    ending = Some(Ending::Shutdown);
                    if stopped {
                        signal("CONT");
                    }
                    signal("TERM");
                    term_at = Some(Instant::now());
                }
                Ok(Order::Reload) => reload_waits = true,
                Ok(Order::Stop) => {
                    if !stopped && ending.is_none() {
                        signal("STOP");
                        stopped = true;
                        self.note(Event::Stopped);
                    }
                }
                Ok(Order::Cont) => {
                    if stopped {
                        signal("CONT");
                        stopped = false;
                        thawed = Some(Instant::now());
                        self.note(Event::Continued);
                    }
                }
                Ok(Order::Release) => ending = ending.map(Ending::released),
                Err(RecvTimeoutError::Timeout) => {}
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_release_before_the_exit_ends_the_hold() {
        let held = Ending::Kill {
            cleanup: false,
            restart: false,
        };
        assert_eq!(
            held.released(),
            Ending::Kill {
                cleanup: false,
                restart: true
            }
        );
        assert_eq!(Ending::Restart.released(), Ending::Restart);
    }

    /// The constants above are the shipped unit's.
    #[test]
    fn the_supervisor_keeps_the_shipped_units_settings() {
        let unit = std::fs::read_to_string(
            Path::new(env!("CARGO_MANIFEST_DIR")).join("../systemd/lbnodeagent.service"),
        )
        .unwrap();
        let setting = |key: &str| {
            unit.lines()
                .find_map(|l| l.strip_prefix(&format!("{key}=")))
                .unwrap_or_else(|| panic!("{key} in the unit"))
                .trim()
                .to_string()
        };
        let secs = |d: Duration| format!("{}s", d.as_secs());
        assert_eq!(setting("WatchdogSec"), secs(WATCHDOG_SEC));
        assert_eq!(setting("TimeoutAbortSec"), secs(TIMEOUT_ABORT_SEC));
        assert_eq!(setting("RestartSec"), secs(RESTART_SEC));
        assert_eq!(setting("TimeoutStopSec"), secs(TIMEOUT_STOP_SEC));
        assert_eq!(setting("Restart"), "always");
        assert!(setting("ExecStopPost").contains("lbnodeagent cleanup"));
        assert!(setting("ExecStartPre").contains("lbnodeagent check"));
    }

    /// A reload asked for while the agent starts reaches it after READY=1,
    /// as systemd's reload job waits behind the start job; sent at once it
    /// would meet SIGHUP's default action and end the process. The agent
    /// here is a perl script that handles SIGHUP only from its READY=1 on.
    /// Needs root: the unit runs its agent in a network namespace.
    #[test]
    fn a_reload_while_starting_waits_for_ready() {
        crate::netns::require_root();
        let ns = crate::netns::Netns::new("unit").unwrap();
        let tmp = tempfile::tempdir().unwrap();
        let dir = tmp.path();
        let agent = dir.join("agent");
        let hups = dir.join("hups");
        std::fs::write(
            &agent,
            format!(
                r#"#!/usr/bin/perl
# SIGHUP's default action until READY=1, whatever the test runner left it
# at (a shell cannot trap a signal that was ignored when it started, as
# under nohup; perl can).
use IO::Socket::UNIX;
$SIG{{HUP}} = 'DEFAULT';
exit 0 unless ($ARGV[0] // '') eq 'run';
select(undef, undef, undef, 0.4);
$SIG{{HUP}} = sub {{ open(my $f, '>>', '{hups}') or die; print $f "hup\n"; close $f; }};
sub notify {{
    my $s = IO::Socket::UNIX->new(Type => SOCK_DGRAM, Peer => $ENV{{NOTIFY_SOCKET}}) or return 0;
    return $s->send($_[0]);
}}
select(undef, undef, undef, 0.02) until notify("READY=1");
while (1) {{ notify("WATCHDOG=1"); select(undef, undef, undef, 0.05); }}
"#,
                hups = hups.display()
            ),
        )
        .unwrap();
        std::fs::set_permissions(&agent, std::os::unix::fs::PermissionsExt::from_mode(0o755))
            .unwrap();
        let unit = Unit::start(Spec {
            node: "n1".into(),
            netns: ns.name().into(),
            binary: agent,
            config: dir.join("config"),
            log: dir.join("log"),
            notify: dir.join("notify"),
            env: vec![],
        });
        let started = Instant::now();
        while !unit
            .events()
            .iter()
            .any(|(_, e)| matches!(e, Event::Started { .. }))
        {
            assert!(
                started.elapsed() < Duration::from_secs(10),
                "the agent started"
            );
            std::thread::sleep(Duration::from_millis(5));
        }
        unit.send(Order::Reload);
        while !std::fs::read_to_string(&hups).is_ok_and(|h| h.lines().count() == 1) {
            let exited = unit
                .events()
                .into_iter()
                .find(|(_, e)| matches!(e, Event::Exited { .. }));
            assert!(exited.is_none(), "the agent lives on: {exited:?}");
            assert!(
                started.elapsed() < Duration::from_secs(10),
                "the reload came: {:?}; the agent said: {}",
                unit.events(),
                std::fs::read_to_string(dir.join("log")).unwrap_or_default()
            );
            std::thread::sleep(Duration::from_millis(5));
        }
        let events = unit.events();
        let at = |want: fn(&Event) -> bool| events.iter().position(|(_, e)| want(e));
        let ready = at(|e| *e == Event::Ready).expect("READY=1");
        let hup = at(|e| *e == Event::Signalled { signal: "HUP" }).expect("a SIGHUP");
        assert!(ready < hup, "the SIGHUP follows READY=1: {events:?}");
        drop(unit);
    }
}
