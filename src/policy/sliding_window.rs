//! `sliding-window`: the exact sliding log. A request at `now` is admitted
//! iff fewer than `L` admitted requests have times `t > now − W`.
//!
//! Only the last `L` admissions can matter, so each client keeps them in a
//! ring of `L` slots (`LogSlot`, layout in `cell`): admission `m` lives in
//! slot `m mod L`, tagged with sequence `m + L`. With `n` admissions so far,
//! slot `n mod L` holds the oldest of the last `L`, and
//!
//! * admission `n` is one CAS on that slot, from (`n`, oldest) to
//!   (`n + L`, now) — it fails if anyone else admitted `n` first, so each
//!   admission is committed exactly once, in order;
//! * `committed` is only a hint for `n`: it is moved from `n` to `n + 1` by
//!   whoever sees the slot of `n` already committed (the admitting thread
//!   or any other that finds it lagging), so it is never more than one behind
//!   and no thread waits on another.
//!
//! Admission times are stored as `max(now, previous admission's time)`, so
//! the ring is sorted and stored time never moves backwards; `remaining`
//! finds the first admission still inside the window by galloping in from
//! both ends: O(1) for an idle or a saturated client, O(log L) at worst.
//! An admission's `Decision::remaining` is read after its CAS, so under
//! contention it may already count other threads' later admissions: smaller,
//! never larger, than at the instant of the CAS.
//!
//! Retiring the state marks the frontier slot (the one admission `n` would
//! take) with `R`: every admission's CAS expects that slot unmarked, so the
//! ring is frozen from then on, and reads see the mark and stop.

use super::{sealed, Policy, Retired, Spent};
use crate::cell::LogSlot;
use crate::sync::{AtomicU128, AtomicU64, Ordering};
use crate::{Config, ConfigError, Decision, PolicyKind};

/// The exact sliding log: at most `limit` requests in any `window` ticks.
/// Keeps the last `limit` admission times per client (16 bytes each).
#[derive(Clone, Copy, Debug)]
pub struct SlidingWindow {
    config: Config,
}

/// One client's `sliding-window` state: the ring of its last `L` admissions.
#[derive(Debug)]
pub struct SlidingWindowState {
    /// Admissions committed so far, or one fewer (a hint; see module docs).
    committed: AtomicU64,
    ring: Box<[AtomicU128]>,
}

/// The state as of one instant: `n` admissions, the oldest of the last `L`
/// (as stored in its slot), and the latest admission's time.
struct Snapshot {
    n: u64,
    oldest: LogSlot,
    latest_time: u64,
}

/// A slot was overwritten while being read: the state moved on; start again.
struct Moved;

impl SlidingWindowState {
    #[inline]
    fn slot(&self, admission: u64) -> &AtomicU128 {
        // The ring has L slots and L fits usize (it is at most 2^20 − 1), so
        // the remainder does too.
        &self.ring[(admission % self.ring.len() as u64) as usize]
    }

    /// Slot `admission mod L` if it still holds that admission.
    ///
    /// Acquire pairs with the Release of the CAS that wrote the slot; the
    /// slot's own sequence number is what the reader checks, so nothing else
    /// rides on this ordering.
    #[inline]
    fn read(&self, admission: u64) -> Result<LogSlot, Moved> {
        let slot = LogSlot::unpack(self.slot(admission).load(Ordering::Acquire));
        if slot.sequence == admission + self.ring.len() as u64 {
            Ok(slot)
        } else {
            Err(Moved)
        }
    }

    /// A consistent view of the state: linearised at the load of the oldest
    /// slot (which shows that admission `n` had not yet been committed).
    fn snapshot(&self) -> Result<Snapshot, Retired> {
        let len = self.ring.len() as u64;
        loop {
            // Acquire: a hint only; every slot read below is checked by its
            // sequence number.
            let n = self.committed.load(Ordering::Acquire);
            let oldest = LogSlot::unpack(self.slot(n).load(Ordering::Acquire));
            if oldest.sequence == n | LogSlot::RETIRED {
                return Err(Retired);
            }
            if oldest.sequence == n + len {
                // Admission n is committed but the hint lags: move it on for
                // whoever committed it, then look again.
                self.advance_hint(n);
                continue;
            }
            if oldest.sequence != n {
                continue; // the hint moved on after we read it
            }
            let latest_time = match n.checked_sub(1) {
                None => 0,
                // Admission n − 1 stays in its slot until admission n − 1 + L,
                // which follows admission n: if it is gone, so is this view.
                Some(previous) => match self.read(previous) {
                    Ok(slot) => slot.time,
                    Err(Moved) => continue,
                },
            };
            return Ok(Snapshot {
                n,
                oldest,
                latest_time,
            });
        }
    }

    /// Marks the frontier slot of `snapshot` retired; fails if the ring
    /// moved on since. AcqRel/Acquire as an admission's CAS.
    fn mark(&self, snapshot: &Snapshot) -> bool {
        let marked = LogSlot {
            sequence: snapshot.n | LogSlot::RETIRED,
            ..snapshot.oldest
        };
        self.slot(snapshot.n)
            .compare_exchange(
                snapshot.oldest.pack(),
                marked.pack(),
                Ordering::AcqRel,
                Ordering::Acquire,
            )
            .is_ok()
    }

    /// The admissions of a retired (frozen) ring: the marked slot is the
    /// frontier `n`, and the hint is `n` or `n − 1`.
    fn frozen_admissions(&self) -> u64 {
        let hint = self.committed.load(Ordering::Acquire);
        let at_hint = LogSlot::unpack(self.slot(hint).load(Ordering::Acquire));
        if at_hint.sequence == hint | LogSlot::RETIRED {
            hint
        } else {
            hint + 1
        }
    }

    /// Admission `admission`'s time in a frozen ring (no slot can change).
    fn frozen_time(&self, admission: u64) -> u64 {
        LogSlot::unpack(self.slot(admission).load(Ordering::Acquire)).time
    }

    #[inline]
    fn advance_hint(&self, from: u64) {
        // Failure means another thread already moved it: nothing to do.
        // AcqRel/Relaxed: the hint carries no data (see `snapshot`).
        let _ =
            self.committed
                .compare_exchange(from, from + 1, Ordering::AcqRel, Ordering::Relaxed);
    }
}

impl SlidingWindow {
    /// Whether admission time `time` has left the window at `now`:
    /// `time <= now − W`.
    #[inline]
    fn expired(&self, time: u64, now: u64) -> bool {
        u128::from(time) + u128::from(self.config.window()) <= u128::from(now)
    }

    /// How many of the last `L` admissions before admission `n` are still
    /// inside the window at `now`; `Moved` if the ring changed meanwhile.
    ///
    /// Times rise with the admission number, so the expired ones are a
    /// prefix. Gallop in from both ends (1, 2, 4, … slots from each), then
    /// bisect what is left: O(log min(expired, inside)) slot reads, so a
    /// client that is idle (all expired) or saturated (all inside) costs two
    /// or three reads, mostly of slots the caller has just touched.
    fn in_window(
        &self,
        n: u64,
        now: u64,
        time_of: impl Fn(u64) -> Result<u64, Moved>,
    ) -> Result<u64, Moved> {
        let expired = |admission| Ok::<_, Moved>(self.expired(time_of(admission)?, now));
        let mut low = n.saturating_sub(self.config.limit()); // [first, low) expired
        let mut high = n; // [high, n) inside
        let mut stride = 1;
        while high - low > 2 * stride {
            let bottom = low + stride - 1;
            if !expired(bottom)? {
                high = bottom;
                break;
            }
            low = bottom + 1;
            let top = high - stride;
            if expired(top)? {
                low = top + 1;
                break;
            }
            high = top;
            stride *= 2;
        }
        while low < high {
            let middle = low + (high - low) / 2;
            if expired(middle)? {
                low = middle + 1;
            } else {
                high = middle;
            }
        }
        Ok(n - low)
    }

    fn remaining_at(&self, state: &SlidingWindowState, now: u64) -> Result<u64, Retired> {
        loop {
            let snapshot = state.snapshot()?;
            let now = now.max(snapshot.latest_time);
            let time_of = |admission| state.read(admission).map(|slot| slot.time);
            let Ok(inside) = self.in_window(snapshot.n, now, time_of) else {
                continue;
            };
            // Every slot read above stays until admission n is committed; if
            // it still is not, the reads all held at this instant.
            if state.slot(snapshot.n).load(Ordering::Acquire) == snapshot.oldest.pack() {
                return Ok(self.config.limit() - inside);
            }
        }
    }

    /// Idle when no admission is inside the window at `now`: none ever, or
    /// the latest one is `<= now − W` (times rise along the ring).
    fn idle(&self, snapshot: &Snapshot, now: u64) -> bool {
        snapshot.n == 0 || self.expired(snapshot.latest_time, now)
    }
}

impl sealed::Sealed for SlidingWindow {}

impl Policy for SlidingWindow {
    type State = SlidingWindowState;
    const KIND: PolicyKind = PolicyKind::SlidingWindow;

    fn new(config: Config) -> Result<Self, ConfigError> {
        Ok(Self {
            config: config.check_for(Self::KIND)?,
        })
    }

    fn config(&self) -> Config {
        self.config
    }

    /// Slot `i` starts as if admission `i − L` had been there.
    fn new_state(&self) -> SlidingWindowState {
        self.spent_state(0, 0)
    }

    fn check(&self, state: &SlidingWindowState, now: u64) -> Result<Decision, Retired> {
        let limit = self.config.limit();
        loop {
            let Snapshot {
                n,
                oldest,
                latest_time,
            } = state.snapshot()?;
            // Judged at the latest time the state reflects, if that is later.
            let at = now.max(latest_time);
            if n >= limit && !self.expired(oldest.time, at) {
                // All of the last L are inside the window: none left.
                let free_at = u128::from(oldest.time) + u128::from(self.config.window());
                let retry_after = u64::try_from(free_at - u128::from(now)).unwrap_or(u64::MAX);
                return Ok(Decision::reject(0, retry_after));
            }
            let admitted = LogSlot {
                sequence: n + limit,
                time: at,
            };
            // Linearisation point of an admission. AcqRel: Release publishes
            // the slot to readers that Acquire it; Acquire on failure is for
            // the retry's reads.
            if state
                .slot(n)
                .compare_exchange(
                    oldest.pack(),
                    admitted.pack(),
                    Ordering::AcqRel,
                    Ordering::Acquire,
                )
                .is_ok()
            {
                state.advance_hint(n);
                // Retired right after this admission: it is in the frozen
                // ring, and counted there, so answer from it.
                let remaining = match self.remaining_at(state, at) {
                    Ok(remaining) => remaining,
                    Err(Retired) => self.frozen_remaining(state, at),
                };
                return Ok(Decision::admit(remaining));
            }
        }
    }

    fn remaining(&self, state: &SlidingWindowState, now: u64) -> Result<u64, Retired> {
        self.remaining_at(state, now)
    }

    fn retire_if_idle(&self, state: &SlidingWindowState, now: u64) -> bool {
        loop {
            let Ok(snapshot) = state.snapshot() else {
                return false;
            };
            if !self.idle(&snapshot, now) {
                return false;
            }
            if state.mark(&snapshot) {
                return true;
            }
        }
    }

    /// Judged no earlier than the newest admission in the log.
    fn retire_spent(&self, state: &SlidingWindowState, now: u64) -> Spent {
        while let Ok(snapshot) = state.snapshot() {
            if state.mark(&snapshot) {
                break;
            }
        }
        let at = now.max(self.frozen_latest(state));
        Spent {
            count: self.config.limit() - self.frozen_remaining(state, at),
            at,
        }
    }

    /// The ring with `spent` admissions at `now`: slot `i < spent` holds
    /// admission `i` (sequence `i + L`), the others are as new.
    fn spent_state(&self, spent: u64, now: u64) -> SlidingWindowState {
        let len = self.config.limit();
        let spent = spent.min(len);
        SlidingWindowState {
            committed: AtomicU64::new(spent),
            ring: (0..len)
                .map(|i| {
                    let slot = if i < spent {
                        LogSlot {
                            sequence: i + len,
                            time: now,
                        }
                    } else {
                        LogSlot {
                            sequence: i,
                            time: 0,
                        }
                    };
                    AtomicU128::new(slot.pack())
                })
                .collect(),
        }
    }

    fn is_retired(&self, state: &SlidingWindowState) -> bool {
        state.snapshot().is_err()
    }
}

impl SlidingWindow {
    /// `remaining` of a retired ring, as it was frozen.
    /// The newest admission's time in a frozen ring (0 if none).
    fn frozen_latest(&self, state: &SlidingWindowState) -> u64 {
        let n = state.frozen_admissions();
        n.checked_sub(1).map_or(0, |last| state.frozen_time(last))
    }

    fn frozen_remaining(&self, state: &SlidingWindowState, now: u64) -> u64 {
        let n = state.frozen_admissions();
        let latest = self.frozen_latest(state);
        let time_of = |admission| Ok(state.frozen_time(admission));
        match self.in_window(n, now.max(latest), time_of) {
            Ok(inside) => self.config.limit() - inside,
            Err(Moved) => unreachable!("a frozen ring does not move"),
        }
    }
}

#[cfg(all(test, not(floodgate_loom)))]
mod tests {
    use super::*;

    fn policy(limit: u64, window: u64) -> SlidingWindow {
        SlidingWindow::new(Config::per_ticks(limit, window).unwrap()).unwrap()
    }

    #[test]
    fn the_spec_session_for_one_client() {
        let policy = policy(3, 1_000);
        let rahul = policy.new_state();
        assert_eq!(policy.check(&rahul, 0).unwrap(), Decision::admit(2));
        assert_eq!(policy.check(&rahul, 100).unwrap(), Decision::admit(1));
        assert_eq!(policy.check(&rahul, 200).unwrap(), Decision::admit(0));
        assert_eq!(policy.check(&rahul, 300).unwrap(), Decision::reject(0, 700));
        assert_eq!(policy.remaining(&rahul, 999).unwrap(), 0);
        assert_eq!(policy.check(&rahul, 1_000).unwrap(), Decision::admit(0));
        assert_eq!(policy.remaining(&rahul, 1_150).unwrap(), 1);
    }

    #[test]
    fn remaining_counts_across_many_laps_of_the_ring() {
        let policy = policy(5, 100);
        let state = policy.new_state();
        for lap in 0..50u64 {
            for i in 0..5 {
                assert!(policy.check(&state, lap * 100 + i * 10).unwrap().allowed);
            }
        }
        // Admissions at 4900, 4910, …, 4940.
        assert_eq!(policy.remaining(&state, 4_999).unwrap(), 0);
        assert_eq!(policy.remaining(&state, 5_000).unwrap(), 1);
        assert_eq!(policy.remaining(&state, 5_025).unwrap(), 3);
        assert_eq!(policy.remaining(&state, 5_040).unwrap(), 5);
    }

    #[test]
    fn remaining_is_exact_wherever_the_window_edge_falls() {
        // Admissions at 0, 10, …, 630 (64 of them, L = 64, W = 1000): at
        // every instant from 630 to 1640 count the inside ones by hand.
        let policy = policy(64, 1_000);
        let state = policy.new_state();
        let times: Vec<u64> = (0..64).map(|i| i * 10).collect();
        for &t in &times {
            assert!(policy.check(&state, t).unwrap().allowed);
        }
        for now in 630..=1_640 {
            let inside = times.iter().filter(|&&t| t + 1_000 > now).count() as u64;
            assert_eq!(
                policy.remaining(&state, now).unwrap(),
                64 - inside,
                "at {now}"
            );
        }
    }

    #[test]
    fn an_older_now_is_stored_as_the_latest_time() {
        let policy = policy(2, 100);
        let state = policy.new_state();
        assert!(policy.check(&state, 500).unwrap().allowed);
        assert!(policy.check(&state, 10).unwrap().allowed); // stored as 500
        assert_eq!(policy.check(&state, 550).unwrap(), Decision::reject(0, 50));
        assert_eq!(policy.remaining(&state, 600).unwrap(), 2);
    }

    #[test]
    fn idle_once_the_latest_admission_left_the_window() {
        let policy = policy(3, 100);
        let state = policy.new_state();
        assert!(policy.check(&state, 10).unwrap().allowed);
        assert!(policy.check(&state, 40).unwrap().allowed);
        assert!(!policy.retire_if_idle(&state, 139));
        assert!(policy.retire_if_idle(&state, 140));
        assert_eq!(policy.check(&state, 140), Err(Retired));
        assert_eq!(policy.remaining(&state, 140), Err(Retired));
        assert!(policy.is_retired(&state));
    }

    #[test]
    fn a_retired_ring_still_tells_what_it_spent() {
        let policy = policy(4, 100);
        let state = policy.new_state();
        for t in [0, 10, 20, 30, 100, 110] {
            assert!(policy.check(&state, t).unwrap().allowed);
        }
        // At 110: 20, 30, 100 and 110 are inside.
        assert_eq!(policy.retire_spent(&state, 110).count, 4);
        assert_eq!(
            policy.retire_spent(&state, 131).count,
            2,
            "frozen: 100, 110"
        );
        // An older `now` is judged at the newest admission, 110.
        assert_eq!(policy.retire_spent(&state, 50), Spent { count: 4, at: 110 });
        let carried = policy.spent_state(2, 131);
        assert_eq!(policy.remaining(&carried, 131).unwrap(), 2);
        assert_eq!(policy.remaining(&carried, 231).unwrap(), 4);
    }
}
