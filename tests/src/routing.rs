//! Routing daemons in network namespaces, for hostlb's virtual mode: BIRD 2
//! and FRR (zebra with bgpd), each in the foreground of its own namespace
//! with its control sockets in a directory of its own, so that several run
//! on one machine beside any system instance. Their configs are the ones
//! `docs/routing.md` ships (`docs/routing/*.conf`), with the `@NAME@`
//! placeholders filled in; a placeholder left over is an error, so a
//! config and its test cannot drift apart.

use std::collections::BTreeSet;
use std::net::IpAddr;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Stdio};
use std::time::Duration;

use crate::netns::{Netns, NetnsError, Result, wait_for};

/// Which routing daemon.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Daemon {
    Bird,
    Frr,
}

impl Daemon {
    pub fn name(self) -> &'static str {
        match self {
            Daemon::Bird => "bird",
            Daemon::Frr => "frr",
        }
    }

    /// The programs it needs.
    pub fn programs(self) -> &'static [&'static str] {
        match self {
            Daemon::Bird => &["bird", "birdc"],
            Daemon::Frr => &["/usr/lib/frr/zebra", "/usr/lib/frr/bgpd", "vtysh"],
        }
    }
}

/// The shipped config `docs/routing/NAME` (e.g. `bird-host.conf`).
pub fn shipped_config(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../docs/routing")
        .join(name)
}

/// `template` with every `@KEY@` of `vars` replaced; an error naming any
/// placeholder left.
pub fn render(template: &str, vars: &[(&str, String)]) -> std::result::Result<String, String> {
    let mut out = template.to_string();
    for (k, v) in vars {
        out = out.replace(&format!("@{k}@"), v);
    }
    let left: BTreeSet<&str> = out
        .split('@')
        .skip(1)
        .step_by(2)
        .filter(|w| !w.is_empty() && w.chars().all(|c| c.is_ascii_uppercase() || c == '_'))
        .collect();
    if left.is_empty() {
        Ok(out)
    } else {
        Err(format!("placeholders not filled in: {left:?}"))
    }
}

/// A running routing daemon; killed on drop.
pub struct Router {
    pub daemon: Daemon,
    ns: String,
    dir: PathBuf,
    children: Vec<Child>,
}

impl Drop for Router {
    fn drop(&mut self) {
        for c in &mut self.children {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

impl Router {
    /// Starts `daemon` in `ns` with `config` (already rendered), keeping
    /// its sockets, pid files and log in `dir` (created).
    pub fn start(daemon: Daemon, ns: &Netns, dir: &Path, config: &str) -> Result<Router> {
        std::fs::create_dir_all(dir).map_err(|e| io_error("create", dir, e))?;
        // FRR drops to its own user: it must reach the directory and read
        // the config.
        std::fs::set_permissions(dir, std::fs::Permissions::from_mode(0o777))
            .map_err(|e| io_error("chmod", dir, e))?;
        let conf = dir.join(format!("{}.conf", daemon.name()));
        std::fs::write(&conf, config).map_err(|e| io_error("write", &conf, e))?;
        std::fs::set_permissions(&conf, std::fs::Permissions::from_mode(0o644))
            .map_err(|e| io_error("chmod", &conf, e))?;
        let mut r = Router {
            daemon,
            ns: ns.name().to_string(),
            dir: dir.to_path_buf(),
            children: Vec::new(),
        };
        let d = dir.display().to_string();
        match daemon {
            Daemon::Bird => {
                let argv = [
                    "-f",
                    "-c",
                    &conf.display().to_string(),
                    "-s",
                    &format!("{d}/bird.ctl"),
                    "-P",
                    &format!("{d}/bird.pid"),
                ]
                .map(String::from);
                r.spawn(ns, "bird", &argv, "bird.log")?;
            }
            Daemon::Frr => {
                let common = |pid: &str| {
                    vec![
                        "-u".to_string(),
                        "frr".into(),
                        "-g".into(),
                        "frr".into(),
                        "--vty_socket".into(),
                        d.clone(),
                        "-z".into(),
                        format!("{d}/zserv.api"),
                        "-i".into(),
                        format!("{d}/{pid}"),
                        "-P".into(),
                        "0".into(),
                        "--log".into(),
                        "stdout".into(),
                    ]
                };
                r.spawn(ns, "/usr/lib/frr/zebra", &common("zebra.pid"), "zebra.log")?;
                let zserv = dir.join("zserv.api");
                wait_for("zebra's socket", Duration::from_secs(10), || {
                    zserv.exists().then_some(())
                })?;
                let mut argv = common("bgpd.pid");
                argv.extend(["-f".to_string(), conf.display().to_string()]);
                r.spawn(ns, "/usr/lib/frr/bgpd", &argv, "bgpd.log")?;
            }
        }
        Ok(r)
    }

    fn spawn(&mut self, ns: &Netns, program: &str, argv: &[String], log: &str) -> Result<()> {
        let path = self.dir.join(log);
        let log = std::fs::File::create(&path).map_err(|e| io_error("create", &path, e))?;
        let err = log.try_clone().map_err(|e| io_error("dup", &path, e))?;
        let args: Vec<&str> = argv.iter().map(String::as_str).collect();
        let child = ns
            .command(program, &args)
            .stdout(Stdio::from(log))
            .stderr(Stdio::from(err))
            .spawn()
            .map_err(|source| NetnsError::Spawn {
                command: program.to_string(),
                source,
            })?;
        self.children.push(child);
        Ok(())
    }

    /// The daemon's BGP sessions in state Established.
    pub fn established(&self) -> usize {
        let d = self.dir.display().to_string();
        let out = match self.daemon {
            Daemon::Bird => crate::netns::run(
                "ip",
                &[
                    "netns",
                    "exec",
                    &self.ns,
                    "birdc",
                    "-s",
                    &format!("{d}/bird.ctl"),
                    "show",
                    "protocols",
                ],
            ),
            Daemon::Frr => self.vtysh("show bgp summary json"),
        };
        // BIRD prints a line per session; FRR's JSON has a state per peer
        // (and "connectionsEstablished" counters, not counted).
        let needle = match self.daemon {
            Daemon::Bird => "Established",
            Daemon::Frr => "\"state\":\"Established\"",
        };
        out.map(|o| o.matches(needle).count()).unwrap_or(0)
    }

    /// FRR's `show bgp summary` (every address family), for what the JSON
    /// form does not say, such as a neighbour with `NoNeg` (an address
    /// family activated that the peer never offered). Empty for BIRD.
    pub fn frr_summary(&self) -> String {
        if self.daemon != Daemon::Frr {
            return String::new();
        }
        self.vtysh("show bgp summary").unwrap_or_default()
    }

    /// One `vtysh` command against this FRR's sockets.
    fn vtysh(&self, command: &str) -> Result<String> {
        let d = self.dir.display().to_string();
        crate::netns::run(
            "ip",
            &[
                "netns",
                "exec",
                &self.ns,
                "vtysh",
                "--vty_socket",
                &d,
                "-c",
                command,
            ],
        )
    }

    /// Waits until `n` sessions are established.
    pub fn wait_established(&self, n: usize, timeout: Duration) -> Result<()> {
        wait_for(
            &format!("{} BGP sessions of {}", n, self.daemon.name()),
            timeout,
            || (self.established() >= n).then_some(()),
        )
        .map_err(|e| {
            let logs = self.logs();
            NetnsError::Failed {
                command: format!("{} in {}", self.daemon.name(), self.ns),
                status: e.to_string(),
                stderr: logs,
            }
        })
    }

    /// The daemon's log files, for a failure message.
    pub fn logs(&self) -> String {
        ["bird.log", "zebra.log", "bgpd.log"]
            .iter()
            .filter_map(|f| {
                let text = std::fs::read_to_string(self.dir.join(f)).ok()?;
                let tail: Vec<&str> = text.lines().rev().take(30).collect();
                Some(format!(
                    "--- {f}\n{}",
                    tail.into_iter().rev().collect::<Vec<_>>().join("\n")
                ))
            })
            .collect::<Vec<_>>()
            .join("\n")
    }
}

/// The next hops of the kernel's route to `dst` (a host route) in `ns`:
/// the gateways of a multipath route, or the one of a single path; empty
/// when there is no route.
pub fn next_hops(ns: &Netns, dst: IpAddr) -> BTreeSet<IpAddr> {
    let family = if dst.is_ipv4() { "-4" } else { "-6" };
    let Ok(out) = ns.ip(&format!("{family} -j route show {dst}")) else {
        return BTreeSet::new();
    };
    let Ok(routes) = serde_json::from_str::<serde_json::Value>(&out) else {
        return BTreeSet::new();
    };
    let mut hops = BTreeSet::new();
    for r in routes.as_array().into_iter().flatten() {
        let gateway = |v: &serde_json::Value| v.get("gateway")?.as_str()?.parse::<IpAddr>().ok();
        hops.extend(gateway(r));
        for h in r
            .get("nexthops")
            .and_then(|n| n.as_array())
            .into_iter()
            .flatten()
        {
            hops.extend(gateway(h));
        }
    }
    hops
}

fn io_error(what: &str, path: &Path, e: std::io::Error) -> NetnsError {
    NetnsError::Failed {
        command: format!("{what} {}", path.display()),
        status: "failed".into(),
        stderr: e.to_string(),
    }
}
