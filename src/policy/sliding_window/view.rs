//! The sliding log among several rules (`policy::Compound`): a view of
//! the log as one frame of the client's rules has it, over a ring the
//! frame names, and the steps the compound runs on it.

use std::sync::Arc;

use super::{sequence, take_units, Moved, SlidingWindow, Snapshot, NONE};
use crate::cell::LogSlot;
use crate::policy::Spent;
use crate::sync::{AtomicU128, Ordering};
use crate::Decision;

/// A `sliding-window` rule among several ([`Compound`](super::Compound)):
/// the log as of one frame of the client's rules, over a ring that every
/// frame of the client shares, so that a decision copies nothing.
///
/// A frame holds `n`, the entries committed as of it, and the latest of
/// them, entry `n − 1`, which it *publishes*: the compound's CAS that
/// installs the frame is the entry's commit, and the ring is only
/// written afterwards, by whoever is about to replace the frame with one
/// that admits, or reads the frame for `remaining` or a sweep (`help`: one
/// CAS of slot `(n − 1) mod L` from entry `n − 1 − L` to entry `n − 1`, or
/// nothing if it holds entry `n − 1` already); a refusal writes nothing,
/// and reads no slot of the latest entry (the frame holds it). A frame of
/// `n + 1` entries is only ever made from one of `n` whose entry `n − 1`
/// its maker wrote first (`Compound`'s `help_logs`, before its CAS), so
/// while a frame is current every entry but its latest
/// is in the ring, and only its latest may wait for a helper. Each entry
/// is committed once, by one successful CAS of the compound, so every
/// helper of it writes the same word; a helper holding an older frame finds
/// its slot already moved on (the sequence number says so) and its CAS,
/// which expects the older word, fails harmlessly: a slot never holds the
/// same word twice (module docs). A reader of an older frame that finds a
/// slot overwritten answers `Moved`, and loads the compound's word
/// again, which then shows a newer frame: another thread's CAS landed.
///
/// A refund among the rules builds a new ring (as the log alone does,
/// module docs), and the frame names its ring (`LogRing`): the refund's
/// frame names the new one, so the compound's one CAS publishes the new
/// ring with every other rule's refund. A frame's ring is never written
/// again once a later frame names another (only an old frame's helper may
/// write its latest entry into it, which changes nothing any reader of a
/// later frame reads).
#[derive(Clone, Copy, Debug)]
pub(crate) struct LogView<'r> {
    ring: &'r [AtomicU128],
    /// The ring's floor (`LogRing`).
    floor: u64,
    /// Entries committed as of this frame.
    n: u64,
    /// Entry `n − 1` (time 0, no units, if there is none).
    latest: LogSlot,
    /// The entries before this one had left the window at the latest
    /// entry's time, so they have at every time a decision judges at (at
    /// least that one): where counting what is inside begins
    /// (`in_window`), so a log that is partly expired costs a few reads,
    /// not a search of the ring.
    from: u64,
}

/// A log among several rules as its frame keeps it: the entries committed,
/// the latest entry (packed) and where its window began (`LogView::from`).
pub(crate) type LogWords = (u64, u128, u64);

impl<'r> LogView<'r> {
    /// The view a frame's words give over `ring`.
    #[inline]
    pub(crate) fn new(ring: &'r LogRing, (n, latest, from): LogWords) -> Self {
        Self {
            ring: &ring.slots,
            floor: ring.floor,
            n,
            latest: LogSlot::unpack(latest),
            from,
        }
    }

    /// The time a decision as of this view judges at: `now`, or a later
    /// time the log reflects (its latest entry's, or its ring's floor).
    #[inline]
    fn judged(&self, now: u64) -> u64 {
        now.max(self.latest.time).max(self.floor)
    }

    #[inline]
    fn slot(&self, entry: u64) -> &AtomicU128 {
        // L fits usize (at most 2^20 − 1), so the remainder does too.
        &self.ring[(entry % self.ring.len() as u64) as usize]
    }

    /// Entry `entry` (below `n`), if its slot still holds it. Acquire
    /// pairs with the Release of the CAS that wrote it.
    #[inline]
    fn read(&self, entry: u64) -> Result<LogSlot, Moved> {
        if entry + 1 == self.n {
            return Ok(self.latest);
        }
        let slot = LogSlot::unpack(self.slot(entry).load(Ordering::Acquire));
        if slot.sequence == sequence(entry + self.ring.len() as u64) {
            Ok(slot)
        } else {
            Err(Moved)
        }
    }

    /// Writes the latest entry into its slot if no one has (type docs).
    ///
    /// Progress: the CAS fails only when the slot changed since the load,
    /// which only a helper writing this same entry (then the next pass
    /// finds it) or, for an older frame, the ring moving on (`Moved`)
    /// does.
    pub(crate) fn help(&self) -> Result<(), Moved> {
        let Some(entry) = self.n.checked_sub(1) else {
            return Ok(());
        };
        let len = self.ring.len() as u64;
        let slot = self.slot(entry);
        loop {
            let word = slot.load(Ordering::Acquire);
            let held = LogSlot::unpack(word).sequence;
            if held == sequence(entry + len) {
                return Ok(());
            }
            // The slot still holds entry `entry − L`, whose sequence is
            // `entry` (a slot never written holds sequence `i`, as if entry
            // `i − L` had been there).
            if held != sequence(entry) {
                return Err(Moved);
            }
            // AcqRel: Release publishes the entry to readers that Acquire
            // the slot.
            if slot
                .compare_exchange(
                    word,
                    self.latest.pack(),
                    Ordering::AcqRel,
                    Ordering::Acquire,
                )
                .is_ok()
            {
                return Ok(());
            }
        }
    }
}

/// A ring of a log among several rules, shared by the frames and states
/// that name it: each state holds one count of the `Arc` for every ring
/// its current frame names (`Compound`'s `CompoundState`), and a frame
/// names it by its address (`into_address`), one word.
pub(crate) struct LogRing {
    slots: Box<[AtomicU128]>,
    /// As a successor's (`Successor::floor`): 0, or the time the refund
    /// that built the ring was judged at.
    floor: u64,
}

impl LogRing {
    /// A ring of `slots` judged from `floor` on, held once, as a frame
    /// word.
    pub(crate) fn into_address(slots: Box<[AtomicU128]>, floor: u64) -> u64 {
        Arc::into_raw(Arc::new(Self { slots, floor })) as usize as u64
    }

    /// The ring at `address`.
    ///
    /// # Safety
    ///
    /// `address` came from `into_address`, and a count of it is held (by a
    /// state the caller holds, whose current frame named it when read), or
    /// was held when the caller's pin was taken and the caller still holds
    /// that pin (a ring given up is freed only through the collector,
    /// `let_go_later`).
    #[allow(unsafe_code)]
    pub(crate) unsafe fn at<'a>(address: u64) -> &'a Self {
        // SAFETY: as the caller promises, the `LogRing` is alive for 'a.
        unsafe { &*(address as usize as *const Self) }
    }

    /// One more count of the ring at `address`, for a new state whose
    /// frame names it.
    ///
    /// # Safety
    ///
    /// As `at`: the ring is alive.
    #[allow(unsafe_code)]
    pub(crate) unsafe fn share(address: u64) {
        // SAFETY: made by `Arc::into_raw` and alive (the caller).
        unsafe { Arc::increment_strong_count(address as usize as *const Self) }
    }

    /// Gives one count of the ring at `address` back now: its holder is
    /// gone, and no other thread can reach it through that holder.
    ///
    /// # Safety
    ///
    /// The caller holds that count, and gives it back once.
    #[allow(unsafe_code)]
    pub(crate) unsafe fn let_go(address: u64) {
        // SAFETY: a count the caller holds, made by `Arc::into_raw`.
        drop(unsafe { Arc::from_raw(address as usize as *const Self) });
    }

    /// Gives one count of the ring at `address` back once no pin taken
    /// before this call is held: a frame that named it was replaced, and a
    /// reader of that frame may still be reading it.
    ///
    /// # Safety
    ///
    /// As `let_go`.
    #[allow(unsafe_code)]
    pub(crate) unsafe fn let_go_later(address: u64) {
        // SAFETY: a count the caller holds (the caller).
        let count = unsafe { Arc::from_raw(address as usize as *const Self) };
        #[cfg(not(floodgate_loom))]
        crate::store::epoch::retire_in(Box::new(count), crate::store::epoch::EVERY_STORE);
        // Kept, under the models' cfg, where nothing is freed (`sync`).
        #[cfg(floodgate_loom)]
        std::mem::forget(count);
    }
}

impl SlidingWindow {
    /// A new client's log among several rules: its ring (`LogRing`, held
    /// once, for the new state) and its words.
    pub(crate) fn view_begin(&self) -> (u64, LogWords) {
        self.view_spent(0, 0)
    }

    /// A log with `spent` units admitted at `now` (as `spent_state`): its
    /// ring (as `view_begin`'s) and its words.
    pub(crate) fn view_spent(&self, spent: u64, now: u64) -> (u64, LogWords) {
        let (entries, latest) = self.spent_entry(spent, now);
        (
            LogRing::into_address(self.spent_slots(spent, now).collect(), 0),
            (entries, latest.pack(), 0),
        )
    }

    /// A refund among several rules as of `view`: up to `cost` units of
    /// the admission `ago` ticks before `now` (`now` no earlier than the
    /// origin), the contract's "Giving units back", as the log alone gives
    /// them. Answers the units given and, when any are, the new ring
    /// (`LogRing`, held once) and words of the log afterwards; `Moved` if
    /// the ring showed the frame stale.
    pub(crate) fn view_refund(
        &self,
        view: &LogView<'_>,
        now: u64,
        ago: u64,
        cost: u64,
    ) -> Result<(u64, Option<(u64, LogWords)>), Moved> {
        if crate::policy::gives_nothing(self.config, ago, cost) {
            return Ok((0, None));
        }
        let Some(at) = now.checked_sub(ago) else {
            return Ok((0, None));
        };
        let judged = view.judged(now);
        if self.expired(at, judged) {
            return Ok((0, None));
        }
        let read = |entry| view.read(entry);
        let mut entries = self.entries_of(view.n, view.from, judged, &read)?;
        let given = take_units(&mut entries, at, cost);
        if given == 0 {
            return Ok((0, None));
        }
        Ok((given, Some(self.view_of_entries(&entries, judged))))
    }

    /// A log whose whole history is `entries` (times and units, oldest
    /// first, at most `L`), judged from `floor` on: its new ring
    /// (`LogRing`, held once) and words. What a refund builds, and a load.
    pub(crate) fn view_of_entries(&self, entries: &[(u64, u64)], floor: u64) -> (u64, LogWords) {
        let kept = entries.len() as u64;
        let slots: Box<[AtomicU128]> = self.young_slots(entries).collect();
        // The new ring's latest entry, as the ring holds it.
        let latest = kept.checked_sub(1).map_or(NONE, |last| {
            // Relaxed: the ring is this thread's until it is published.
            LogSlot::unpack(slots[last as usize].load(Ordering::Relaxed))
        });
        (
            LogRing::into_address(slots, floor),
            (kept, latest.pack(), 0),
        )
    }

    /// What a save keeps of the log as of `view`: its ring's floor and the
    /// entries inside the window at the latest time it reflects (every
    /// call at that time or later counts exactly these); `Moved` if the
    /// ring showed the frame stale.
    pub(crate) fn view_saved(&self, view: &LogView<'_>) -> Result<(u64, Vec<(u64, u64)>), Moved> {
        let judged = view.judged(0);
        let entries = self.entries_of(view.n, view.from, judged, &|entry| view.read(entry))?;
        Ok((view.floor, entries))
    }

    /// How many entries a ring with `spent` units admitted at `now` holds
    /// (0 or 1), and its latest (`NONE` if none).
    pub(super) fn spent_entry(&self, spent: u64, now: u64) -> (u64, LogSlot) {
        let limit = self.config.limit();
        if spent == 0 {
            return (0, NONE);
        }
        let entry = LogSlot {
            sequence: sequence(limit),
            // At most L < 2^20 (`cell`).
            units: spent.min(limit) as u32,
            time: now,
        };
        (1, entry)
    }

    /// The `L` slots of a ring with `spent` units admitted at `now`: one
    /// entry (slot 0, sequence `L`) that counts them, if any, and the other
    /// slots as new (slot `i` as if entry `i − L` had been there).
    pub(super) fn spent_slots(&self, spent: u64, now: u64) -> impl Iterator<Item = AtomicU128> {
        let (entries, entry) = self.spent_entry(spent, now);
        (0..self.config.limit()).map(move |i| {
            let slot = if i < entries {
                entry
            } else {
                LogSlot {
                    sequence: i,
                    units: 0,
                    time: 0,
                }
            };
            AtomicU128::new(slot.pack())
        })
    }

    /// `remaining` at `now` as of `view`.
    pub(crate) fn view_remaining(&self, view: &LogView<'_>, now: u64) -> Result<u64, Moved> {
        view.help()?;
        let at = view.judged(now);
        let (used, _) = self.units_inside(view.n, view.from, view.latest, at, &|entry| {
            view.read(entry)
        })?;
        Ok(self.config.limit() - used)
    }

    /// The decision on a request of cost `1 <= cost <= L` at `now` as of
    /// `view`, and, if admitted, the words of the frame that commits it
    /// (the caller's CAS is the commit; the ring is written by a later
    /// `help`). It reads no slot of the latest entry, so it needs no
    /// `help` of its own: the caller helps before its CAS (type docs).
    pub(crate) fn view_check(
        &self,
        view: &LogView<'_>,
        now: u64,
        cost: u64,
    ) -> Result<(Decision, Option<LogWords>), Moved> {
        let limit = self.config.limit();
        let read = |entry| view.read(entry);
        let at = view.judged(now);
        if view.n >= limit && cost == 1 {
            // As the log alone: if the oldest of the last L entries is
            // still inside the window, all L are, and none is left.
            let oldest = read(view.n - limit)?;
            if !self.expired(oldest.time, at) {
                let free_at = u128::from(oldest.time) + u128::from(self.config.window());
                let retry_after = u64::try_from(free_at - u128::from(now)).unwrap_or(u64::MAX);
                return Ok((Decision::reject(0, retry_after), None));
            }
        }
        let (used, inside) = self.units_inside(view.n, view.from, view.latest, at, &read)?;
        if used + cost > limit {
            let snapshot = Snapshot {
                n: view.n,
                // Unused by `retry_after`.
                oldest: view.latest,
                latest: view.latest,
            };
            let retry_after = self.retry_after(&snapshot, view.from, at, now, cost, &read)?;
            return Ok((Decision::reject(limit - used, retry_after), None));
        }
        let admitted = LogSlot {
            sequence: sequence(view.n + limit),
            // cost <= L < 2^20: the running total stays mod 2^20 (`cell`).
            units: view.latest.units.wrapping_add(cost as u32) & LogSlot::UNITS,
            time: at,
        };
        Ok((
            Decision::admit(limit - used - cost),
            // Entries before the first inside at `at` have left the window
            // for good: the new latest entry's time is `at`.
            Some((view.n + 1, admitted.pack(), view.n - inside)),
        ))
    }

    /// Idle at `now` as of `view`: no entry inside the window.
    pub(crate) fn view_idle(&self, view: &LogView<'_>, now: u64) -> bool {
        view.n == 0 || self.expired(view.latest.time, now.max(view.floor))
    }

    /// What `view` had spent, judged no earlier than its newest entry (as
    /// `retire_spent`). The view is a retired state's, whose ring no chain
    /// of frames moves on; were it moved, the whole limit counts as
    /// spent, the stricter answer.
    pub(crate) fn view_spent_at(&self, view: &LogView<'_>, now: u64) -> Spent {
        let at = view.judged(now);
        let count = match view.help().and_then(|()| {
            self.units_inside(view.n, view.from, view.latest, at, &|entry| {
                view.read(entry)
            })
        }) {
            Ok((used, _)) => used,
            Err(Moved) => self.config.limit(),
        };
        Spent { count, at }
    }
}
