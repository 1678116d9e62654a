//! A VIP's moves, told as Events on its Services: at most one per VIP in
//! [`MOVE_EVENT_EVERY`], the moves left out in between counted in the next
//! one. A flapping VIP then writes one Event a minute, not one per flap;
//! every move still reaches the NodeAgent record and the metrics.

use std::collections::BTreeMap;
use std::net::IpAddr;
use std::time::{Duration, Instant};

use super::api::MoveCause;

/// At most one move Event per VIP this often.
pub const MOVE_EVENT_EVERY: Duration = Duration::from_secs(60);
/// A VIP's count of moves left out is forgotten this long after its last
/// Event, if it never moves again.
const FORGOTTEN_AFTER: Duration = Duration::from_secs(600);

#[derive(Debug, Default)]
pub struct MoveNotes {
    by_ip: BTreeMap<IpAddr, Told>,
}

#[derive(Debug)]
struct Told {
    at: Instant,
    left_out: u32,
}

impl MoveNotes {
    /// The Event's note for a move of `ip` to `to` now, or `None` when one
    /// was told for it within [`MOVE_EVENT_EVERY`] (then it is counted).
    pub fn note(
        &mut self,
        ip: IpAddr,
        to: &str,
        from: &str,
        cause: MoveCause,
        dark: Option<Duration>,
        now: Instant,
    ) -> Option<String> {
        if let Some(t) = self.by_ip.get_mut(&ip)
            && now.saturating_duration_since(t.at) < MOVE_EVENT_EVERY
        {
            t.left_out += 1;
            return None;
        }
        self.by_ip
            .retain(|_, t| now.saturating_duration_since(t.at) < FORGOTTEN_AFTER);
        let left_out = self
            .by_ip
            .insert(
                ip,
                Told {
                    at: now,
                    left_out: 0,
                },
            )
            .map_or(0, |t| t.left_out);
        let how = match (cause.is_fault(), dark) {
            (true, Some(d)) => format!(
                "no host answered for it for up to {} ms (from {from}'s last beat)",
                d.as_millis()
            ),
            (true, None) => format!("{from}'s last beat is too old to tell how long it was dark"),
            (false, _) => format!("make before break: {from} answered until {to} did"),
        };
        let mut note = format!("{ip} moved to {to} from {from} ({}): {how}", cause.as_str());
        if left_out > 0 {
            note.push_str(&format!(
                "; {left_out} earlier move(s) of it in the last minute not told as Events"
            ));
        }
        Some(note)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ip(s: &str) -> IpAddr {
        s.parse().unwrap()
    }

    #[test]
    fn a_fault_says_how_long_it_was_dark_and_a_planned_move_says_make_before_break() {
        let mut m = MoveNotes::default();
        let t = Instant::now();
        let gone = m
            .note(
                ip("10.0.0.1"),
                "b",
                "a",
                MoveCause::Gone,
                Some(Duration::from_millis(190)),
                t,
            )
            .unwrap();
        assert_eq!(
            gone,
            "10.0.0.1 moved to b from a (host-gone): no host answered for it for up to 190 ms (from a's last beat)"
        );
        let drained = m
            .note(ip("10.0.0.2"), "b", "a", MoveCause::Drained, None, t)
            .unwrap();
        assert!(
            drained.ends_with("(drain): make before break: a answered until b did"),
            "{drained}"
        );
    }

    #[test]
    fn a_flapping_vip_is_told_once_a_minute_with_the_moves_left_out_counted() {
        let mut m = MoveNotes::default();
        let t = Instant::now();
        let v = ip("10.0.0.1");
        assert!(
            m.note(v, "b", "a", MoveCause::Preference, None, t)
                .is_some()
        );
        for i in 1..=5 {
            let at = t + Duration::from_secs(i * 5);
            assert_eq!(m.note(v, "a", "b", MoveCause::Silent, None, at), None);
        }
        // Another VIP is not held back by this one.
        assert!(
            m.note(
                ip("10.0.0.2"),
                "b",
                "a",
                MoveCause::Gone,
                None,
                t + Duration::from_secs(1)
            )
            .is_some()
        );
        let next = m
            .note(
                v,
                "b",
                "a",
                MoveCause::Preference,
                None,
                t + MOVE_EVENT_EVERY,
            )
            .unwrap();
        assert!(
            next.ends_with("; 5 earlier move(s) of it in the last minute not told as Events"),
            "{next}"
        );
        // Counted once: the next one after a quiet minute says nothing more.
        let quiet = m
            .note(
                v,
                "a",
                "b",
                MoveCause::Preference,
                None,
                t + 2 * MOVE_EVENT_EVERY,
            )
            .unwrap();
        assert!(!quiet.contains("earlier"), "{quiet}");
    }

    #[test]
    fn what_is_remembered_is_bounded_by_time() {
        let mut m = MoveNotes::default();
        let t = Instant::now();
        for i in 0..100u8 {
            m.note(
                IpAddr::from([10, 0, 1, i]),
                "b",
                "a",
                MoveCause::Gone,
                None,
                t,
            );
        }
        assert_eq!(m.by_ip.len(), 100);
        m.note(
            ip("10.0.0.1"),
            "b",
            "a",
            MoveCause::Gone,
            None,
            t + FORGOTTEN_AFTER,
        );
        assert_eq!(m.by_ip.len(), 1);
    }
}
