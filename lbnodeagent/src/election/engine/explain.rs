//! The full explanation of a VIP's election, for `status` and `explain`.

use std::net::IpAddr;

use super::super::hash::rank_key;
use super::super::report::{Candidate, Excluded, Reason, VipReport};
use super::{Election, NodeId};

impl Election {
    /// The full answer for one VIP: every node and why it won or lost.
    pub fn explain(&self, ip: IpAddr) -> Option<VipReport> {
        let v = *self.vip_of.get(&ip)?;
        Some(self.report(v))
    }

    /// [`Election::explain`] for every VIP, by address.
    pub fn report_all(&self) -> Vec<VipReport> {
        let mut out: Vec<VipReport> = (0..self.c.vips.len()).map(|v| self.report(v)).collect();
        out.sort_by_key(|r| r.ip);
        out
    }

    pub(super) fn report(&self, v: usize) -> VipReport {
        let vip = &self.c.vips[v];
        let mut nodes: Vec<NodeId> = (0..self.c.slots.len() as NodeId)
            .filter(|&n| self.c.slots[n as usize].node.is_some())
            .collect();
        nodes.sort_by(|a, b| {
            self.c.slots[*a as usize]
                .name
                .cmp(&self.c.slots[*b as usize].name)
        });
        let mut wins = Vec::new();
        let mut virtual_nodes = Vec::new();
        let mut excluded = Vec::new();
        for n in nodes {
            let slot = &self.c.slots[n as usize];
            match self.c.exclusion(v, n) {
                None => wins.push(self.c.win(
                    v,
                    &self.c.classes[vip.class.expect("candidate has a class")],
                    n,
                )),
                Some(_) if self.holds_virtual(v, n) => virtual_nodes.push(slot.name.to_string()),
                Some(reason) if self.goes_virtual(n, Some(reason)) => excluded.push(Excluded {
                    node: slot.name.to_string(),
                    reason: Reason::Drained,
                }),
                Some(reason) => excluded.push(Excluded {
                    node: slot.name.to_string(),
                    reason,
                }),
            }
        }
        // The whole keys, which a `Win` keeps only the start of.
        let mut by_hash: Vec<([u8; 32], NodeId)> = wins
            .iter()
            .map(|w| {
                (
                    rank_key(&self.c.slots[w.node as usize].name, &vip.text),
                    w.node,
                )
            })
            .collect();
        by_hash.sort();
        wins.sort_by(|a, b| self.c.order(a, b));
        let candidates: Vec<Candidate> = wins
            .iter()
            .map(|w| {
                let (place, (hash, _)) = by_hash
                    .iter()
                    .enumerate()
                    .find(|(_, (_, n))| *n == w.node)
                    .expect("present");
                Candidate {
                    node: self.c.slots[w.node as usize].name.to_string(),
                    drained: self.c.drained_at(v, w.node),
                    upstream_lost: self.c.upstream_lost_at(v, w.node),
                    held: w.held,
                    score: w.score,
                    hash_rank: 1 + place,
                    hash: *hash,
                }
            })
            .collect();
        let winner = candidates.first().map(|c| c.node.clone());
        let winner_on = wins
            .first()
            .and_then(|w| self.c.announce_target(v, w.node))
            .cloned();
        debug_assert_eq!(
            winner.as_deref(),
            self.winners[v].map(|w| self.c.slots[w.node as usize].name.as_str()),
            "incremental winner must equal the full computation for {}",
            vip.ip
        );
        VipReport {
            ip: vip.ip,
            services: vip
                .services
                .iter()
                .map(|&s| self.c.services[s].clone())
                .collect(),
            pool: vip.pool.clone(),
            winner,
            winner_on,
            candidates,
            virtual_nodes,
            excluded,
            note: vip.note.clone(),
        }
    }
}
