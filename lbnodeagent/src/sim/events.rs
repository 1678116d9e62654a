//! The event loop: each event in time order, handled and followed by
//! the views it made due and the checker's word.

use super::*;

impl World {
    pub(super) fn run_until(&mut self, end: Duration) -> Option<Violation> {
        while let Some((at, ev)) = self.queue.pop() {
            if at > end {
                break;
            }
            self.t = at;
            self.handled += 1;
            self.handle(ev);
            self.deliver_views();
            if let Some(v) = self.checker.just_found() {
                self.note(format!(
                    "VIOLATION: {v} (followed for up to {:?})",
                    check::FOLLOW
                ));
            }
            if let Some(v) = self.checker.take_violation(self.t) {
                self.note(format!("VIOLATION: {v}"));
                return Some(v);
            }
        }
        self.t = end;
        self.final_check();
        self.checker.take_violation(end)
    }

    pub(super) fn handle(&mut self, ev: Ev) {
        match ev {
            Ev::NextFault => {
                if self.faulting {
                    self.next_fault();
                    let next = self.plan.ms(500, 4000);
                    self.after(next, Ev::NextFault);
                }
            }
            Ev::Churn => {
                // Nobody changes objects while the API server is down.
                if self.faulting && !self.api_up {
                    let next = self.plan.ms(300, 3000);
                    self.after(next, Ev::Churn);
                } else if self.faulting {
                    let what = self.truth.churn(&mut self.plan);
                    self.versions.insert(
                        self.truth.content,
                        check::Version {
                            cluster: self.truth.cluster.clone(),
                            made: self.t,
                        },
                    );
                    self.note(format!("change: {what}"));
                    self.truth_changed();
                    let next = self.plan.ms(300, 3000);
                    self.after(next, Ev::Churn);
                }
            }
            Ev::Recover(f) => {
                if self.faulting || matches!(f, Fault::Start(_) | Fault::Boot(_)) {
                    self.apply(f);
                }
            }
            Ev::EndFaults => self.end_faults(),
            Ev::CheckWindow => {
                let changes = self.checker.stats.kernel_changes;
                self.checker.steady_from(changes);
                self.note("steady window: no address may change from now on".into());
            }
            Ev::Sweep => {
                self.sweep();
                self.after(Duration::from_millis(50), Ev::Sweep);
            }
            Ev::Input {
                host,
                generation,
                input,
            } => {
                if self
                    .for_agent(host, generation, || Ev::Input {
                        host,
                        generation,
                        input: input.clone(),
                    })
                    .is_some()
                {
                    // A claim of an address the agent does not listen
                    // for never reaches it (the shell's filter).
                    let input = match *input {
                        Input::Claims(mut cs) => {
                            let watched = &self.hosts[host].watched;
                            cs.retain(|c| watched.contains(&c.ip));
                            if cs.is_empty() {
                                return;
                            }
                            Input::Claims(cs)
                        }
                        other => other,
                    };
                    self.step(host, input);
                }
            }
            Ev::LinksRead { host, generation } => {
                if self
                    .for_agent(host, generation, || Ev::LinksRead { host, generation })
                    .is_some()
                {
                    let links = self.links(host);
                    self.step(host, Input::Links(links));
                }
            }
            Ev::Gateway { host, generation } => {
                if self
                    .for_agent(host, generation, || Ev::Gateway { host, generation })
                    .is_some()
                {
                    self.gateway_found(host);
                }
            }
            Ev::Relayed { host, generation } => {
                if self
                    .for_agent(host, generation, || Ev::Relayed { host, generation })
                    .is_some()
                {
                    self.deliver_beats(host, None);
                }
            }
            Ev::Wake {
                host,
                generation,
                at,
            } => {
                if self.hosts[host].generation != generation
                    || self.hosts[host].wake_due != Some(at)
                {
                    return;
                }
                if self
                    .for_agent(host, generation, || Ev::Wake {
                        host,
                        generation,
                        at,
                    })
                    .is_some()
                {
                    self.hosts[host].wake_due = None;
                    self.step(host, Input::Tick);
                }
            }
            Ev::Kernel {
                host,
                generation,
                add,
                remove,
                read,
            } => self.kernel_done(host, generation, add, remove, read),
            Ev::Expire { host, ifindex, ip } => self.expire(host, ifindex, ip),
            Ev::Gossip {
                to,
                from,
                generation,
                version,
                info,
            } => {
                if !self.reach[to][from] {
                    return;
                }
                if let Some(k) = &mut self.hosts[to].known[from]
                    && (k.generation, k.version) < (generation, version)
                {
                    k.generation = generation;
                    k.version = version;
                    k.info = info;
                    self.hosts[to].view_dirty = true;
                }
            }
            Ev::Suspect {
                observer,
                subject,
                epoch,
            } => {
                if self.epoch[observer][subject] == epoch
                    && !self.reach[observer][subject]
                    && let Some(k) = &mut self.hosts[observer].known[subject]
                    && k.up
                {
                    k.up = false;
                    self.hosts[observer].view_dirty = true;
                }
            }
            Ev::Rejoin {
                observer,
                subject,
                epoch,
            } => {
                if self.epoch[observer][subject] == epoch && self.reach[observer][subject] {
                    let s = &self.hosts[subject];
                    let known = Known {
                        generation: s.generation,
                        version: s.pub_version,
                        info: s.published_info.clone(),
                        up: true,
                    };
                    self.hosts[observer].known[subject] = Some(known);
                    self.hosts[observer].view_dirty = true;
                }
            }
            Ev::Left { observer, subject } => {
                if let Some(k) = &mut self.hosts[observer].known[subject]
                    && k.up
                {
                    k.up = false;
                    self.hosts[observer].view_dirty = true;
                }
            }
            Ev::Api { host, generation } => {
                if self
                    .for_agent(host, generation, || Ev::Api { host, generation })
                    .is_some()
                {
                    self.deliver_records(host);
                    self.deliver_cluster(host);
                }
            }
            Ev::CleanupWait { host, until } => self.cleanup_wait(host, until),
        }
    }

    /// `Some` when the event may go to the host's agent now; a frozen
    /// agent gets it when it thaws (made by `again`), a stopped one never.
    pub(super) fn for_agent(
        &mut self,
        host: usize,
        generation: u64,
        again: impl FnOnce() -> Ev,
    ) -> Option<()> {
        let h = &mut self.hosts[host];
        if h.generation != generation {
            return None;
        }
        match h.agent {
            Agent::Running => Some(()),
            Agent::Frozen => {
                h.deferred.push(again());
                None
            }
            Agent::Stopped => None,
        }
    }
}
