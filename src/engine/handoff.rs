//! [`Handoff`]: who drives a batcher lane, decided without a lock.
//!
//! A lane is a lock-free queue and a busy flag (`engine::batch`). A purchase
//! pushes its entry, then claims the flag: if it was free, it starts a
//! driver. A driver that finds the queue dry frees the flag, then looks at
//! the queue once more: an entry pushed meanwhile found the flag still set
//! and started nobody, so the driver takes over again.
//!
//! Each side writes its own variable and then reads the other's: the
//! store-buffering shape. It is safe only if a sequentially consistent fence
//! sits between each side's write and its read. Without one (the driver's
//! `Release` store, then the queue's emptiness read) the read may see the
//! queue as it was before the push while the pusher's swap still sees the
//! flag set (on x86 the store waits in the store buffer while the load runs):
//! nobody drives the entry, its purchase times out, and it is sent only when
//! a later purchase comes to that lane, with that call's clock, maybe after
//! the sale ended, or never once the lane is forgotten.
//!
//! The two steps are written once here, generic over the atomics
//! ([`Memory`]): the batcher runs them on `std`'s, and the tests below run
//! them on `loom`'s, which explores every interleaving and every outcome the
//! memory model allows for a pusher and a driver (the model fails with the
//! fences taken out). A pusher reads the flag before it swaps it: a lane
//! seen busy costs a load, not a write of the flag's cache line; and loom
//! orders the modifications of one flag only partially, so a swap that
//! always writes was a false alarm there (two swaps both reading `true`
//! around the driver's store), which a load-then-swap never shows.

use std::sync::atomic::Ordering;

/// The atomics a [`Handoff`] runs on: `std`'s in the service, `loom`'s in
/// the model.
pub(crate) trait Memory {
    type Flag: Default + Send + Sync;
    type Word: Default + Send + Sync;
    fn swap(flag: &Self::Flag, value: bool, order: Ordering) -> bool;
    fn store(flag: &Self::Flag, value: bool, order: Ordering);
    fn load(flag: &Self::Flag, order: Ordering) -> bool;
    fn fence(order: Ordering);
    fn word(word: &Self::Word, order: Ordering) -> u64;
    /// `compare_exchange`, `Ok` when it swapped.
    fn swap_word(word: &Self::Word, from: u64, to: u64, order: Ordering) -> bool;
}

/// The service's atomics.
#[derive(Debug, Default)]
pub(crate) struct Std;

impl Memory for Std {
    type Flag = std::sync::atomic::AtomicBool;
    type Word = std::sync::atomic::AtomicU64;

    fn swap(flag: &Self::Flag, value: bool, order: Ordering) -> bool {
        flag.swap(value, order)
    }

    fn store(flag: &Self::Flag, value: bool, order: Ordering) {
        flag.store(value, order);
    }

    fn load(flag: &Self::Flag, order: Ordering) -> bool {
        flag.load(order)
    }

    fn fence(order: Ordering) {
        std::sync::atomic::fence(order);
    }

    fn word(word: &Self::Word, order: Ordering) -> u64 {
        word.load(order)
    }

    fn swap_word(word: &Self::Word, from: u64, to: u64, order: Ordering) -> bool {
        word.compare_exchange(from, to, order, Ordering::Relaxed)
            .is_ok()
    }
}

/// A lane's busy flag: set while a driver works the lane.
pub(crate) struct Handoff<M: Memory = Std> {
    busy: M::Flag,
}

impl<M: Memory> Default for Handoff<M> {
    fn default() -> Self {
        Self {
            busy: M::Flag::default(),
        }
    }
}

impl<M: Memory> Handoff<M> {
    /// After pushing an entry: whether this caller must start a driver (the
    /// lane was idle).
    pub(crate) fn claim_after_push(&self) -> bool {
        // The push (a store in the queue) must be visible before the flag is
        // read, to a driver that frees the flag and then reads the queue.
        M::fence(Ordering::SeqCst);
        // A lane seen busy is left to its driver (which will see the push),
        // without writing the flag's cache line: under load most pushes find
        // their lane busy.
        !M::load(&self.busy, Ordering::Relaxed) && !M::swap(&self.busy, true, Ordering::AcqRel)
    }

    /// A driver found its queue dry: frees the lane and says whether to stop
    /// (`true`), or to take over again for an entry pushed meanwhile whose
    /// caller saw the lane busy and started nobody.
    pub(crate) fn release(&self, queue_is_empty: impl FnOnce() -> bool) -> bool {
        M::store(&self.busy, false, Ordering::Release);
        // The freed flag must be visible before the queue is read, to a
        // pusher that pushes and then reads the flag.
        M::fence(Ordering::SeqCst);
        queue_is_empty() || M::swap(&self.busy, true, Ordering::AcqRel)
    }

    /// Whether a driver works the lane now (a hint: it may change at once).
    pub(crate) fn is_busy(&self) -> bool {
        M::load(&self.busy, Ordering::Acquire)
    }
}

/// One claimant a period for a periodic job that runs only while wanted (the
/// batcher's reading of the server's CPU, `engine::batch::Spill`): `want`
/// marks it wanted, `claim` is true for one caller once a period has passed
/// since the last claim and it was wanted since. Both are single-variable
/// read-modify-writes (a compare-and-set on the next due time, then a swap of
/// the wanted mark), so no ordering between the two variables is relied on:
/// a caller that loses either does nothing, and a `want` racing a claim is
/// either taken by it or left for the next period. The model below checks
/// that two callers never both claim one period.
pub(crate) struct PeriodClaim<M: Memory = Std> {
    wanted: M::Flag,
    /// When the next claim may be made (ms on the caller's clock).
    due_ms: M::Word,
}

impl<M: Memory> Default for PeriodClaim<M> {
    fn default() -> Self {
        Self {
            wanted: M::Flag::default(),
            due_ms: M::Word::default(),
        }
    }
}

impl<M: Memory> PeriodClaim<M> {
    /// Marks the job wanted (a load first: under load the mark is already
    /// there, and a load does not write the cache line).
    pub(crate) fn want(&self) {
        if !M::load(&self.wanted, Ordering::Relaxed) {
            M::store(&self.wanted, true, Ordering::Relaxed);
        }
    }

    /// Whether this caller runs the job now (`now_ms`, every `every_ms`).
    pub(crate) fn claim(&self, now_ms: u64, every_ms: u64) -> bool {
        if !M::load(&self.wanted, Ordering::Relaxed) {
            return false;
        }
        let due = M::word(&self.due_ms, Ordering::Relaxed);
        now_ms >= due
            && M::swap_word(&self.due_ms, due, now_ms + every_ms, Ordering::Relaxed)
            && M::swap(&self.wanted, false, Ordering::Relaxed)
    }
}

#[cfg(test)]
mod model {
    //! The lane handoff under `loom`: a pusher and a driver whose queue just
    //! ran dry, every interleaving and weak-memory outcome. The property: an
    //! entry pushed is driven, by the driver taking over again or by the
    //! pusher starting one. The queue is modelled by its push counter with
    //! the orderings crossbeam's `SegQueue` uses (a `SeqCst` update on push,
    //! `SeqCst` reads for `is_empty`), which loom treats no stronger than
    //! acquire/release: only the fences make the handoff safe.

    use std::sync::atomic::Ordering;

    use loom::sync::Arc;
    use loom::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize};

    use super::{Handoff, Memory, PeriodClaim};

    /// loom's atomics.
    struct Loom;

    impl Memory for Loom {
        type Flag = AtomicBool;
        type Word = AtomicU64;

        fn swap(flag: &Self::Flag, value: bool, order: Ordering) -> bool {
            flag.swap(value, order)
        }

        fn store(flag: &Self::Flag, value: bool, order: Ordering) {
            flag.store(value, order);
        }

        fn load(flag: &Self::Flag, order: Ordering) -> bool {
            flag.load(order)
        }

        fn fence(order: Ordering) {
            loom::sync::atomic::fence(order);
        }

        fn word(word: &Self::Word, order: Ordering) -> u64 {
            word.load(order)
        }

        fn swap_word(word: &Self::Word, from: u64, to: u64, order: Ordering) -> bool {
            word.compare_exchange(from, to, order, Ordering::Relaxed)
                .is_ok()
        }
    }

    /// The handoff as it was: no fence on either side.
    struct Unfenced;

    impl Memory for Unfenced {
        type Flag = AtomicBool;
        type Word = AtomicU64;

        fn swap(flag: &Self::Flag, value: bool, order: Ordering) -> bool {
            flag.swap(value, order)
        }

        fn store(flag: &Self::Flag, value: bool, order: Ordering) {
            flag.store(value, order);
        }

        fn load(flag: &Self::Flag, order: Ordering) -> bool {
            flag.load(order)
        }

        fn fence(_: Ordering) {}

        fn word(word: &Self::Word, order: Ordering) -> u64 {
            word.load(order)
        }

        fn swap_word(word: &Self::Word, from: u64, to: u64, order: Ordering) -> bool {
            word.compare_exchange(from, to, order, Ordering::Relaxed)
                .is_ok()
        }
    }

    /// The two steps of a lane: claim after a push, release when dry.
    trait Lane: Default + Send + Sync + 'static {
        fn claim_after_push(&self) -> bool;
        fn release(&self, queue_is_empty: impl FnOnce() -> bool) -> bool;
    }

    impl<M: Memory + 'static> Lane for Handoff<M>
    where
        M::Flag: 'static,
    {
        fn claim_after_push(&self) -> bool {
            Handoff::claim_after_push(self)
        }

        fn release(&self, queue_is_empty: impl FnOnce() -> bool) -> bool {
            Handoff::release(self, queue_is_empty)
        }
    }

    /// The batcher's lane as it was (main 459b87a): the pusher's swap and
    /// the driver's store, no fence.
    #[derive(Default)]
    struct Before {
        busy: AtomicBool,
    }

    impl Lane for Before {
        fn claim_after_push(&self) -> bool {
            !self.busy.swap(true, Ordering::AcqRel)
        }

        fn release(&self, queue_is_empty: impl FnOnce() -> bool) -> bool {
            self.busy.store(false, Ordering::Release);
            queue_is_empty() || self.busy.swap(true, Ordering::AcqRel)
        }
    }

    /// One push racing one driver's release; panics when the entry is left
    /// with nobody to drive it.
    fn push_racing_release<L: Lane>() {
        loom::model(|| {
            let lane = Arc::new(L::default());
            // A driver is at work (the flag set) and has taken every entry.
            assert!(lane.claim_after_push());
            let pushed = Arc::new(AtomicUsize::new(0));
            let driver = {
                let (lane, pushed) = (lane.clone(), pushed.clone());
                loom::thread::spawn(move || {
                    let stops = lane.release(|| pushed.load(Ordering::SeqCst) == 0);
                    !stops
                })
            };
            pushed.fetch_add(1, Ordering::SeqCst);
            let started = lane.claim_after_push();
            let took_over = driver.join().unwrap();
            assert!(
                started || took_over,
                "an entry was pushed and nobody drives it"
            );
            assert!(!(started && took_over), "two drivers on one lane");
        });
    }

    #[test]
    fn every_entry_pushed_is_driven_by_exactly_one_driver() {
        push_racing_release::<Handoff<Loom>>();
    }

    #[test]
    fn without_the_fences_an_entry_can_be_left_with_nobody_to_drive_it() {
        let lost = std::panic::catch_unwind(push_racing_release::<Handoff<Unfenced>>);
        assert!(
            lost.is_err(),
            "loom should find the lost wakeup of the handoff without fences"
        );
    }

    #[test]
    fn the_lane_as_it_was_loses_an_entry() {
        let lost = std::panic::catch_unwind(push_racing_release::<Before>);
        assert!(
            lost.is_err(),
            "loom should find the lost wakeup of the old lane"
        );
    }

    /// Two callers at the same moment of a due period, one more wanting the
    /// job meanwhile: one claim, never two.
    #[test]
    fn one_claimant_a_period() {
        loom::model(|| {
            let claim = Arc::new(PeriodClaim::<Loom>::default());
            claim.want();
            let other = {
                let claim = claim.clone();
                loom::thread::spawn(move || claim.claim(1_000, 500))
            };
            let wanting = {
                let claim = claim.clone();
                loom::thread::spawn(move || claim.want())
            };
            let mine = claim.claim(1_000, 500);
            let theirs = other.join().unwrap();
            wanting.join().unwrap();
            assert!(!(mine && theirs), "two claimants in one period");
            assert!(mine || theirs, "a due, wanted job was claimed by nobody");
            assert!(!claim.claim(1_200, 500), "not again within the period");
        });
    }
}
