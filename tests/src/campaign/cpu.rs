//! An agent that spins: CPU time sampled every second, judged over a
//! sliding window. A loop that wakes itself forever (a want re-armed as it
//! is refused) breaks no promise on the wire, and so hides from the other
//! properties while it burns a core and floods the log; this one sees it.

use std::collections::{BTreeMap, VecDeque};
use std::time::{Duration, Instant};

/// The window a share of CPU is taken over.
pub const WINDOW: Duration = Duration::from_secs(10);

/// The most of a core an agent of the bed may use over [`WINDOW`]. At rest
/// an agent uses about 1% (docs/agent.md, "Cost at rest"); a start, a
/// relist after an outage or a drain of the bed's handful of VIPs is a
/// burst of well under a second. A loop that spins takes a whole core when
/// it can, and at least a third of one on the bed's two loaded cores.
pub const SPIN_BOUND: f64 = 0.25;

/// One node's samples, of one process.
#[derive(Default)]
struct Samples {
    pid: u32,
    at: VecDeque<(Instant, Duration)>,
}

/// Each node's share of a core over the last [`WINDOW`].
#[derive(Default)]
pub struct Cpu {
    nodes: BTreeMap<String, Samples>,
    /// The highest share seen per node, and when its window ended.
    pub worst: BTreeMap<String, (f64, Instant)>,
    /// Windows past the bound not yet reported: one per episode (a node
    /// over the bound for a minute is one), with its share.
    pending: Vec<(String, Instant, f64)>,
    over: BTreeMap<String, bool>,
}

impl Cpu {
    /// `used` is the process's CPU time so far. A new `pid` (a restart)
    /// starts its node's samples afresh.
    pub fn sample(&mut self, node: &str, pid: u32, used: Duration, now: Instant) {
        let s = self.nodes.entry(node.to_string()).or_default();
        if s.pid != pid {
            s.pid = pid;
            s.at.clear();
        }
        s.at.push_back((now, used));
        while s
            .at
            .front()
            .is_some_and(|(t, _)| now.saturating_duration_since(*t) > WINDOW)
        {
            s.at.pop_front();
        }
        let Some(&(t0, used0)) = s.at.front() else {
            return;
        };
        // A share is judged over a whole window only: a process's first
        // seconds are its start.
        let span = now.saturating_duration_since(t0);
        if span + Duration::from_millis(1500) < WINDOW {
            return;
        }
        let share = used.saturating_sub(used0).as_secs_f64() / span.as_secs_f64();
        let w = self.worst.entry(node.to_string()).or_insert((0.0, now));
        if share > w.0 {
            *w = (share, now);
        }
        let over = self.over.entry(node.to_string()).or_default();
        if share > SPIN_BOUND && !*over {
            self.pending.push((node.to_string(), now, share));
        }
        *over = share > SPIN_BOUND;
    }

    /// The episodes past the bound since the last call.
    pub fn take_spins(&mut self) -> Vec<(String, Instant, f64)> {
        std::mem::take(&mut self.pending)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn run(cpu: &mut Cpu, node: &str, pid: u32, t0: Instant, secs: u64, share: f64) -> Instant {
        let mut used = Duration::ZERO;
        for s in 0..=secs {
            cpu.sample(node, pid, used, t0 + Duration::from_secs(s));
            used += Duration::from_secs_f64(share);
        }
        t0 + Duration::from_secs(secs)
    }

    #[test]
    fn an_agent_at_rest_is_no_spin_and_a_spinning_one_is_one_episode() {
        let mut cpu = Cpu::default();
        let t0 = Instant::now();
        let t = run(&mut cpu, "n1", 10, t0, 60, 0.02);
        assert!(cpu.take_spins().is_empty());
        assert!(cpu.worst["n1"].0 < 0.03);
        // A restart whose first second is busy is not judged on it.
        cpu.sample("n1", 11, Duration::ZERO, t);
        cpu.sample(
            "n1",
            11,
            Duration::from_millis(900),
            t + Duration::from_secs(1),
        );
        assert!(cpu.take_spins().is_empty());
        // A minute of a spinning loop: one episode, at its first window.
        let t = run(&mut cpu, "n2", 20, t, 60, 0.6);
        let spins = cpu.take_spins();
        assert_eq!(spins.len(), 1, "{spins:?}");
        assert!(spins[0].2 > 0.5);
        // Calm again, then a second episode is reported again.
        let t = run(&mut cpu, "n2", 21, t, 30, 0.0);
        assert!(cpu.take_spins().is_empty());
        run(&mut cpu, "n2", 21, t, 30, 0.9);
        assert_eq!(cpu.take_spins().len(), 1);
    }
}
