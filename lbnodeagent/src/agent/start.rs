//! Start-up: reading the configuration and the host, the kube client, the
//! core's settings, joining gossip as `starting`, and `keygen`.

use std::net::{IpAddr, SocketAddr};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

use hostlb_api::Family;
use hostlb_api::runtime::signals::Signals;
use tracing::{debug, error, info, warn};

use super::config::AgentConfig;
use super::core::links::Links;
use super::core::{Core, Settings, Unable};
use super::kernel::{KernelThread, LinkReads, kernel_worker, note_announce_interface, read_links};
use super::telemetry::Telemetry;
use super::watches::KubeInputs;
use super::wire::open_wire;
use super::{Agent, AgentError, Gossip};
use super::{beats, record, report, telemetry};
use crate::addrs::{AddressBackend, Interface, NetlinkBackend, NetlinkConfig};
use crate::announce::Announcer;
use crate::gossip::Membership;
use crate::inputs::Scope;

impl<B: AddressBackend + 'static> Agent<B> {
    /// Reads the host, joins gossip (as `starting`) and starts the watches;
    /// nothing is added or removed before [`run`](Self::run) has a complete
    /// cluster view and membership has settled.
    pub(super) async fn start(
        mut cfg: AgentConfig,
        config_path: PathBuf,
        backend: Arc<B>,
        announcer: Option<Arc<Announcer>>,
        kernel_thread: KernelThread,
    ) -> Result<Agent<B>, AgentError> {
        info!(node = %cfg.node_name, version = crate::VERSION, "starting");
        nft_for(&cfg)?;
        let telemetry = Telemetry::new();
        let links = read_links(&*backend, &cfg, true).await;
        note_announce_interface(&telemetry, &cfg, &links);

        cfg.gossip.listen = cfg.gossip.usable_listen();
        if cfg.gossip.advertise.is_none() && cfg.gossip.listen.ip().is_unspecified() {
            cfg.gossip.advertise = Some(default_advertise(cfg.gossip.listen, &links)?);
        }
        let wire = open_wire(announcer);
        telemetry.set_claims_refused(wire.refused.clone());
        let core_settings = settings(&cfg, wire.announcer.is_some() && wire.claims.is_some());
        if let Some(why) = &core_settings.unable {
            error!("{why}");
            telemetry.cannot_serve.set(1);
        }
        let core = Core::new(core_settings, links, Instant::now());
        let identity = Arc::new(crate::identity::NodeKey::load_or_create(&cfg.run_dir)?);
        let identities = crate::identity::Identities::new();
        identities.set(
            &cfg.node_name,
            crate::identity::Known::Key(identity.public()),
        );
        info!(identity = %identity.public(), "this node's identity");
        let transport = cfg
            .gossip
            .auth_transport()?
            .with_identities(identities.clone());
        telemetry.set_gossip_counters(transport.counters());
        let membership =
            Membership::start(&cfg.gossip, core.local_state(), &transport, &transport).await?;
        // Each step of the start that waits says so once done: a start
        // that hangs past the watchdog (3 s) is killed without a word,
        // and this is what tells where it was.
        membership.sign_with(identity.clone()).await;
        debug!("start: this node's gossip state is signed");
        telemetry.set_gossip_held(membership.gossip_held_counter());
        telemetry.set_detector_counters(membership.detector_counters());
        let views = membership.views();
        let (beats, beats_in) = match membership.take_beats() {
            Some(link) => {
                write_generation(&cfg.run_dir, link.generation);
                (
                    Some(beats::Beats::start(
                        cfg.node_name.clone(),
                        link.generation,
                        link.send,
                        beats::Prover {
                            key: identity.clone(),
                            identities: identities.clone(),
                            views: views.clone(),
                            counter: Arc::default(),
                        },
                    )),
                    Some(link.recv),
                )
            }
            None => (None, None),
        };

        let (client, server) = kube_client(&cfg).await?;
        debug!("start: the API client is made");
        for w in token_warnings(&cfg.kubeconfig, jiff::Timestamp::now()) {
            warn!("{w}");
        }
        let scope = Scope {
            namespace: cfg.namespace.clone(),
            load_balancer_class: cfg.load_balancer_class.clone(),
        };
        let kube = KubeInputs::start(&client, &scope, &server, &cfg.node_name);
        let mut records = record::Records::new(&client).with_identities(
            identities.clone(),
            &cfg.node_name,
            crate::identity::Known::Key(identity.public()),
        );
        records.ask();
        let publisher = record::Publisher::start(&client, &cfg.node_name);
        let admission =
            super::admission::start(client.clone(), kube.services.clone(), telemetry.clone());
        let report = report::start(
            client,
            &cfg.node_name,
            kube.services.clone(),
            telemetry.clone(),
        );

        hostlb_api::runtime::admin::serve(cfg.http_listen, telemetry::router(telemetry.clone()))
            .await
            .map_err(|source| AgentError::Http {
                addr: cfg.http_listen,
                source,
            })?;
        debug!(listen = %cfg.http_listen, "start: the HTTP endpoint listens");
        let firewall = super::firewall::start(telemetry.clone(), cfg.firewall);
        let kernel = kernel_worker(backend.clone(), kernel_thread, firewall.guard());
        let link_reads = LinkReads::start(backend.clone(), cfg.clone());
        let upstream = cfg
            .upstream
            .enabled
            .then(|| crate::announce::gateway::GatewayProbe::start(cfg.upstream.lost_after));
        let config_hash = record::config_hash(&cfg);
        let beat_check = beats::BeatCheck::new(
            identity.clone(),
            identities.clone(),
            cfg.gossip.replay_window,
        );
        let peers_file = super::checks::PeersFile::new(&cfg.run_dir);
        Ok(Agent {
            core,
            cfg,
            beat_check,
            beats_warned: None,
            api_answered: true,
            identity,
            identities,
            config_path,
            backend,
            wire,
            gossip: Gossip {
                membership,
                beats,
                beats_in,
                waiting: Vec::new(),
                transport,
                views,
                seeds_given: Vec::new(),
                peers_file,
            },
            kube,
            report,
            records,
            publisher,
            config_hash,
            conflict_seen: None,
            moves: std::collections::VecDeque::new(),
            telemetry,
            kernel,
            link_reads,
            upstream,
            ensure_virtual: false,
            cluster_sent: false,
            drain_sent: false,
            firewall,
            start_code: super::checks::StartCode::Starting,
            _admission: crate::addrs::AbortOnDrop(admission),
        })
    }
}

/// What `lbnodeagent check` can tell without the network, beyond the file
/// itself: that the kubeconfig reads and resolves to a cluster and
/// credentials (certificates and token files loaded), and that the gossip
/// key file loads with a safe mode. Both would stop `run` at start; the
/// unit's `ExecStartPre=` check then fails with the reason instead.
///
/// What may stop the agent later is a warning: a token that expires
/// within [`TOKEN_WARN`]. A firewall that is on while no `nft` can be
/// found to put it in force is an error, here and when the agent starts:
/// the agent adds no VIP before its firewall is in force, so it would win
/// VIPs and never answer for them.
pub async fn check_offline(cfg: &AgentConfig) -> Result<Vec<String>, AgentError> {
    kube_client(cfg).await?;
    crate::gossip::GossipKeys::load(&cfg.gossip.key_file)?;
    nft_for(cfg)?;
    Ok(token_warnings(&cfg.kubeconfig, jiff::Timestamp::now()))
}

/// [`AgentError::NoNft`] when the firewall is on and no `nft` is on the
/// `PATH`.
fn nft_for(cfg: &AgentConfig) -> Result<(), AgentError> {
    let path = std::env::var_os("PATH").unwrap_or_default();
    if cfg.firewall && crate::firewall::nft_in(&path).is_none() {
        return Err(AgentError::NoNft);
    }
    Ok(())
}

/// How long before a token expires `check` and the agent's start warn: a
/// renewal (deploy/agent/kubeconfig.sh) fits in a fortnight.
pub const TOKEN_WARN: Duration = Duration::from_secs(14 * 86_400);

/// A warning for each token file the kubeconfig names whose token expires
/// within [`TOKEN_WARN`] of `now`, or has expired. A token that is no JWT,
/// or has no expiry, says nothing.
pub fn token_warnings(kubeconfig: &Path, now: jiff::Timestamp) -> Vec<String> {
    let Ok(kc) = kube::config::Kubeconfig::read_from(kubeconfig) else {
        return Vec::new();
    };
    let mut out = Vec::new();
    for file in kc
        .auth_infos
        .iter()
        .filter_map(|a| a.auth_info.as_ref()?.token_file.clone())
    {
        let Some(exp) = std::fs::read_to_string(&file)
            .ok()
            .and_then(|t| token_expiry(t.trim()))
        else {
            continue;
        };
        let left = exp.as_second() - now.as_second();
        if left <= 0 {
            out.push(format!(
                "the token in {file} expired at {exp}; the API server refuses it: renew it with deploy/agent/kubeconfig.sh"
            ));
        } else if left < TOKEN_WARN.as_secs() as i64 {
            out.push(format!(
                "the token in {file} expires at {exp}, in {} h; renew it with deploy/agent/kubeconfig.sh",
                left / 3600
            ));
        }
    }
    out
}

/// The `exp` claim of a JWT, read without checking its signature (the
/// server does that): only to warn before it runs out.
fn token_expiry(token: &str) -> Option<jiff::Timestamp> {
    use base64::Engine;
    let claims = token.split('.').nth(1)?;
    let bytes = base64::engine::general_purpose::URL_SAFE_NO_PAD
        .decode(claims.trim_end_matches('='))
        .ok()?;
    let v: serde_json::Value = serde_json::from_slice(&bytes).ok()?;
    jiff::Timestamp::from_second(v.get("exp")?.as_i64()?).ok()
}

/// The client, and the API server's URL (for log lines). Its User-Agent
/// names this node. A credential file others can read is refused first.
pub(super) async fn kube_client(cfg: &AgentConfig) -> Result<(kube::Client, String), AgentError> {
    credential_files_are_private(&cfg.kubeconfig)?;
    hostlb_api::runtime::client::client(Some(&cfg.kubeconfig), "lbnodeagent", &cfg.node_name)
        .await
        .map_err(|e| match e {
            hostlb_api::runtime::client::ClientError::Kubeconfig { path, message } => {
                AgentError::Kubeconfig { path, message }
            }
            other => AgentError::Kubeconfig {
                path: cfg.kubeconfig.clone(),
                message: other.to_string(),
            },
        })
}

/// Notes this run's gossip generation for `cleanup` (see
/// [`super::GENERATION_FILE`]); a failure only costs `cleanup` the
/// generation, so it is a log line.
fn write_generation(run_dir: &Path, generation: u64) {
    let path = run_dir.join(super::GENERATION_FILE);
    let tmp = run_dir.join(format!("{}.tmp", super::GENERATION_FILE));
    let written = std::fs::create_dir_all(run_dir)
        .and_then(|()| std::fs::write(&tmp, format!("{generation}\n")))
        .and_then(|()| std::fs::rename(&tmp, &path));
    if let Err(e) = written {
        warn!(error = %e, path = %path.display(), "cannot note this run's gossip generation; cleanup's leaving beats will name none");
    }
}

/// The kubeconfig, when it holds a secret itself (a token, a password, a
/// client key), and every token or key file it names, are the agent's
/// alone; the first that is not is the error, by name.
pub fn credential_files_are_private(kubeconfig: &Path) -> Result<(), AgentError> {
    use std::os::unix::fs::PermissionsExt;
    let bad = |message: String| AgentError::Kubeconfig {
        path: kubeconfig.to_path_buf(),
        message,
    };
    let kc = kube::config::Kubeconfig::read_from(kubeconfig).map_err(|e| bad(e.to_string()))?;
    let mut private = Vec::new();
    for info in kc.auth_infos.iter().filter_map(|a| a.auth_info.as_ref()) {
        if info.token.is_some() || info.password.is_some() || info.client_key_data.is_some() {
            private.push(kubeconfig.to_path_buf());
        }
        private.extend(info.token_file.iter().map(PathBuf::from));
        private.extend(info.client_key.iter().map(PathBuf::from));
    }
    for path in private {
        // A file that cannot be read is the client's error to report.
        let Ok(meta) = std::fs::metadata(&path) else {
            continue;
        };
        let mode = meta.permissions().mode();
        if mode & crate::gossip::SHARED_MODE_BITS != 0 {
            return Err(AgentError::SecretMode {
                path,
                mode: mode & 0o7777,
            });
        }
    }
    Ok(())
}

/// The address the kernel would use to reach `prefix`: the interface's own
/// address there. A UDP connect sends nothing.
pub(super) fn source_address(prefix: &hostlb_api::Prefix) -> Option<IpAddr> {
    let (first, last) = prefix.range().bounds();
    let target = hostlb_api::address::from_u128(prefix.family(), first.saturating_add(1).min(last));
    let bind: SocketAddr = match target {
        IpAddr::V4(_) => "0.0.0.0:0".parse().ok()?,
        IpAddr::V6(_) => "[::]:0".parse().ok()?,
    };
    let s = std::net::UdpSocket::bind(bind).ok()?;
    s.connect(SocketAddr::new(target, 9)).ok()?;
    Some(s.local_addr().ok()?.ip())
}

/// The core's settings from the configuration.
pub(super) fn settings(cfg: &AgentConfig, wire: bool) -> Settings {
    Settings {
        node: cfg.node_name.as_str().into(),
        lifetime: cfg.announce.lifetime,
        garp: cfg.announce.garp,
        gossip_interval: cfg.gossip.interval,
        wire,
        unable: unable(),
        firewall: cfg.firewall,
    }
}

/// Why this process cannot add addresses, if it cannot: CAP_NET_ADMIN
/// (bit 12) missing from its effective capabilities. Such an agent still
/// gossips and reports, but stands in no election.
pub(super) fn unable() -> Option<Unable> {
    let status = std::fs::read_to_string("/proc/self/status").ok()?;
    let caps = status
        .lines()
        .find_map(|l| l.strip_prefix("CapEff:"))
        .and_then(|v| u64::from_str_radix(v.trim(), 16).ok())?;
    (caps & (1 << 12) == 0).then_some(Unable::NoNetAdmin)
}

/// A new gossip key: 32 random bytes from the kernel, as hex.
/// Writes a new key to `path`, mode 0600 from its first byte and whole or
/// not at all: written to a file beside it, synced, then linked into place,
/// which fails rather than replace a key already there.
pub fn keygen_to(path: &Path) -> std::io::Result<()> {
    use std::io::Write;
    use std::os::unix::fs::OpenOptionsExt;
    let key = zeroize::Zeroizing::new(keygen()?);
    let mut tmp = path.as_os_str().to_owned();
    tmp.push(format!(".{}.tmp", std::process::id()));
    let tmp = PathBuf::from(tmp);
    let written = (|| {
        let mut file = std::fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .mode(0o600)
            .open(&tmp)?;
        writeln!(file, "{}", key.as_str())?;
        file.sync_all()?;
        std::fs::hard_link(&tmp, path)
    })();
    let _ = std::fs::remove_file(&tmp);
    written
}

pub fn keygen() -> std::io::Result<String> {
    use std::io::Read;
    let mut key = [0u8; 32];
    std::fs::File::open("/dev/urandom")?.read_exact(&mut key)?;
    Ok(hex::encode(key))
}

/// Starts the agent on a real host and runs it until SIGTERM/SIGINT.
pub async fn run(config_path: &Path) -> Result<(), AgentError> {
    // First: until the handlers are in, SIGHUP's default action ends the
    // process, and a reload sent while the agent starts would kill it.
    let signals = Signals::new(true).map_err(AgentError::Signals)?;
    let cfg = AgentConfig::load(config_path)?;
    let kernel_thread = KernelThread::start().map_err(AgentError::KernelThread)?;
    let backend = kernel_thread
        .run(NetlinkBackend::new(NetlinkConfig {
            run_dir: cfg.run_dir.clone(),
            ..NetlinkConfig::default()
        }))
        .await?;
    let announcer = match Announcer::new() {
        Ok(a) => Some(Arc::new(a)),
        Err(e) => {
            error!(error = %e, "cannot send gratuitous ARP/NA; VIPs will move as client caches expire");
            None
        }
    };
    Agent::start(
        cfg,
        config_path.to_path_buf(),
        Arc::new(backend),
        announcer,
        kernel_thread,
    )
    .await?
    .run(signals)
    .await
}

/// The address peers reach this node on when `gossip.advertise` is not
/// set and `listen` is a wildcard: its own address on the announce
/// interface, IPv4 when the host has one and the socket can take it,
/// otherwise IPv6. Every node picks the same way, so a fleet with IPv4
/// gossips over IPv4 and an IPv6-only fleet over IPv6; only a fleet mixing
/// IPv6-only hosts with others has to set it. A node with no announce
/// interface (no default route, a typo in `announce.interface`) still
/// gossips, and so tells its peers why it is no candidate: from its first
/// other link with carrier and an on-link prefix.
pub fn default_advertise(listen: SocketAddr, links: &Links) -> Result<SocketAddr, AgentError> {
    let families: &[Family] = if listen.is_ipv4() {
        &[Family::V4]
    } else {
        &[Family::V4, Family::V6]
    };
    let virtual_index = links.virtual_link.as_ref().map(|v| v.index);
    let own = |family: Family| {
        let announce = match family {
            Family::V4 => links.announce_v4,
            Family::V6 => links.announce_v6,
        };
        let first = |i: &Interface| i.prefixes_of(family).next().and_then(source_address);
        announce
            .and_then(|i| links.by_index(i))
            .and_then(first)
            .or_else(|| {
                links
                    .all
                    .iter()
                    .filter(|i| i.carrier && i.mac.is_some() && Some(i.index) != virtual_index)
                    .find_map(first)
            })
    };
    families
        .iter()
        .find_map(|f| own(*f))
        .map(|ip| SocketAddr::new(ip, listen.port()))
        .ok_or(AgentError::NoAdvertise)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::PermissionsExt;

    fn chmod(path: &Path, mode: u32) {
        std::fs::set_permissions(path, std::fs::Permissions::from_mode(mode)).unwrap();
    }

    /// A token file, or a kubeconfig holding a token itself, that others
    /// can read is refused by name; the same at 0600 is taken, and a
    /// kubeconfig without a secret may be world-readable.
    #[test]
    fn a_credential_others_can_read_is_refused_by_name() {
        let dir = tempfile::tempdir().unwrap();
        let token = dir.path().join("token");
        std::fs::write(&token, "t").unwrap();
        let by_file = dir.path().join("by-file.kubeconfig");
        std::fs::write(
            &by_file,
            format!(
                "apiVersion: v1\nkind: Config\nusers:\n- name: u\n  user:\n    tokenFile: {}\n",
                token.display()
            ),
        )
        .unwrap();
        chmod(&by_file, 0o644);
        for mode in [0o644, 0o640, 0o604, 0o660] {
            chmod(&token, mode);
            let e = credential_files_are_private(&by_file).unwrap_err();
            assert!(
                matches!(&e, AgentError::SecretMode { path, mode: m } if *path == token && *m == mode),
                "{mode:o}: {e}"
            );
            assert!(e.to_string().contains("chmod 600"), "{e}");
        }
        chmod(&token, 0o600);
        credential_files_are_private(&by_file).unwrap();

        let inline = dir.path().join("inline.kubeconfig");
        std::fs::write(
            &inline,
            "apiVersion: v1\nkind: Config\nusers:\n- name: u\n  user:\n    token: secret\n",
        )
        .unwrap();
        chmod(&inline, 0o644);
        let e = credential_files_are_private(&inline).unwrap_err();
        assert!(
            matches!(&e, AgentError::SecretMode { path, .. } if *path == inline),
            "{e}"
        );
        chmod(&inline, 0o600);
        credential_files_are_private(&inline).unwrap();
    }

    /// `keygen --output`: mode 0600, one key line, and an existing key is
    /// never replaced.
    /// A token file whose JWT expires within the fortnight, or expired,
    /// is a warning naming the file; a later one, or no JWT, says nothing.
    #[test]
    fn a_token_near_its_expiry_is_a_warning() {
        use base64::Engine;
        let dir = tempfile::tempdir().unwrap();
        let token = dir.path().join("token");
        let kubeconfig = dir.path().join("kubeconfig");
        std::fs::write(
            &kubeconfig,
            format!(
                "apiVersion: v1\nkind: Config\nusers:\n- name: u\n  user:\n    tokenFile: {}\n",
                token.display()
            ),
        )
        .unwrap();
        let now: jiff::Timestamp = "2026-06-01T00:00:00Z".parse().unwrap();
        let jwt = |exp: i64| {
            let b64 = base64::engine::general_purpose::URL_SAFE_NO_PAD;
            format!(
                "{}.{}.sig",
                b64.encode(r#"{"alg":"RS256"}"#),
                b64.encode(format!(
                    r#"{{"exp":{exp},"sub":"system:serviceaccount:hostlb-agents:n1"}}"#
                ))
            )
        };
        let day = 86_400;
        std::fs::write(&token, jwt(now.as_second() + 90 * day)).unwrap();
        assert!(token_warnings(&kubeconfig, now).is_empty());
        std::fs::write(&token, jwt(now.as_second() + 3 * day)).unwrap();
        let w = token_warnings(&kubeconfig, now);
        assert_eq!(w.len(), 1, "{w:?}");
        assert!(
            w[0].contains("in 72 h") && w[0].contains(&token.display().to_string()),
            "{w:?}"
        );
        std::fs::write(&token, jwt(now.as_second() - 1)).unwrap();
        assert!(token_warnings(&kubeconfig, now)[0].contains("expired"));
        std::fs::write(&token, "not-a-jwt").unwrap();
        assert!(token_warnings(&kubeconfig, now).is_empty());
    }

    #[test]
    fn keygen_writes_a_private_key_and_never_replaces_one() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("gossip.key");
        keygen_to(&path).unwrap();
        let mode = std::fs::metadata(&path).unwrap().permissions().mode() & 0o777;
        assert_eq!(mode, 0o600);
        let first = std::fs::read_to_string(&path).unwrap();
        crate::gossip::GossipKeys::load(&path).unwrap();
        let e = keygen_to(&path).unwrap_err();
        assert_eq!(e.kind(), std::io::ErrorKind::AlreadyExists);
        assert_eq!(std::fs::read_to_string(&path).unwrap(), first);
        let left: Vec<_> = std::fs::read_dir(dir.path()).unwrap().collect();
        assert_eq!(left.len(), 1, "no temporary file left behind");
    }
}
