//! Traces drawn from the model: a seeded walk over the actions the model
//! enables, and the logical clock both the walk and the replay read.
//!
//! Every action of a trace changes the model's state (a refused step is not
//! drawn). Two kinds of action are left out where the real store needs a
//! clock the model does not keep: an expiry of one order while an earlier
//! deadline is live in the same bucket (the real sweep expires every hold
//! due by its `now`, earliest first), and a close drawn once the model's
//! budget of runs is spent (the model then flips the status without a run;
//! a real close always seizes the lease).

use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use shardstock_model::steps::Action;
use shardstock_model::{Bounds, Protocol, State, Variant};
use stateright::Model;

/// The time of the first action (2027), ms.
const START_MS: i64 = 1_800_000_000_000;
/// Time between two actions.
const TICK_MS: i64 = 1_000;
/// The event's `hold_seconds`, ms: longer than any trace, so a deadline
/// passes only when the model says so (`Action::Due`).
pub const HOLD_MS: i64 = 86_400_000;

/// The logical clock: action `n` happens at `START_MS + n * TICK_MS`, and a
/// request's pay-by deadline is its purchase's time plus the hold. Deadlines
/// are in purchase order, as the real fast path's hold queue expects.
#[derive(Debug, Clone, Default)]
pub struct Clock {
    /// Actions taken so far.
    pub step: usize,
    /// Per request, its pay-by deadline (set when its purchase is taken).
    pub pay_by: Vec<Option<i64>>,
}

impl Clock {
    pub fn new(requests: usize) -> Self {
        Clock {
            step: 0,
            pay_by: vec![None; requests],
        }
    }

    /// Now, for the action being taken.
    pub fn now(&self) -> i64 {
        START_MS + self.step as i64 * TICK_MS
    }

    /// Notes that `action` was taken (after it ran).
    pub fn taken(&mut self, action: Action) {
        if let Action::Purchase(r) = action {
            let pay_by = &mut self.pay_by[r as usize];
            pay_by.get_or_insert(START_MS + self.step as i64 * TICK_MS + HOLD_MS);
        }
        self.step += 1;
    }

    /// Request `r`'s deadline (its purchase was taken).
    pub fn deadline(&self, r: usize) -> i64 {
        self.pay_by[r].expect("a hold's purchase was taken")
    }
}

/// Whether the real store can replay `action` in `state` as the model
/// takes it (see the module docs).
pub fn replayable(state: &State, clock: &Clock, action: Action) -> bool {
    match action {
        Action::Expire(b, o) => {
            let bucket = &state.buckets[b as usize];
            let mine = clock.deadline(o as usize);
            (0..bucket.holds.len())
                .filter(|&other| other != o as usize && bucket.holds[other])
                .all(|other| clock.deadline(other) > mine)
        }
        Action::StartClose(_) => state.starts_left > 0,
        _ => true,
    }
}

/// A walk of at most `steps` actions from the initial state, each drawn
/// uniformly from those that change the state, from `seed`. A close may
/// start only after a number of actions drawn for the trace: drawn as soon
/// as it is enabled, it would end nearly every trace before a reshard
/// switched.
pub fn draw(seed: u64, bounds: Bounds, steps: usize) -> Vec<Action> {
    let model = Protocol::new(bounds, Variant::FIXED);
    let mut rng = StdRng::seed_from_u64(seed);
    let close_after = rng.random_range(0..steps);
    let mut state = model.init_states().remove(0);
    let mut clock = Clock::new(bounds.requests());
    let mut trace = Vec::with_capacity(steps);
    let mut candidates = Vec::new();
    while trace.len() < steps {
        candidates.clear();
        model.actions(&state, &mut candidates);
        let enabled: Vec<(Action, State)> = candidates
            .iter()
            .filter(|&&a| replayable(&state, &clock, a))
            .filter(|a| trace.len() >= close_after || !matches!(a, Action::StartClose(_)))
            .filter_map(|&a| model.next_state(&state, a).map(|next| (a, next)))
            .collect();
        if enabled.is_empty() {
            break;
        }
        let (action, next) = enabled[rng.random_range(0..enabled.len())].clone();
        clock.taken(action);
        trace.push(action);
        state = next;
    }
    trace
}
