//! The agents of the simulated hosts: started, stopped, stepped, and what
//! their actions do to the world; gossip views and beats between them; the
//! API server's records and cluster views as watches deliver them.

use super::*;

impl World {
    pub(super) fn links(&self, host: usize) -> Links {
        self.links[host].clone()
    }

    /// A host's power or port changed: its links with it.
    pub(super) fn relink(&mut self, host: usize) {
        self.links[host] = links_of(&self.hosts[host]);
    }

    pub(super) fn start_agent(&mut self, host: usize) {
        let h = &self.hosts[host];
        if !h.powered || h.agent != Agent::Stopped {
            return;
        }
        let settings = Settings {
            node: h.name.clone(),
            ..self.settings.clone()
        };
        let core = Core::new(settings, self.links(host), self.now());
        let adopted = owned_addresses(h);
        // Its first round hears the gateways, unless they are silent now.
        let answered = !(h.gateway_lost || self.router_down);
        let t = self.t;
        let h = &mut self.hosts[host];
        h.published = core.local_state();
        h.pub_version += 1;
        h.started_at = t;
        h.unhindered_since = t;
        h.core = Some(core);
        h.agent = Agent::Running;
        h.killed = false;
        h.stopped_at = None;
        h.stalled_since = None;
        h.termed_at = None;
        h.cleanup_since = None;
        h.drain_heard = None;
        h.gateway_heard = false;
        h.gateway_answered = answered;
        h.generation += 1;
        h.api_version = 0;
        h.api_content = 0;
        h.wake_due = None;
        h.known = vec![None; self.shape.nodes];
        h.beat_plan = BeatPlan::default();
        h.watched.clear();
        h.deferred.clear();
        h.view_dirty = true;
        let generation = h.generation;
        self.hosts[host].published_info = Arc::new(self.member_info(host));
        self.note(format!("{}: agent starts", self.hosts[host].name));
        self.judge_candidacy(host);
        self.reachability(host);
        self.step(host, Input::Adopted(adopted));
        if self.api_up {
            let d = self.rng.ms(50, 300);
            self.after(d, Ev::Api { host, generation });
        }
        self.records_changed(host);
    }

    /// Whether the API server answers `host`'s watches now.
    pub(super) fn api_reaches(&self, host: usize) -> bool {
        self.api_up && !self.hosts[host].api_cut
    }

    /// `host`'s record changed (its agent started, or stopped and said
    /// so): the other agents' watches deliver the records again.
    pub(super) fn records_changed(&mut self, host: usize) {
        if !self.api_up {
            return;
        }
        for j in 0..self.hosts.len() {
            if j != host {
                self.watch_brings(j);
            }
        }
    }

    /// The agent is gone (killed, exited, host off): peers find out by
    /// detection, or at once after a graceful leave.
    pub(super) fn stop_agent(&mut self, host: usize, graceful: bool) {
        if self.hosts[host].agent == Agent::Stopped {
            return;
        }
        if graceful {
            for j in 0..self.hosts.len() {
                if j != host && self.reach[host][j] {
                    let d = self.rng.ms(LEAVE_MS.0, LEAVE_MS.1);
                    self.after(
                        d,
                        Ev::Left {
                            observer: j,
                            subject: host,
                        },
                    );
                }
            }
        }
        let t = self.t;
        let h = &mut self.hosts[host];
        h.agent = Agent::Stopped;
        h.stopped_at = Some(t);
        h.stalled_since = None;
        h.core = None;
        h.wake_due = None;
        h.watched.clear();
        h.deferred.clear();
        // Batches not yet begun die with the process; the one under way
        // still lands, unless a new run began (see `kernel_done`).
        h.kernel_queue = None;
        h.kernel_in_flight = false;
        self.reachability(host);
        if graceful {
            self.records_changed(host);
        }
    }

    pub(super) fn step(&mut self, host: usize, input: Input) {
        if !matches!(input, Input::Beats(_))
            && self.hosts[host]
                .beats_at
                .is_none_or(|at| self.t >= at + BEATS_EVERY)
            && self.deliver_beats(host, None)
            && matches!(input, Input::Tick)
        {
            // The beats' step was this moment's step: a tick after it, at
            // the same instant, finds nothing more to do (the shell, too,
            // steps once for all that woke it).
            return;
        }
        let now = self.now();
        let span = self.trace.all.then(|| {
            tracing::info_span!("sim", t = format!("{:.3}", self.t.as_secs_f64()), node = %self.hosts[host].name)
                .entered()
        });
        let Some(core) = self.hosts[host].core.as_mut() else {
            return;
        };
        // Beats arrive at the step that delivers them.
        let cost = self
            .costs
            .as_mut()
            .map(|c| c.steps.entry(input.kind()).or_default());
        let actions = costs::timed(cost, || core.step(now, input.arriving(now)));
        drop(span);
        self.carry_out(host, actions);
    }

    pub(super) fn carry_out(&mut self, host: usize, a: Actions) {
        let generation = self.hosts[host].generation;
        if let Some(plan) = a.beat {
            let told_before: Vec<SocketAddr> = self.hosts[host]
                .beat_plan
                .relays
                .iter()
                .flat_map(|r| r.to.iter().copied())
                .collect();
            let newly_told: Vec<usize> = plan
                .relays
                .iter()
                .flat_map(|r| r.to.iter())
                .filter(|addr| !told_before.contains(addr))
                .filter_map(|addr| self.hosts.iter().position(|h| h.gossip_addr == *addr))
                .collect();
            self.hosts[host].beat_plan = plan;
            for to in newly_told {
                let generation = self.hosts[to].generation;
                self.after(
                    RELAY_WIRE,
                    Ev::Relayed {
                        host: to,
                        generation,
                    },
                );
            }
        }
        if !a.add.is_empty() || !a.remove.is_empty() || a.read_kernel {
            self.log(|| {
                format!(
                    "{host}: kernel batch +{:?} -{:?}",
                    ips(&a.add),
                    ips(&a.remove)
                )
            });
            let h = &mut self.hosts[host];
            let q = h.kernel_queue.get_or_insert_with(KernelJob::default);
            q.add.extend(a.add);
            q.remove.extend(a.remove);
            q.read |= a.read_kernel;
            if !h.kernel_in_flight {
                self.kernel_start(host);
            }
        }
        let on_wire = self.hosts[host].powered && self.hosts[host].port_up;
        if a.leave {
            let generation = Some(self.hosts[host].generation);
            self.leaving_beats(host, generation, Duration::ZERO);
        }
        if on_wire {
            // The frames one step sends leave back to back, and the
            // answers to its questions come straight from the kernels that
            // hold the addresses, each frame lost on its own. How the
            // receiving shell reads them depends on its scheduling
            // (`deliver_claims`).
            if !a.garp.is_empty() {
                let mac = self.hosts[host].mac;
                for j in 0..self.hosts.len() {
                    if j == host || !self.hosts[j].powered || !self.hosts[j].port_up {
                        continue;
                    }
                    let claims: Vec<Claim> = a
                        .garp
                        .iter()
                        .filter(|_| !self.rng.chance(self.shape.loss))
                        .map(|t| Claim { ip: t.ip, mac })
                        .collect();
                    let g = self.hosts[j].generation;
                    self.deliver_claims(j, g, claims);
                }
            }
            let mut answers: Vec<(usize, Vec<Claim>)> = Vec::new();
            for t in &a.probe {
                for j in 0..self.hosts.len() {
                    if j != host && self.answers(j, t.ip) {
                        // The question or its answer lost on the way.
                        let lost =
                            self.rng.chance(self.shape.loss) || self.rng.chance(self.shape.loss);
                        let e = self.exchanges.entry((host, t.ip)).or_default();
                        if lost {
                            e.lost = Some(self.t);
                            continue;
                        }
                        e.heard = Some(self.t);
                        let claim = Claim {
                            ip: t.ip,
                            mac: self.hosts[j].mac,
                        };
                        match answers.iter_mut().find(|(k, _)| *k == j) {
                            Some((_, claims)) => claims.push(claim),
                            None => answers.push((j, vec![claim])),
                        }
                    }
                }
            }
            for (_, claims) in answers {
                self.deliver_claims(host, generation, claims);
            }
        }
        if let Some(watched) = a.watch {
            self.hosts[host].watched = watched.into_keys().collect();
        }
        if let Some(local) = a.publish {
            self.publish(host, local);
        }
        // The shell writes the annotations on the Services: writes every
        // agent's watches see, which move the revision and not what the
        // election reads. Each view here has the revision the API server
        // had when it was delivered; a real shell also builds a view for
        // each such write, so here revisions that differ for them alone
        // stay apart longer, until the next change of the cluster.
        if a.announcing.is_some() && self.api_reaches(host) {
            self.truth.annotated();
        }
        if a.ready {
            self.log(|| format!("{host}: ready"));
        }
        // As the shell does: it sleeps until the core's latest word, later
        // or earlier than the one before (a wake-up that was pushed back
        // does not come).
        let at = a.wake.map(|at| at.saturating_duration_since(self.base));
        let h = &mut self.hosts[host];
        if at != h.wake_due {
            h.wake_due = at;
            if let Some(at) = at {
                self.schedule(
                    at,
                    Ev::Wake {
                        host,
                        generation,
                        at,
                    },
                );
            }
        }
        if a.exit {
            self.note(format!("{}: agent exits", self.hosts[host].name));
            self.stop_agent(host, true);
        }
    }

    /// Frames one step sent to `to`, each already past loss. Half the
    /// time they are one burst that the shell reads in one step, after one
    /// wire delay (they queued while it was busy); otherwise one input
    /// each, with delays of their own, as a shell that keeps up reads
    /// them. A real host does both, and each has found faults the other
    /// missed.
    fn deliver_claims(&mut self, to: usize, generation: u64, claims: Vec<Claim>) {
        if claims.is_empty() {
            return;
        }
        let burst = claims.len() > 1 && self.rng.chance(0.5);
        let inputs: Vec<Vec<Claim>> = if burst {
            vec![claims]
        } else {
            claims.into_iter().map(|c| vec![c]).collect()
        };
        for claims in inputs {
            let d = self.rng.ms(WIRE_MS.0, WIRE_MS.1);
            self.after(
                d,
                Ev::Input {
                    host: to,
                    generation,
                    input: Box::new(Input::Claims(claims)),
                },
            );
        }
    }

    pub(super) fn publish(&mut self, host: usize, local: LocalState) {
        let leaving = local.status == Status::Leaving;
        let name = self.hosts[host].name.clone();
        self.log(|| {
            format!(
                "{name}: publishes {:?} revision {} vips {:?}",
                local.status, local.revision, local.vips
            )
        });
        let h = &mut self.hosts[host];
        let was = std::mem::replace(&mut h.published, local).status;
        h.pub_version += 1;
        let info = Arc::new(self.member_info(host));
        let h = &mut self.hosts[host];
        h.published_info = info.clone();
        let (generation, version) = (h.generation, h.pub_version);
        if was != Status::Alive {
            self.judge_candidacy(host);
        }
        for j in 0..self.hosts.len() {
            if j == host || !self.reach[host][j] {
                continue;
            }
            let mut d = if leaving {
                self.rng.ms(LEAVE_MS.0, LEAVE_MS.1)
            } else {
                self.rng.ms(SPREAD_MS.0, SPREAD_MS.1)
            };
            while self.rng.chance(self.shape.loss) {
                d += GOSSIP_INTERVAL;
            }
            self.after(
                d,
                Ev::Gossip {
                    to: j,
                    from: host,
                    generation,
                    version,
                    info: info.clone(),
                },
            );
        }
    }

    /// A node that becomes `alive` stands in its peers' elections: it must
    /// have reconciled, with a complete view of the cluster, and have heard
    /// its peers or waited the start's grace for them.
    pub(super) fn judge_candidacy(&mut self, host: usize) {
        let h = &self.hosts[host];
        if h.published.status != Status::Alive {
            return;
        }
        let heard_peers = h.known.iter().flatten().any(|k| k.up)
            || self.t >= h.started_at + crate::agent::core::STARTUP_GRACE;
        let why = if h.api_version == 0 {
            "without a view of the cluster"
        } else if !heard_peers {
            "before it heard its peers or waited the start's grace"
        } else {
            return;
        };
        let what = format!(
            "{} published itself a candidate ({}) {why}: its peers elect a node that cannot serve",
            h.name,
            Status::Alive.as_str()
        );
        let t = self.t;
        self.checker.unfit_candidate(t, what);
    }

    /// Beats are modelled as flowing without a gap while a sender's agent
    /// runs and gossip reaches the receiver: an agent is handed the beats
    /// of its senders before it steps (at most every [`BEATS_EVERY`]), and
    /// the last ones when the path breaks (`only`: that sender). Loss is
    /// not modelled: five beats lost in a row are about one in three
    /// million at 5% loss; a silent live owner comes from a frozen agent.
    /// True when the agent stepped.
    pub(super) fn deliver_beats(&mut self, host: usize, only: Option<usize>) -> bool {
        if self.hosts[host].agent != Agent::Running || self.hosts[host].core.is_none() {
            return false;
        }
        let now = self.now();
        let addr = self.hosts[host].gossip_addr;
        let mut beats = Vec::new();
        for j in 0..self.hosts.len() {
            if j == host || only.is_some_and(|o| o != j) {
                continue;
            }
            if only.is_none() && !self.reach[j][host] {
                continue;
            }
            let plan = &self.hosts[j].beat_plan;
            let to_me = plan.dense.contains(&addr) || plan.sparse.contains(&addr);
            if !to_me && !plan.relays.iter().any(|r| r.to.contains(&addr)) {
                continue;
            }
            let lapse = |l: Option<Lapse>| {
                l.map(|l| {
                    (
                        l.first.saturating_duration_since(now),
                        l.last.saturating_duration_since(now),
                    )
                })
            };
            // A leaving run's every beat says so, as the shell's do; so do
            // the last ones of a run that exited after SIGTERM, which the
            // path's break hands over once its core is gone (an older
            // beat that came late would be refused as played back).
            let leaving = match &self.hosts[j].core {
                Some(c) => c.is_leaving(),
                None => self.hosts[j].termed_at.is_some(),
            };
            let beat = Beat {
                at: now,
                node: self.hosts[j].name.clone(),
                generation: Some(self.hosts[j].generation),
                lapse: lapse(plan.lapse),
                leaving,
                watching: plan.sparse.contains(&addr),
                silent: None,
            };
            for r in plan.relays.iter().filter(|r| r.to.contains(&addr)) {
                beats.push(Beat {
                    silent: Some(Silent {
                        node: r.node.clone(),
                        generation: Some(r.generation),
                        lapse: lapse(r.lapse),
                    }),
                    ..beat.clone()
                });
            }
            if to_me {
                beats.push(beat);
            }
        }
        if only.is_none() {
            self.hosts[host].beats_at = Some(self.t);
        }
        if beats.is_empty() {
            return false;
        }
        self.step(host, Input::Beats(beats));
        true
    }

    /// Membership views to the agents whose knowledge changed.
    pub(super) fn deliver_views(&mut self) {
        for host in 0..self.hosts.len() {
            let h = &self.hosts[host];
            if !h.view_dirty || h.agent != Agent::Running {
                continue;
            }
            self.hosts[host].view_dirty = false;
            let mut costs = self.costs.take();
            let view = costs::timed(costs.as_mut().map(|c| &mut c.views), || self.view_of(host));
            self.costs = costs;
            self.step(host, Input::Members(view));
        }
    }

    /// What `host` publishes now, in its current run, as its peers'
    /// views list it.
    fn member_info(&self, host: usize) -> MemberInfo {
        let h = &self.hosts[host];
        let state = &h.published;
        MemberInfo {
            node: h.name.clone(),
            generation: h.generation,
            gossip_addr: h.gossip_addr,
            agent_version: String::new(),
            protocol: crate::model::PROTOCOL,
            status: state.status,
            virtual_mode: state.virtual_mode,
            on_link: state.on_link.clone(),
            vips: state.vips.clone(),
            macs: state.macs.clone(),
            revision: state.revision,
            digest: state.digest,
            drained: state.drained,
            behind: state.behind.clone(),
        }
    }

    /// The membership view `host`'s gossip gives its agent: every node's
    /// record shared with the others' views, not copied.
    pub(super) fn view_of(&self, host: usize) -> MembershipView {
        let h = &self.hosts[host];
        let local = &h.published_info;
        let mut nodes = Vec::with_capacity(self.hosts.len());
        let mut live = 0u64;
        for (j, k) in h.known.iter().enumerate() {
            if j == host {
                nodes.push(local.clone());
                live |= 1 << j;
            } else if let Some(k) = k
                && k.up
            {
                nodes.push(k.info.clone());
                live |= 1 << j;
            }
        }
        // Listed by name, as gossip lists them: hosts are named in their
        // order, so the sort finds them in place (one comparison each).
        nodes.sort_by(|a, b| a.node.cmp(&b.node));
        // Nodes not live here, as last heard of here or through a live peer
        // (gossip carries every node's state, not only live ones').
        let gone: Vec<Arc<MemberInfo>> = (0..self.hosts.len())
            .filter(|&j| live & 1 << j == 0)
            .filter_map(|j| {
                let known = h.known[j].as_ref().or_else(|| {
                    (0..self.hosts.len())
                        .filter(|&k| h.known[k].as_ref().is_some_and(|x| x.up))
                        .filter_map(|k| self.hosts[k].known[j].as_ref())
                        .max_by_key(|x| (x.generation, x.version))
                })?;
                Some(known.info.clone())
            })
            .collect();
        let members: Vec<Member> = nodes
            .iter()
            .filter(|n| n.status == Status::Alive)
            .map(|n| n.to_member())
            .collect();
        MembershipView {
            local: (**local).clone(),
            members,
            nodes,
            unconfirmed: 0,
            gone,
        }
    }

    /// Whether gossip flows between two hosts.
    pub(super) fn gossips(&self, host: usize) -> bool {
        self.gossip_wire(host) && self.hosts[host].agent == Agent::Running
    }

    /// Whether `host`'s gossip port carries frames, whatever its agent
    /// does: the LAN port, or the second port of a host that has one.
    pub(super) fn gossip_wire(&self, host: usize) -> bool {
        let h = &self.hosts[host];
        h.powered && (h.port_up || h.second_port) && !h.blocked
    }

    /// Re-evaluates the pairs of `host` after its state changed.
    pub(super) fn reachability(&mut self, host: usize) {
        for j in 0..self.hosts.len() {
            if j == host {
                continue;
            }
            let now = self.gossips(host) && self.gossips(j);
            if now == self.reach[host][j] {
                continue;
            }
            if !now {
                // The last beats before the path broke.
                self.deliver_beats(j, Some(host));
                self.deliver_beats(host, Some(j));
            }
            self.reach[host][j] = now;
            self.reach[j][host] = now;
            for (observer, subject) in [(host, j), (j, host)] {
                self.epoch[observer][subject] += 1;
                let epoch = self.epoch[observer][subject];
                let ev = if now {
                    let d = self.rng.ms(REJOIN_MS.0, REJOIN_MS.1);
                    (
                        d,
                        Ev::Rejoin {
                            observer,
                            subject,
                            epoch,
                        },
                    )
                } else {
                    let d = self.rng.ms(DETECT_MS.0, DETECT_MS.1);
                    (
                        d,
                        Ev::Suspect {
                            observer,
                            subject,
                            epoch,
                        },
                    )
                };
                self.after(ev.0, ev.1);
            }
        }
    }

    /// Every agent's record in the API, as a watch delivers them: each
    /// host's MAC, fresh unless its agent stopped gracefully (a killed or
    /// crashed agent's record goes stale only after minutes).
    pub(super) fn deliver_records(&mut self, host: usize) {
        if !self.api_reaches(host) {
            return;
        }
        let mut records: Vec<AgentRecord> = self
            .hosts
            .iter()
            .map(|h| AgentRecord {
                node: h.name.to_string(),
                macs: [h.mac].into(),
                fresh: h.agent != Agent::Stopped || h.killed || !h.powered,
            })
            .collect();
        if let Some(f) = self.forgery.as_mut()
            && self.t >= f.from
        {
            let (forger, victim) = (f.forger, f.victim);
            if !std::mem::replace(&mut f.noted, true) {
                let line = format!(
                    "forgery: {} claims {}'s MAC in its record, and so does a record named intruder",
                    self.hosts[forger].name, self.hosts[victim].name
                );
                self.note(line);
            }
            let stolen = self.hosts[victim].mac;
            records[forger].macs.extend([stolen, super::FORGED_MAC]);
            records.push(AgentRecord {
                node: "intruder".into(),
                macs: [stolen].into(),
                fresh: true,
            });
        }
        self.step(host, Input::Records(records));
    }

    pub(super) fn deliver_cluster(&mut self, host: usize) {
        if !self.api_reaches(host) {
            return;
        }
        // The record's watch, before the first view, as the shell does; a
        // drain the agent has not heard of yet.
        let drained = self.hosts[host].drained;
        if self.hosts[host].drain_heard.unwrap_or(false) != drained {
            self.hosts[host].drain_heard = Some(drained);
            self.step(host, Input::Drain(drained));
        }
        if self.hosts[host].api_content == self.truth.content {
            return;
        }
        let partial = self.hosts[host].api_content + 1 == self.truth.content;
        let revision = self.truth.version;
        let input = match (&self.truth.endpoints_only, partial) {
            (Some(keys), true) => Input::Endpoints {
                changes: keys
                    .iter()
                    .filter_map(|k| {
                        let s = self.truth.cluster.services.iter().find(|s| s.key == *k)?;
                        Some((k.clone(), s.endpoints.clone()))
                    })
                    .collect(),
                revision,
                digest: Some(self.truth.content),
            },
            _ => Input::Cluster {
                cluster: self.truth.cluster.clone(),
                errors: Vec::new(),
                revision,
                digest: Some(self.truth.content),
            },
        };
        self.hosts[host].api_version = self.truth.version;
        self.hosts[host].api_content = self.truth.content;
        let name = self.hosts[host].name.clone();
        let version = self.truth.version;
        self.log(|| format!("{name}: cluster version {version}"));
        self.step(host, input);
    }

    /// The API server has a new version: every watching agent gets it.
    pub(super) fn truth_changed(&mut self) {
        if !self.api_up {
            return;
        }
        for host in 0..self.hosts.len() {
            self.watch_brings(host);
        }
    }

    /// A change on the API server reaches `host`'s agent (unless stopped)
    /// through its watches, a watch's delay later.
    pub(super) fn watch_brings(&mut self, host: usize) {
        if self.hosts[host].agent == Agent::Stopped {
            return;
        }
        let d = self.rng.ms(WATCH_MS.0, WATCH_MS.1);
        let generation = self.hosts[host].generation;
        self.after(d, Ev::Api { host, generation });
    }

    /// The agent's round of gateway checks: its gateways answer, or they
    /// answered once in this run and no longer do, and its core is told
    /// of a change. A gateway silent since the agent started is not lost.
    pub(super) fn gateway_found(&mut self, host: usize) {
        if self.hosts[host].agent != Agent::Running {
            return;
        }
        let silent = self.hosts[host].gateway_lost || self.router_down;
        let h = &mut self.hosts[host];
        if !silent {
            h.gateway_answered = true;
        }
        let lost = silent && h.gateway_answered;
        if lost == h.gateway_heard {
            return;
        }
        h.gateway_heard = lost;
        h.gateway_changed_at = Some(self.t);
        let set: crate::model::UpstreamLost = if lost {
            [
                ("eth0".to_string(), hostlb_api::Family::V4),
                ("eth0".to_string(), hostlb_api::Family::V6),
            ]
            .into()
        } else {
            Default::default()
        };
        self.step(host, Input::Upstream(set));
    }

    /// A round of `host`'s gateway checks, `after` from now.
    pub(super) fn gateway_round(&mut self, host: usize, after: Duration) {
        if self.hosts[host].agent == Agent::Stopped {
            return;
        }
        let generation = self.hosts[host].generation;
        self.after(after, Ev::Gateway { host, generation });
    }
}
