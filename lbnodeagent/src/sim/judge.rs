//! What the checker is handed: the world as a client would judge it, after
//! every event and once everything has healed.

use super::*;

impl World {
    /// Hands the checker what it needs to know about the world now.
    pub(super) fn judge(&mut self, f: impl FnOnce(&mut check::Checker, &check::Context, Duration)) {
        // Out of the world while the context borrows the rest of it.
        let mut checker = std::mem::replace(&mut self.checker, check::Checker::new(Duration::ZERO));
        let mut costs = self.costs.take();
        costs::timed(costs.as_mut().map(|c| &mut c.checker), || {
            let ctx = context(self);
            f(&mut checker, &ctx, self.t);
        });
        self.costs = costs;
        self.checker = checker;
    }

    pub(super) fn sweep(&mut self) {
        self.judge(|checker, ctx, t| checker.sweep(t, ctx));
    }

    pub(super) fn final_check(&mut self) {
        let held: Vec<BTreeSet<(u32, IpAddr)>> = self
            .hosts
            .iter()
            .map(|h| h.kernel.keys().copied().collect())
            .collect();
        self.judge(|checker, ctx, t| checker.finish(t, ctx, &held));
    }
}

/// What the checker needs to know about the hosts now.
pub(super) fn context(w: &World) -> check::Context<'_> {
    let hosts = &w.hosts;
    let ready =
        |h: &Host| h.agent == Agent::Running && h.core.as_ref().is_some_and(|c| c.is_ready());
    // The newest view a running agent has: no agent can serve a Service
    // none of them has heard of (created just before the API server went
    // away), and one that knows better acts on it (a leaving node that
    // learns nobody may hold a VIP any more lets it go).
    let newest = hosts
        .iter()
        .filter(|h| h.agent == Agent::Running)
        .map(|h| h.api_content)
        .max()
        .unwrap_or(w.truth.content);
    check::Context {
        hosts: hosts
            .iter()
            .map(|h| check::HostState {
                agent_running: h.agent == Agent::Running,
                stopped_at: h.stopped_at.filter(|_| h.agent != Agent::Running),
                thawed_at: h.thawed_at,
                cleanup_since: h.cleanup_since,
                stalled_since: h.stalled_since,
                ready: ready(h),
                leaving: h
                    .core
                    .as_ref()
                    .is_some_and(|c| c.is_leaving())
                    .then(|| h.termed_at.expect("only SIGTERM starts a leave")),
                flaky: h.flaky,
                ready_due: (h.agent == Agent::Running
                    && w.api_up
                    && !h.api_cut
                    && !h.flaky
                    && !h.core.as_ref().is_some_and(|c| c.is_leaving()))
                .then(|| h.unhindered_since + crate::bounds::READY_BOUND),
                faulty: !h.powered
                    || (h.agent == Agent::Frozen && h.stalled_since.is_none())
                    || h.killed
                    || !h.port_up
                    || h.blocked
                    || h.api_cut
                    || h.flaky,
                // As its agent heard of it and gossips it, not as the
                // record says: during an API outage nobody knows yet.
                drained: h.agent != Agent::Stopped && h.drain_heard == Some(true),
                gateway_lost: h.agent != Agent::Stopped && h.gateway_heard,
                gateway_changed_at: h.gateway_changed_at,
                published: (h.generation, h.pub_version),
                heard: &h.known,
                name: &h.name,
            })
            .collect(),
        reach: &w.reach,
        on_link: check::mask(hosts.iter().map(|h| h.powered && h.port_up)),
        ready: check::mask(hosts.iter().map(ready)),
        versions: &w.versions,
        host_versions: hosts.iter().map(|h| h.api_content.max(1)).collect(),
        newest: newest.max(1),
        latest: w.truth.content,
        api_up: w.api_up,
        exchanges: &w.exchanges,
    }
}

/// What the host's kernel holds, all of it the agent's.
pub(super) fn owned_addresses(h: &Host) -> Vec<OwnedAddress> {
    h.kernel
        .iter()
        .map(|((ifindex, ip), a)| OwnedAddress {
            interface: if *ifindex == ETH0 { "eth0" } else { "kube-lb0" }.into(),
            ifindex: *ifindex,
            ip: *ip,
            prefix_len: a.prefix_len,
        })
        .collect()
}
