//! The kernel side of the shell: the worker that runs the core's address
//! batches off the loop, kernel events and their resubscription, and
//! reading links and routes when they change.

use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;

use hostlb_api::Family;
use tokio::sync::mpsc;
use tracing::{debug, error, info, warn};

use super::Agent;
use super::config::AgentConfig;
use super::core::links::Links;
use super::core::{Input, OpError, OpKind, OpResult};
use super::telemetry::Telemetry;
use crate::addrs::{AddressBackend, Events, Interface, KernelEvent};

impl<B: AddressBackend + 'static> Agent<B> {
    /// What a kernel event asks of the loop: an address gone is an input;
    /// a change of links or carrier asks for a read of the links.
    pub(super) fn kernel_event(&mut self, ev: KernelEvent) -> Option<Input> {
        match ev {
            KernelEvent::AddressRemoved(a) => Some(Input::AddressRemoved(a)),
            KernelEvent::CarrierLost { ifindex, interface } => {
                if self.core.links().is_announce(ifindex)
                    || self.core.held().any(|(_, h)| h.vip.ifindex == ifindex)
                {
                    warn!(%interface, "carrier lost; releasing its VIPs");
                }
                self.link_reads.ask();
                None
            }
            KernelEvent::CarrierRegained { interface, .. } => {
                info!(%interface, "carrier back");
                self.link_reads.ask();
                None
            }
            KernelEvent::Resync => {
                // Read by the worker, after the operations in flight, so
                // that the read is not older than their results.
                self.kernel.read();
                self.link_reads.ask();
                None
            }
            KernelEvent::LinksChanged => {
                self.link_reads.ask_soon();
                None
            }
        }
    }

    pub(super) async fn resubscribe(&mut self) -> Events {
        loop {
            match self.backend.subscribe().await {
                Ok(ev) => {
                    self.kernel.read();
                    return ev;
                }
                Err(e) => {
                    warn!(error = %e, "cannot subscribe to kernel events; retrying");
                    tokio::time::sleep(Duration::from_secs(1)).await;
                }
            }
        }
    }

    /// The links read now, the loop waiting: only where the next step
    /// must have them (a reload, which may create the virtual interface).
    pub(super) async fn read_links(&mut self) -> Links {
        let (links, complete) =
            read_links_telling(&*self.backend, &self.cfg, self.ensure_virtual).await;
        self.ensure_virtual = false;
        if !complete {
            self.link_reads.ask_soon();
        }
        self.links_read(links)
    }

    /// A read of the links, as the loop takes it: counted in telemetry.
    pub(super) fn links_read(&self, links: Links) -> Links {
        note_announce_interface(&self.telemetry, &self.cfg, &links);
        let carrier = [links.announce_v4, links.announce_v6]
            .into_iter()
            .flatten()
            .all(|i| links.by_index(i).is_some_and(|l| l.carrier));
        self.telemetry.carrier.store(carrier, Ordering::Relaxed);
        if let Some(upstream) = &self.upstream {
            upstream.set(gateway_probes(&links));
        }
        links
    }
}

/// The gateways to check, each from the MAC of the link it is reached
/// through: none on a link without carrier (nothing would answer) or
/// without a MAC (no ARP there).
pub(super) fn gateway_probes(links: &Links) -> Vec<crate::announce::gateway::Probe> {
    links
        .gateways
        .iter()
        .filter_map(|g| {
            let link = links.by_index(g.ifindex).filter(|l| l.carrier)?;
            Some(crate::announce::gateway::Probe {
                gateway: g.clone(),
                mac: link.mac?,
            })
        })
        .collect()
}

/// The least time between a read of the links and one asked for soon.
pub(super) const SOON_GAP: Duration = Duration::from_secs(1);

/// Reads of the links and routes, off the loop. A read waits for the
/// kernel's RTNL lock, which any namespace's link changes take and which
/// a busy host (another namespace being set up or torn down) may hold for
/// seconds. Read in the loop, that wait held up everything behind it: a
/// new owner's add was done, but its result, and so its announcement,
/// waited 140 ms behind a read, while the old owner went on answering. Here
/// the loop asks ([`LinkReads::ask`]) and goes on; the read comes back as
/// an input of its own. Asks made while a read runs become one read after
/// it, so a burst of kernel events costs two reads, not one each.
///
/// Asks come in two kinds. A carrier change or a resync asks now
/// ([`LinkReads::ask`]): the VIPs of a link that lost carrier go
/// elsewhere on this read. A route or link change that may show in a read
/// ([`KernelEvent::LinksChanged`](crate::addrs::KernelEvent), and the
/// safety read) asks soon ([`LinkReads::ask_soon`]): at once after a quiet
/// spell, but at most once per [`SOON_GAP`] after any read, so a host whose
/// routes churn (a routing daemon, pods coming and going) costs no more
/// reads than a read every second did.
pub(super) struct LinkReads {
    ask: tokio::sync::watch::Sender<(u64, Arc<AgentConfig>)>,
    soon: tokio::sync::watch::Sender<()>,
    results: mpsc::UnboundedReceiver<(u64, Links)>,
    /// Bumped when the configuration changes: a read made under the old one
    /// is dropped when it comes back.
    generation: u64,
    _task: crate::addrs::AbortOnDrop,
}

impl LinkReads {
    pub(super) fn start<B: AddressBackend + 'static>(
        backend: Arc<B>,
        cfg: AgentConfig,
    ) -> LinkReads {
        let (ask, mut asked) = tokio::sync::watch::channel((0, Arc::new(cfg)));
        let (soon, mut asked_soon) = tokio::sync::watch::channel(());
        let (done, results) = mpsc::unbounded_channel();
        let task = tokio::spawn(async move {
            let mut soon_from = tokio::time::Instant::now();
            // The last read failed: another is owed, as if asked soon.
            let mut failed = false;
            loop {
                let asked_at_all = tokio::select! {
                    biased;
                    now = asked.changed() => now.is_ok(),
                    later = async {
                        tokio::time::sleep_until(soon_from).await;
                        if failed {
                            return Ok(());
                        }
                        asked_soon.changed().await
                    } => later.is_ok(),
                };
                if !asked_at_all {
                    return;
                }
                // This read answers both kinds of ask made so far.
                asked_soon.mark_unchanged();
                let (generation, cfg) = asked.borrow_and_update().clone();
                soon_from = tokio::time::Instant::now() + SOON_GAP;
                let started = std::time::Instant::now();
                let (links, complete) = read_links_telling(&*backend, &cfg, false).await;
                failed = !complete;
                if started.elapsed() >= super::SLOW_TURN {
                    debug!(
                        took_ms = started.elapsed().as_millis() as u64,
                        "slow read of the links"
                    );
                }
                if done.send((generation, links)).is_err() {
                    return;
                }
            }
        });
        LinkReads {
            ask,
            soon,
            results,
            generation: 0,
            _task: crate::addrs::AbortOnDrop(task),
        }
    }

    /// Asks for a read now; it comes back from [`LinkReads::next`].
    pub(super) fn ask(&self) {
        self.ask.send_modify(|_| {});
    }

    /// Asks for a read within [`SOON_GAP`] of the last one; it comes back
    /// from [`LinkReads::next`].
    pub(super) fn ask_soon(&self) {
        self.soon.send_modify(|_| {});
    }

    /// Reads from now on follow `cfg`; those made before are dropped. Asks
    /// nothing itself: the reload reads the links in the loop.
    pub(super) fn set_config(&mut self, cfg: &AgentConfig) {
        self.generation += 1;
        let next = (self.generation, Arc::new(cfg.clone()));
        self.ask.send_if_modified(|now| {
            *now = next;
            false
        });
    }

    /// The next read made under the configuration in force.
    pub(super) async fn next(&mut self) -> Links {
        loop {
            match self.results.recv().await {
                Some((generation, links)) if generation == self.generation => return links,
                Some(_) => continue,
                // The task ends only with this value.
                None => std::future::pending::<()>().await,
            }
        }
    }
}

/// Kernel address operations, carried out one batch after another by a
/// task of their own (see [`kernel_worker`]).
pub(super) struct Kernel {
    pub(super) batches: mpsc::UnboundedSender<KernelJob>,
    pub(super) results: mpsc::UnboundedReceiver<Input>,
    /// Runs the worker; it ends with the agent.
    _thread: KernelThread,
}

/// The thread that talks to the kernel: the netlink connections and the
/// worker that carries out the core's batches run on it, not on the loop's
/// thread. On one thread, every await of a batch (a dump, each add or
/// delete, the wait for IPv6 listening) waited behind whatever step the
/// loop was in: in a drain on a loaded host, gossip steps of 20-30 ms each
/// stretched the removal of four handed-over IPv6 addresses to 165 ms,
/// while the new owner answered too. The loop's own netlink reads (links,
/// adoption) are served by the same connections, so they never wait on a
/// socket nobody polls either.
pub(super) struct KernelThread {
    handle: tokio::runtime::Handle,
    /// Dropped with the agent, which ends the thread and its tasks.
    _stop: tokio::sync::oneshot::Sender<()>,
}

impl KernelThread {
    pub(super) fn start() -> std::io::Result<KernelThread> {
        let runtime = tokio::runtime::Builder::new_current_thread()
            .max_blocking_threads(2)
            .enable_all()
            .build()?;
        let handle = runtime.handle().clone();
        let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
        std::thread::Builder::new()
            .name("kernel".into())
            .spawn(move || {
                runtime.block_on(async {
                    let _ = stopped.await;
                });
            })?;
        Ok(KernelThread {
            handle,
            _stop: stop,
        })
    }

    /// Runs `f` on the thread: whatever it spawns (a netlink connection)
    /// stays there.
    pub(super) async fn run<F>(&self, f: F) -> F::Output
    where
        F: std::future::Future + Send + 'static,
        F::Output: Send + 'static,
    {
        match self.handle.spawn(f).await {
            Ok(out) => out,
            Err(e) => std::panic::resume_unwind(e.into_panic()),
        }
    }
}

/// One batch for the kernel worker: addresses to add, then to remove,
/// then (`read`) our addresses read back for the core.
#[derive(Default)]
pub(super) struct KernelJob {
    pub(super) add: Vec<crate::addrs::VipAddress>,
    pub(super) remove: Vec<crate::addrs::VipAddress>,
    pub(super) read: bool,
}

impl Kernel {
    /// Asks for our addresses as the kernel has them once the operations
    /// asked for so far are done, as [`Input::KernelOwned`].
    fn read(&self) {
        // The worker lives as long as the agent.
        let _ = self.batches.send(KernelJob {
            read: true,
            ..KernelJob::default()
        });
    }
}

/// Longest an add waits for a firewall that closes its VIP: as long as one
/// `nft` run may take (`firewall::NFT_TIMEOUT`).
const GUARD_WAIT: std::time::Duration = crate::firewall::NFT_TIMEOUT;

/// The kernel worker: batches in the order the core asked for them, each
/// carried out by the backend's batch calls (IPv4 adds, IPv6 adds,
/// removals), the results of each call back to the loop as it ends. An
/// add whose VIP no firewall table in force closes yet waits aside (see
/// [`super::firewall::Gate`]) while the batches after it go on.
pub(super) fn kernel_worker<B: AddressBackend + 'static>(
    backend: Arc<B>,
    thread: KernelThread,
    mut guard: tokio::sync::watch::Receiver<super::firewall::Guard>,
) -> Kernel {
    let (batches, mut rx) = mpsc::unbounded_channel::<KernelJob>();
    let (done, results) = mpsc::unbounded_channel();
    thread.handle.spawn(async move {
        let mut gate = super::firewall::Gate::default();
        // The firewall task ends only with the agent; then nothing parked
        // will be covered any more.
        let mut guard_gone = false;
        loop {
            let deadline = gate.deadline();
            let KernelJob {
                mut add,
                mut remove,
                mut read,
            } = tokio::select! {
                job = rx.recv() => match job {
                    Some(job) => job,
                    None => return,
                },
                changed = guard.changed(), if !gate.is_empty() && !guard_gone => {
                    guard_gone = changed.is_err();
                    KernelJob::default()
                }
                () = tokio::time::sleep_until(deadline.unwrap_or_else(tokio::time::Instant::now)),
                    if deadline.is_some() => KernelJob::default(),
            };
            // Whatever queued up meanwhile goes in the same batch (one link
            // read, one record write): the core has at most one operation
            // in flight per VIP, so batches never disagree about one, and
            // a burst (a heal's conflicts settled one claim at a time) costs
            // one batch, not hundreds one after another. A read goes after
            // all of them: what it finds is then no older than any result
            // (a parked add's VIP has its operation in flight, which the
            // core leaves out of what it compares with a read).
            while let Ok(job) = rx.try_recv() {
                add.extend(job.add);
                remove.extend(job.remove);
                read |= job.read;
            }
            // No VIP is added before a firewall that closes it is in force
            // (see `firewall::Guard`); one that cannot be is refused, and
            // the core tries it again later.
            let sorted = gate.sort(
                &guard.borrow_and_update(),
                add,
                GUARD_WAIT,
                tokio::time::Instant::now(),
            );
            let mut refused = sorted.refused;
            if guard_gone {
                refused.extend(gate.refuse_all("shutting down"));
            }
            if let Some((first, waited)) = sorted.go.iter().max_by_key(|(_, w)| *w)
                && *waited >= Duration::from_millis(100)
            {
                debug!(first = %first.ip, waited_ms = waited.as_millis() as u64,
                    "adds waited for the firewall table that closes them");
            }
            if let Some((first, why)) = refused.first() {
                warn!(count = refused.len(), first = %first.ip, reason = %why,
                    "VIPs not added: no firewall closing them is in force; the core tries again");
            }
            let refused: Vec<OpResult> = refused
                .into_iter()
                .map(|(vip, why)| OpResult {
                    ip: vip.ip,
                    kind: OpKind::Add,
                    result: Err(OpError::Unguarded(why)),
                })
                .collect();
            if !refused.is_empty() && done.send(Input::Done(refused)).is_err() {
                return;
            }
            // IPv4 adds go on their own, and their results back at once: an
            // IPv6 add waits for the kernel to listen for its address
            // (`addrs/netlink/listening.rs`), which a busy host does late,
            // and the IPv4 addresses of a mixed batch would wait with it,
            // unannounced, while their old owner answers too.
            let (add4, add6): (Vec<_>, Vec<_>) = sorted
                .go
                .into_iter()
                .map(|(v, _)| v)
                .partition(|v| v.ip.is_ipv4());
            for (kind, vips) in [
                (OpKind::Add, add4),
                (OpKind::Add, add6),
                (OpKind::Remove, remove),
            ] {
                if vips.is_empty() {
                    continue;
                }
                let results = match kind {
                    OpKind::Add => backend.add_many(&vips).await,
                    OpKind::Remove => backend.remove_many(&vips).await,
                };
                let out = vips
                    .iter()
                    .zip(results)
                    .map(|(vip, result)| OpResult {
                        ip: vip.ip,
                        kind,
                        result: result.map_err(|e| OpError::Kernel(e.to_string())),
                    })
                    .collect();
                if done.send(Input::Done(out)).is_err() {
                    return;
                }
            }
            if read {
                match backend.owned().await {
                    Ok(owned) => {
                        if done.send(Input::KernelOwned(owned)).is_err() {
                            return;
                        }
                    }
                    Err(e) => warn!(error = %e, "cannot read the kernel's addresses"),
                }
            }
        }
    });
    Kernel {
        batches,
        results,
        _thread: thread,
    }
}

/// The links snapshot; errors leave the affected part empty (logged), so a
/// missing default route means "no announce interface", not a crash.
pub(super) async fn read_links<B: AddressBackend>(
    backend: &B,
    cfg: &AgentConfig,
    ensure_virtual: bool,
) -> Links {
    read_links_telling(backend, cfg, ensure_virtual).await.0
}

/// [`read_links`], and whether the links and routes could be read: a read
/// that failed shows no link at all, so the VIPs held go elsewhere until
/// the next read, which must come soon rather than at the next change.
async fn read_links_telling<B: AddressBackend>(
    backend: &B,
    cfg: &AgentConfig,
    ensure_virtual: bool,
) -> (Links, bool) {
    let configured = cfg.announce.interface.as_deref();
    let read = backend.links_and_announce(configured).await;
    let (all, found, local, gateways) = (read.all, read.announce, read.local, read.gateways);
    let complete = all.is_ok();
    let all = match all {
        Ok(a) => a,
        Err(e) => {
            warn!(error = %e, "cannot read links; reading again in a second");
            Vec::new()
        }
    };
    let mut announce = [None, None];
    for ((slot, family), found) in announce.iter_mut().zip([Family::V4, Family::V6]).zip(found) {
        *slot = match found {
            Ok(i) => Some(i.index),
            Err(e) => {
                debug!(%family, error = %e, "no announce interface");
                None
            }
        };
    }
    let virtual_link = match &cfg.announce.virtual_interface {
        None => None,
        Some(name) if ensure_virtual => match backend.ensure_virtual_interface(name).await {
            Ok(i) => Some(i),
            Err(e) => {
                warn!(error = %e, "virtual mode is off");
                None
            }
        },
        Some(name) => all.iter().find(|i| i.name == *name).cloned(),
    };
    let links = Links {
        all,
        local,
        gateways,
        announce_v4: announce[0],
        announce_v6: announce[1],
        virtual_link: virtual_link.map(|v: Interface| Interface {
            prefixes: Vec::new(),
            ..v
        }),
    };
    (links, complete)
}

/// A node with no announce interface publishes no subnet of its own in
/// gossip, so the election already leaves it out of every on-link VIP; this
/// says why, once per change, in the log, `/readyz` and a metric, so that
/// a typo in `announce.interface` is not a node that silently never serves.
pub(super) fn note_announce_interface(telemetry: &Telemetry, cfg: &AgentConfig, links: &Links) {
    let missing = links.announce_v4.is_none() && links.announce_v6.is_none();
    let was = telemetry.no_announce_interface.set(i64::from(missing)) > 0;
    if missing && !was {
        match &cfg.announce.interface {
            Some(name) => error!(
                interface = %name,
                "announce.interface not found: no candidate for addresses on the host's subnets until it appears; peers serve them"
            ),
            None => error!(
                "no default route, so no announce interface: no candidate for addresses on the host's subnets until one appears; peers serve them"
            ),
        }
    } else if was && !missing {
        info!("announce interface found; a candidate again");
    }
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeSet;
    use std::net::IpAddr;

    use super::super::firewall::Guard;
    use super::*;
    use crate::addrs::MemoryBackend;
    use crate::model::{Lifetime, VipAddress};

    fn vip(ifindex: u32, ip: &str) -> VipAddress {
        VipAddress {
            interface: "eth0".into(),
            ifindex,
            ip: ip.parse().unwrap(),
            prefix_len: 24,
            lifetime: Lifetime::FOREVER,
        }
    }

    fn in_force(ips: &[&str]) -> Guard {
        Guard::InForce {
            vips: Arc::new(ips.iter().map(|s| s.parse::<IpAddr>().unwrap()).collect()),
            failing: None,
        }
    }

    /// The results of the next `Done`, as (ip, ok).
    async fn next_done(kernel: &mut Kernel) -> Vec<(IpAddr, bool)> {
        let got = tokio::time::timeout(Duration::from_secs(5), kernel.results.recv())
            .await
            .expect("a result within 5 s, not after another add's wait for the firewall");
        match got {
            Some(Input::Done(r)) => r.iter().map(|r| (r.ip, r.result.is_ok())).collect(),
            other => panic!("expected Done, got {other:?}"),
        }
    }

    /// An add whose VIP no table closes yet (a previous run's address,
    /// renewed before its Service is known gone) waits aside: the adds of
    /// covered VIPs asked for after it are carried out at once, and it goes
    /// itself once a table closes it.
    #[tokio::test]
    async fn an_add_waiting_for_the_firewall_holds_no_other_add_behind_it() {
        let backend = Arc::new(MemoryBackend::new());
        let eth0 = backend.add_link("eth0", None, &["10.0.1.0/24"]);
        let (guard_tx, guard) = tokio::sync::watch::channel(Guard::Pending);
        let mut kernel = kernel_worker(backend.clone(), KernelThread::start().unwrap(), guard);
        let (old, new) = ("10.0.1.200", "10.0.1.201");
        kernel
            .batches
            .send(KernelJob {
                add: vec![vip(eth0, old)],
                ..KernelJob::default()
            })
            .unwrap();
        // The first table closes the new VIP only.
        tokio::time::sleep(Duration::from_millis(50)).await;
        guard_tx.send_replace(in_force(&[new]));
        kernel
            .batches
            .send(KernelJob {
                add: vec![vip(eth0, new)],
                read: true,
                ..KernelJob::default()
            })
            .unwrap();
        assert_eq!(next_done(&mut kernel).await, [(new.parse().unwrap(), true)]);
        match kernel.results.recv().await {
            Some(Input::KernelOwned(owned)) => {
                let ips: BTreeSet<String> = owned.iter().map(|o| o.ip.to_string()).collect();
                assert_eq!(
                    ips,
                    BTreeSet::from([new.to_string()]),
                    "the parked add not done"
                );
            }
            other => panic!("expected the read, got {other:?}"),
        }
        guard_tx.send_replace(in_force(&[old, new]));
        assert_eq!(next_done(&mut kernel).await, [(old.parse().unwrap(), true)]);
        let held: BTreeSet<String> = backend
            .addresses()
            .iter()
            .map(|a| a.ip.to_string())
            .collect();
        assert_eq!(held, BTreeSet::from([old.to_string(), new.to_string()]));
    }

    /// A read asked for soon (a route changed) comes at once after a
    /// quiet spell, then at most once a gap however often it is asked
    /// for; a read asked for now (carrier) never waits for the gap, and
    /// answers the soon ones asked before it.
    async fn read(reads: &mut LinkReads, within: Duration) -> bool {
        tokio::time::timeout(within, reads.next()).await.is_ok()
    }

    #[tokio::test(start_paused = true)]
    async fn soon_reads_come_at_most_once_a_gap_and_urgent_ones_at_once() {
        let backend = Arc::new(MemoryBackend::new());
        backend.add_link("eth0", None, &["10.0.0.0/24"]);
        let dir = tempfile::tempdir().unwrap();
        let cfg = AgentConfig::for_test("node-a", "127.0.0.1:7934".parse().unwrap(), dir.path());
        let mut reads = LinkReads::start(Arc::clone(&backend), cfg);
        let quick = Duration::from_millis(10);

        reads.ask_soon();
        assert!(read(&mut reads, quick).await, "at once after a quiet spell");
        let asked = tokio::time::Instant::now();
        for _ in 0..5 {
            reads.ask_soon();
        }
        assert!(
            !read(&mut reads, SOON_GAP - 2 * quick).await,
            "not within the gap"
        );
        assert!(
            read(&mut reads, 3 * quick).await,
            "one read at the gap's end"
        );
        assert!(asked.elapsed() >= SOON_GAP - quick);
        assert!(
            !read(&mut reads, 3 * SOON_GAP).await,
            "the five asks made one read"
        );

        reads.ask_soon();
        assert!(read(&mut reads, quick).await, "quiet again: at once");
        reads.ask_soon();
        reads.ask();
        assert!(
            read(&mut reads, quick).await,
            "an urgent ask waits for no gap"
        );
        assert!(
            !read(&mut reads, 3 * SOON_GAP).await,
            "and it answered the soon one before it"
        );

        // A read that failed is made again a gap later, unasked, until
        // one works.
        backend.set_links_unreadable(true);
        reads.ask();
        assert!(read(&mut reads, quick).await);
        assert!(read(&mut reads, SOON_GAP + quick).await, "again");
        backend.set_links_unreadable(false);
        let links = tokio::time::timeout(SOON_GAP + quick, reads.next())
            .await
            .expect("and again");
        assert_eq!(links.all.len(), 1, "this one worked");
        assert!(!read(&mut reads, 3 * SOON_GAP).await, "and was the last");
    }
}
