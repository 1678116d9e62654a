//! Where a run's time goes ([`Options::costs`]): the cores' steps by the
//! kind of input, the membership views the world builds for them, the
//! checker, and the rest of the harness. Timed by the clock around each
//! part, so only with the option: reading the clock at every step would
//! cost a run more than some of the parts it measures.
//!
//! [`Options::costs`]: super::Options::costs

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

/// How many times a part ran and how long it took in all.
#[derive(Clone, Copy, Debug, Default)]
pub struct Cost {
    pub count: u64,
    pub time: Duration,
}

impl Cost {
    fn add(&mut self, other: Cost) {
        self.count += other.count;
        self.time += other.time;
    }
}

/// One run's costs, or the sum of many.
#[derive(Clone, Debug, Default)]
pub struct Costs {
    /// The cores' steps, by [`Input::kind`](crate::agent::core::Input::kind).
    pub steps: BTreeMap<&'static str, Cost>,
    /// Membership views built for the cores (not the steps that take
    /// them, which are among `steps` as `members`).
    pub views: Cost,
    /// The checker's judgements: after kernel changes, sweeps, the end.
    pub checker: Cost,
    /// The whole run, set up included.
    pub total: Duration,
}

impl Costs {
    pub fn add(&mut self, other: &Costs) {
        for (kind, c) in &other.steps {
            self.steps.entry(kind).or_default().add(*c);
        }
        self.views.add(other.views);
        self.checker.add(other.checker);
        self.total += other.total;
    }

    /// A table: each part's count, mean time and share of the runs' time.
    pub fn table(&self) -> String {
        use std::fmt::Write as _;
        let total = self.total.as_secs_f64().max(f64::MIN_POSITIVE);
        let mut out = String::new();
        let mut line = |name: &str, c: Cost| {
            let share = 100.0 * c.time.as_secs_f64() / total;
            let _ = if c.count == 0 {
                writeln!(out, "{name:<24} {:>12} {:>13} {share:>6.1}%", "", "")
            } else {
                let mean = c.time.as_secs_f64() * 1e9 / c.count as f64;
                writeln!(
                    out,
                    "{name:<24} {:>12} {mean:>10.0} ns {share:>6.1}%",
                    c.count
                )
            };
        };
        let mut steps = Cost::default();
        let mut kinds: Vec<(&&str, &Cost)> = self.steps.iter().collect();
        kinds.sort_by_key(|k| std::cmp::Reverse(k.1.time));
        for (kind, c) in kinds {
            line(&format!("step: {kind}"), *c);
            steps.add(*c);
        }
        line("steps, all", steps);
        line("views built", self.views);
        line("checker", self.checker);
        let timed = steps.time + self.views.time + self.checker.time;
        line(
            "the rest of the harness",
            Cost {
                count: 0,
                time: self.total.saturating_sub(timed),
            },
        );
        out
    }
}

/// Times `f` into `cost` when costs are kept.
pub(super) fn timed<T>(cost: Option<&mut Cost>, f: impl FnOnce() -> T) -> T {
    let Some(cost) = cost else {
        return f();
    };
    let started = Instant::now();
    let out = f();
    cost.count += 1;
    cost.time += started.elapsed();
    out
}
