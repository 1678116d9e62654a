//! Each host's kernel and the LAN: which kernel answers for an address,
//! batches carried out one after another, lifetimes that lapse.

use super::*;

impl World {
    /// Whether `host`'s kernel answers ARP/NS for `ip` on the LAN.
    pub(super) fn answers(&self, host: usize, ip: IpAddr) -> bool {
        let h = &self.hosts[host];
        h.powered && h.port_up && h.kernel.contains_key(&(ETH0, ip))
    }

    /// The kernel worker begins the batch queued, if any: everything the
    /// core asked for since the last began, in one.
    pub(super) fn kernel_start(&mut self, host: usize) {
        let Some(job) = self.hosts[host].kernel_queue.take() else {
            return;
        };
        let n = (job.add.len() + job.remove.len()) as u32;
        let took = self.rng.ms(BATCH_MS.0, BATCH_MS.1) + PER_ADDRESS * n;
        let h = &mut self.hosts[host];
        h.kernel_in_flight = true;
        let generation = h.generation;
        self.after(
            took,
            Ev::Kernel {
                host,
                generation,
                add: job.add,
                remove: job.remove,
                read: job.read,
            },
        );
    }

    pub(super) fn kernel_done(
        &mut self,
        host: usize,
        generation: u64,
        add: Vec<VipAddress>,
        remove: Vec<VipAddress>,
        read: bool,
    ) {
        let h = &mut self.hosts[host];
        if h.generation != generation || !h.powered {
            return;
        }
        if h.agent == Agent::Frozen {
            h.deferred.push(Ev::Kernel {
                host,
                generation,
                add,
                remove,
                read,
            });
            return;
        }
        let mut results = Vec::with_capacity(add.len() + remove.len());
        let mut touched = Vec::new();
        for vip in &add {
            let fail = self.hosts[host].flaky && self.rng.chance(FLAKY_FAILS);
            let result = if fail {
                Err(OpError::Kernel(
                    "the kernel refused (simulated)".to_string(),
                ))
            } else {
                // The kernel counts whole seconds, as the agent asks.
                let expires = vip
                    .lifetime
                    .kernel_seconds()
                    .map(|s| self.t + Duration::from_secs(s.into()));
                let fresh = self.hosts[host]
                    .kernel
                    .insert(
                        (vip.ifindex, vip.ip),
                        Address {
                            prefix_len: vip.prefix_len,
                            expires,
                        },
                    )
                    .is_none();
                if fresh {
                    self.checker.stats.kernel_changes += 1;
                    touched.push(vip.ip);
                }
                if let Some(at) = expires {
                    self.schedule(
                        at,
                        Ev::Expire {
                            host,
                            ifindex: vip.ifindex,
                            ip: vip.ip,
                        },
                    );
                }
                Ok(Applied::Done)
            };
            results.push(OpResult {
                ip: vip.ip,
                kind: OpKind::Add,
                result,
            });
        }
        for vip in &remove {
            if self.hosts[host]
                .kernel
                .remove(&(vip.ifindex, vip.ip))
                .is_some()
            {
                self.checker.stats.kernel_changes += 1;
                touched.push(vip.ip);
            }
            results.push(OpResult {
                ip: vip.ip,
                kind: OpKind::Remove,
                result: Ok(Applied::Done),
            });
        }
        // The worker takes whatever queued meanwhile, in one batch.
        self.hosts[host].kernel_in_flight = false;
        self.kernel_start(host);
        if !touched.is_empty() {
            let name = self.hosts[host].name.clone();
            self.log(|| format!("{name}: kernel now {:?}", touched));
        }
        for ip in touched {
            self.owners_changed(ip);
        }
        if self.hosts[host].agent == Agent::Running && !results.is_empty() {
            self.step(host, Input::Done(results));
        }
        if read && self.hosts[host].agent == Agent::Running {
            let owned = owned_addresses(&self.hosts[host]);
            self.step(host, Input::KernelOwned(owned));
        }
    }

    pub(super) fn expire(&mut self, host: usize, ifindex: u32, ip: IpAddr) {
        let h = &mut self.hosts[host];
        let due = h
            .kernel
            .get(&(ifindex, ip))
            .and_then(|a| a.expires)
            .is_some_and(|e| e <= self.t);
        if !due || !h.powered {
            return;
        }
        let a = h.kernel.remove(&(ifindex, ip)).expect("present");
        self.checker.stats.kernel_changes += 1;
        self.checker.stats.lapsed += 1;
        let name = h.name.clone();
        let dead = h.agent != Agent::Running && h.cleanup_since.is_none();
        self.note(format!("{name}: {ip} lapsed"));
        self.owners_changed(ip);
        if dead && ifindex == ETH0 {
            // Whoever wins it now was told when it would lapse (its last
            // word says now, not a lapse an older renewal pushed back),
            // or not.
            // Judged only when the dead owner is the one trouble: every
            // other agent ready and healthy, and no other fault begun or
            // ended within a detection (a node that is starting, stalled or
            // just cut off may still win the VIP by its peers' elections).
            let mut successor = None;
            let detected = Duration::from_millis(DETECT_MS.1) + RELAY_TTL;
            self.judge(|c, ctx, t| {
                let alone = ctx
                    .hosts
                    .iter()
                    .enumerate()
                    .all(|(i, h)| i == host || (h.agent_running && h.ready && !h.faulty));
                if alone && c.unplanned_since(t) > detected {
                    successor = c.candidate(ip, ctx);
                }
            });
            let now = self.now();
            // It knew when, and knows it wins: with views of the cluster
            // that differ (an API outage), the one that should answer may
            // name another, and the no-owner bound is the one that holds.
            if let Some(s) = successor
                && let Some(core) = self.hosts[s].core.as_ref()
                && core.election().winner(ip) == Some(self.hosts[s].name.as_str())
                && core.lapse_of(&name).is_some_and(|l| {
                    now + crate::agent::core::conflict::LAPSE_EARLY >= l.first
                        && now <= l.last + Duration::from_millis(10)
                })
            {
                let t = self.t;
                self.checker.lapsed(ip, s, t);
            }
        }
        let removed = OwnedAddress {
            interface: if ifindex == ETH0 { "eth0" } else { "kube-lb0" }.into(),
            ifindex,
            ip,
            prefix_len: a.prefix_len,
        };
        let generation = self.hosts[host].generation;
        self.schedule(
            self.t,
            Ev::Input {
                host,
                generation,
                input: Box::new(Input::AddressRemoved(removed)),
            },
        );
    }

    pub(super) fn owners_changed(&mut self, ip: IpAddr) {
        let owners: BTreeSet<usize> = (0..self.hosts.len())
            .filter(|&h| self.answers(h, ip))
            .collect();
        let mut line = None;
        self.judge(|checker, ctx, t| line = checker.owners(ip, owners, t, ctx));
        if let Some(line) = line {
            self.note(line);
        }
    }

    /// The addresses `host`'s kernel holds on its LAN port.
    pub(super) fn lan_addresses(&self, host: usize) -> Vec<IpAddr> {
        self.hosts[host]
            .kernel
            .keys()
            .filter(|(i, _)| *i == ETH0)
            .map(|(_, ip)| *ip)
            .collect()
    }

    pub(super) fn all_owners_changed(&mut self, host: usize) {
        for ip in self.lan_addresses(host) {
            self.owners_changed(ip);
        }
    }
}
