//! The seeded schedule of faults: applied, described, and healed at the
//! end of the fault phase.

use super::*;

impl World {
    pub(super) fn healthy(&self, host: usize) -> bool {
        let h = &self.hosts[host];
        h.powered
            && h.port_up
            && !h.blocked
            && !h.flaky
            && !h.api_cut
            && !h.gateway_lost
            && h.agent == Agent::Running
            && h.core.as_ref().is_some_and(|c| c.is_ready())
    }

    pub(super) fn next_fault(&mut self) {
        let n = self.hosts.len();
        let unhealthy = (0..n).filter(|&h| !self.healthy(h)).count();
        // Keep most nodes serving: a third of them at most in trouble.
        let budget = (n / 3).max(1);
        let candidates: Vec<usize> = (0..n).filter(|&h| self.healthy(h)).collect();
        if unhealthy >= budget || candidates.is_empty() {
            if self.api_up && self.plan.chance(0.2) {
                self.apply(Fault::ApiDown);
                let d = self.plan.ms(1000, 15000);
                self.after(d, Ev::Recover(Fault::ApiUp));
            }
            return;
        }
        let h = *self.plan.pick(&candidates);
        if !self.router_down && self.plan.chance(0.01) {
            self.apply(Fault::RouterDown);
            let d = self.plan.ms(2000, 10000);
            self.after(d, Ev::Recover(Fault::RouterUp));
            return;
        }
        let (fault, recovery, lo, hi) = match self.plan.below(14) {
            0 => (Fault::Crash(h), Fault::Boot(h), 1000, 8000),
            1 => (Fault::Freeze(h), Fault::Thaw(h), 200, 9000),
            2 => (Fault::Kill(h), Fault::Start(h), 500, 10000),
            3 => (Fault::KillCleanup(h), Fault::Start(h), 500, 5000),
            4 | 5 => (Fault::Term(h), Fault::Start(h), 1000, 5000),
            6 => (Fault::PortDown(h), Fault::PortUp(h), 300, 6000),
            7 => (Fault::Partition(h), Fault::Heal(h), 500, 8000),
            8 => (Fault::Flaky(h), Fault::Steady(h), 1000, 5000),
            12 if !self.hosts[h].drained => (Fault::Drain(h), Fault::Undrain(h), 1000, 8000),
            13 => (Fault::GatewayLost(h), Fault::GatewayBack(h), 1000, 8000),
            9 if self.api_up => {
                // An outage, and an agent restarted during it.
                self.apply(Fault::ApiDown);
                // Long enough that an agent which cannot serve, but
                // stands as a candidate, leaves VIPs unowned for far
                // longer than any bound.
                let up = self.plan.ms(4000, 20000);
                self.after(up, Ev::Recover(Fault::ApiUp));
                (Fault::Kill(h), Fault::Start(h), 200, 1500)
            }
            10 => (Fault::Stall(h), Fault::Thaw(h), 50, 200),
            11 => (Fault::ApiCut(h), Fault::ApiMend(h), 1000, 8000),
            _ => (Fault::Term(h), Fault::Start(h), 300, 3000),
        };
        self.apply(fault);
        let d = self.plan.ms(lo, hi);
        self.after(d, Ev::Recover(recovery));
    }

    pub(super) fn apply(&mut self, f: Fault) {
        self.note(format!("fault: {}", self.describe(f)));
        let restart_after_kill = matches!(f, Fault::Start(h) if self.hosts[h].killed);
        self.checker.fault(self.t);
        if !f.planned() || restart_after_kill {
            self.checker.unplanned(self.t);
        }
        match f {
            Fault::Crash(h) => {
                self.stop_agent(h, false);
                let host = &mut self.hosts[h];
                host.powered = false;
                self.relink(h);
                let host = &mut self.hosts[h];
                host.kernel.clear();
                self.reachability(h);
                self.all_owners_rescan();
            }
            Fault::Boot(h) => {
                self.hosts[h].powered = true;
                self.relink(h);
                self.reachability(h);
                let d = self.plan.ms(300, 1000);
                self.after(d, Ev::Recover(Fault::Start(h)));
            }
            Fault::Freeze(h) => {
                if self.hosts[h].agent == Agent::Running {
                    self.hosts[h].agent = Agent::Frozen;
                    self.hosts[h].stopped_at = Some(self.t);
                    self.reachability(h);
                }
            }
            Fault::Stall(h) => {
                if self.hosts[h].agent == Agent::Running {
                    self.hosts[h].agent = Agent::Frozen;
                    self.hosts[h].stalled_since = Some(self.t);
                    self.reachability(h);
                    self.judge(|c, ctx, t| c.stalled(t, ctx));
                }
            }
            Fault::Thaw(h) => {
                if self.hosts[h].agent == Agent::Frozen {
                    self.hosts[h].agent = Agent::Running;
                    if self.hosts[h].stopped_at.is_some() {
                        self.hosts[h].thawed_at = Some(self.t);
                    }
                    self.hosts[h].stopped_at = None;
                    self.hosts[h].stalled_since = None;
                    self.hosts[h].unhindered_since = self.t;
                    self.hosts[h].view_dirty = true;
                    self.reachability(h);
                    let deferred = std::mem::take(&mut self.hosts[h].deferred);
                    for ev in deferred {
                        self.schedule(self.t, ev);
                    }
                    let generation = self.hosts[h].generation;
                    self.schedule(
                        self.t,
                        Ev::Input {
                            host: h,
                            generation,
                            input: Box::new(Input::Tick),
                        },
                    );
                    if self.api_up {
                        self.schedule(
                            self.t,
                            Ev::Api {
                                host: h,
                                generation,
                            },
                        );
                    }
                }
            }
            Fault::Kill(h) => {
                self.stop_agent(h, false);
                self.hosts[h].killed = true;
            }
            Fault::KillCleanup(h) => {
                self.stop_agent(h, false);
                self.hosts[h].killed = true;
                // systemd starts `cleanup`: it tells the peers this node
                // left (a leaving beat to each, then gossip), waits for
                // another node to answer for each VIP, and removes it.
                // Mostly at once; now and then after the owner's
                // followers found it silent and its host still answering.
                let start = if self.plan.chance(0.8) {
                    self.plan.ms(5, 80)
                } else {
                    self.plan.ms(80, 400)
                };
                self.hosts[h].cleanup_since = Some(self.t + start);
                // It names the run it cleans up after from the file that run
                // wrote, unless the write failed.
                let generation = self.rng.chance(0.9).then_some(self.hosts[h].generation);
                self.leaving_beats(h, generation, start);
                for j in 0..self.hosts.len() {
                    if j != h && self.gossips(j) && self.gossip_wire(h) {
                        let d = start + self.rng.ms(LEAVE_MS.0, LEAVE_MS.1);
                        self.after(
                            d,
                            Ev::Left {
                                observer: j,
                                subject: h,
                            },
                        );
                    }
                }
                let until = self.t + start + crate::agent::core::HANDOVER_MAX;
                self.after(start, Ev::CleanupWait { host: h, until });
            }
            Fault::Term(h) => {
                if self.hosts[h].agent == Agent::Running {
                    let t = self.t;
                    self.hosts[h].termed_at.get_or_insert(t);
                    self.step(h, Input::Leave);
                }
            }
            Fault::Start(h) => {
                if self.hosts[h].agent == Agent::Stopped && self.hosts[h].cleanup_since.is_some() {
                    // systemd starts the unit again only once its
                    // ExecStopPost, `cleanup`, has exited.
                    self.after(Duration::from_millis(100), Ev::Recover(Fault::Start(h)));
                } else if self.hosts[h].agent == Agent::Stopped {
                    self.start_agent(h);
                } else if self.hosts[h].agent == Agent::Running
                    && self.hosts[h].core.as_ref().is_some_and(|c| c.is_leaving())
                {
                    // Still handing over: start once it has exited.
                    self.after(Duration::from_millis(500), Ev::Recover(Fault::Start(h)));
                }
            }
            Fault::PortDown(h) | Fault::PortUp(h) => {
                self.hosts[h].port_up = matches!(f, Fault::PortUp(_));
                self.relink(h);
                self.reachability(h);
                self.all_owners_changed(h);
                let generation = self.hosts[h].generation;
                let d = self.rng.ms(0, 5);
                self.after(
                    d,
                    Ev::LinksRead {
                        host: h,
                        generation,
                    },
                );
            }
            Fault::Partition(h) | Fault::Heal(h) => {
                self.hosts[h].blocked = matches!(f, Fault::Partition(_));
                self.reachability(h);
            }
            Fault::Drain(h) | Fault::Undrain(h) => {
                self.hosts[h].drained = matches!(f, Fault::Drain(_));
                // The agent's watch of its own record brings it.
                self.watch_brings(h);
            }
            Fault::GatewayLost(h) | Fault::GatewayBack(h) => {
                self.hosts[h].gateway_lost = matches!(f, Fault::GatewayLost(_));
                // Found at the agent's next round (whole seconds apart).
                let d = self.rng.ms(0, 1000);
                self.gateway_round(h, d);
            }
            Fault::RouterDown | Fault::RouterUp => {
                self.router_down = matches!(f, Fault::RouterDown);
                // Every agent's round falls on the same whole second: they
                // find it within a few milliseconds of each other.
                let d = self.rng.ms(0, 1000);
                for h in 0..self.hosts.len() {
                    let jitter = self.rng.ms(0, 5);
                    self.gateway_round(h, d + jitter);
                }
            }
            Fault::ApiCut(h) | Fault::ApiMend(h) => {
                self.hosts[h].api_cut = matches!(f, Fault::ApiCut(_));
                if !self.hosts[h].api_cut {
                    self.hosts[h].unhindered_since = self.t;
                    // The watches list again: the latest of everything.
                    self.watch_brings(h);
                }
            }
            Fault::ApiDown => self.api_up = false,
            Fault::ApiUp => {
                self.api_up = true;
                for h in &mut self.hosts {
                    h.unhindered_since = self.t;
                }
                self.truth_changed();
            }
            Fault::Flaky(h) | Fault::Steady(h) => {
                self.hosts[h].flaky = matches!(f, Fault::Flaky(_));
                if !self.hosts[h].flaky {
                    self.hosts[h].unhindered_since = self.t;
                }
            }
        }
    }

    pub(super) fn all_owners_rescan(&mut self) {
        let ips: Vec<IpAddr> = self.checker.known_ips();
        for ip in ips {
            self.owners_changed(ip);
        }
    }

    /// `host`'s leaving beat (its agent's on SIGTERM, or `cleanup`'s,
    /// which may know no generation), sent `after` from now to every host its
    /// wire reaches.
    pub(super) fn leaving_beats(&mut self, host: usize, generation: Option<u64>, after: Duration) {
        if !self.gossip_wire(host) {
            return;
        }
        // Counted as arriving at the step that delivers it (`step`).
        let beat = Beat {
            at: self.now(),
            node: self.hosts[host].name.clone(),
            generation,
            lapse: None,
            leaving: true,
            watching: false,
            silent: None,
        };
        for j in 0..self.hosts.len() {
            if j != host && self.gossip_wire(j) {
                let d = after + self.rng.ms(0, 3);
                let generation = self.hosts[j].generation;
                self.after(
                    d,
                    Ev::Input {
                        host: j,
                        generation,
                        input: Box::new(Input::Beats(vec![beat.clone()])),
                    },
                );
            }
        }
    }

    /// `cleanup` removes each VIP of the host once another node answers
    /// for it (it sees the claims on the wire), and the rest at `until`.
    pub(super) fn cleanup_wait(&mut self, host: usize, until: Duration) {
        if self.hosts[host].agent != Agent::Stopped {
            return;
        }
        let n = self.hosts.len();
        let answered = |w: &World, ip: IpAddr| (0..n).any(|j| j != host && w.answers(j, ip));
        let eth0 = self.lan_addresses(host);
        let taken: Vec<IpAddr> = eth0
            .iter()
            .copied()
            .filter(|ip| answered(self, *ip))
            .collect();
        let done = self.t >= until || taken.len() == eth0.len();
        let h = &mut self.hosts[host];
        let gone: Vec<IpAddr> = if done {
            h.cleanup_since = None;
            std::mem::take(&mut h.kernel)
                .into_keys()
                .map(|(_, ip)| ip)
                .collect()
        } else {
            h.kernel
                .retain(|(i, ip), _| !(*i == ETH0 && taken.contains(ip)));
            taken
        };
        if !done {
            self.after(Duration::from_millis(5), Ev::CleanupWait { host, until });
        }
        if !gone.is_empty() {
            self.checker.stats.kernel_changes += gone.len() as u64;
            self.note(format!(
                "{}: cleanup removed {gone:?}",
                self.hosts[host].name
            ));
            for ip in gone {
                self.owners_changed(ip);
            }
        }
    }

    /// Faults are over: everything heals now; the rest of the run settles.
    pub(super) fn end_faults(&mut self) {
        self.faulting = false;
        self.note("faults over: every host heals".into());
        for h in 0..self.hosts.len() {
            if !self.hosts[h].powered {
                self.apply(Fault::Boot(h));
            }
            if self.hosts[h].agent == Agent::Frozen {
                self.apply(Fault::Thaw(h));
            }
            if !self.hosts[h].port_up {
                self.apply(Fault::PortUp(h));
            }
            if self.hosts[h].blocked {
                self.apply(Fault::Heal(h));
            }
            if self.hosts[h].flaky {
                self.apply(Fault::Steady(h));
            }
            if self.hosts[h].api_cut {
                self.apply(Fault::ApiMend(h));
            }
            if self.hosts[h].drained {
                self.apply(Fault::Undrain(h));
            }
            if self.hosts[h].gateway_lost {
                self.apply(Fault::GatewayBack(h));
            }
            if self.hosts[h].agent == Agent::Stopped && self.hosts[h].powered {
                self.apply(Fault::Start(h));
            }
        }
        if !self.api_up {
            self.apply(Fault::ApiUp);
        }
        if self.router_down {
            self.apply(Fault::RouterUp);
        }
    }

    pub(super) fn describe(&self, f: Fault) -> String {
        let name = |h: usize| self.hosts[h].name.clone();
        match f {
            Fault::Crash(h) => format!("{} loses power", name(h)),
            Fault::Boot(h) => format!("{} boots", name(h)),
            Fault::Freeze(h) => format!("{}'s agent frozen", name(h)),
            Fault::Thaw(h) => format!("{}'s agent thawed", name(h)),
            Fault::Stall(h) => format!("{}'s agent stalls", name(h)),
            Fault::Kill(h) => format!("{}'s agent killed", name(h)),
            Fault::KillCleanup(h) => format!("{}'s agent killed, cleanup runs", name(h)),
            Fault::Term(h) => format!("{}'s agent gets SIGTERM", name(h)),
            Fault::Start(h) => format!("{}'s agent started", name(h)),
            Fault::PortDown(h) => format!("{}'s switch port down", name(h)),
            Fault::PortUp(h) => format!("{}'s switch port up", name(h)),
            Fault::Partition(h) => format!("gossip to and from {} dropped", name(h)),
            Fault::Heal(h) => format!("gossip to and from {} flows again", name(h)),
            Fault::ApiCut(h) => format!("{}'s path to the API server cut", name(h)),
            Fault::ApiMend(h) => format!("{}'s path to the API server mended", name(h)),
            Fault::ApiDown => "API server down".into(),
            Fault::ApiUp => "API server back".into(),
            Fault::Flaky(h) => format!("{}'s kernel refuses operations", name(h)),
            Fault::Steady(h) => format!("{}'s kernel steady again", name(h)),
            Fault::Drain(h) => format!("{} drained", name(h)),
            Fault::Undrain(h) => format!("{} undrained", name(h)),
            Fault::GatewayLost(h) => format!("{}'s gateways stop answering it", name(h)),
            Fault::GatewayBack(h) => format!("{}'s gateways answer it again", name(h)),
            Fault::RouterDown => "the router answers nobody".into(),
            Fault::RouterUp => "the router answers again".into(),
        }
    }
}
