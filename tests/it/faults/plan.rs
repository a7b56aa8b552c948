//! One randomized schedule: what it does (a [`Plan`] drawn from a seed) and
//! what every answer was (the [`Log`]).
//!
//! A plan is a spec, a fault rate and a list of operations per actor; actors
//! run side by side, each on one of the engines, each engine on its own
//! `Faulty` wrapper of the one shared store. The plan is a pure function of
//! the seed; the interleaving of the actors is not (it is real concurrency),
//! but the fault decisions are keyed by call count per step, so a seed
//! reproduces the same kinds of trouble.

use std::time::Duration;

use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use shardstock::EngineOptions;
use shardstock::domain::model::EventSpec;
use shardstock::store::Store;

use crate::harness::faulty::{Faulty, Mode, Rule};
use crate::harness::{event_id, spec};

/// Engines per schedule, and actors (tasks) over them.
pub const ENGINES: usize = 3;
const ACTORS: usize = 4;
/// Buyers per schedule: few, so per-user limits bite.
const USERS: usize = 12;

/// One thing an actor does.
#[derive(Debug, Clone)]
pub enum Op {
    /// A new request; `crash`: the caller drops it after this long.
    Buy {
        user: usize,
        qty: u32,
        crash: Option<Duration>,
    },
    /// The same request id again, of a request answered before (`pick` among them).
    Replay {
        pick: usize,
    },
    /// Cancel a bought order (`pick` among them).
    Cancel {
        pick: usize,
        crash: Option<Duration>,
    },
    /// The rebalancer's mover by hand: lease, take over, one transfer.
    Transfer {
        from: u32,
        to: u32,
        units: u64,
    },
    /// One round of the engine's rebalancer: leadership, a round of moves,
    /// or the resumption of a stalled reshard.
    Rebalance,
    Reshard {
        buckets: u32,
    },
    Close {
        crash: Option<Duration>,
    },
    Flush,
}

/// A schedule, drawn from its seed.
#[derive(Debug, Clone)]
pub struct Plan {
    pub seed: u64,
    pub spec: EventSpec,
    /// Of each store step, in every engine.
    pub fault_rate: f64,
    pub max_delay: Duration,
    pub actors: Vec<Vec<Op>>,
}

impl Plan {
    pub fn draw(seed: u64) -> Self {
        let mut rng = StdRng::seed_from_u64(seed);
        let id = event_id("fault");
        let mut spec = spec(&id, rng.random_range(20..=60), rng.random_range(2..=8));
        spec.max_per_order = 3;
        spec.per_user_limit = rng.random_bool(2.0 / 3.0).then(|| rng.random_range(2..=5));
        let crash = |rng: &mut StdRng| {
            rng.random_bool(0.15)
                .then(|| Duration::from_millis(rng.random_range(0..25)))
        };
        // Half the schedules reshard (a reshard is many steps: under faults
        // it often stops half way and the event waits for its resumption).
        let reshards = rng.random_bool(0.5);
        let mut actors: Vec<Vec<Op>> = (0..ACTORS)
            .map(|_| {
                (0..rng.random_range(15..=30))
                    .map(|_| match rng.random_range(0..100) {
                        0..50 => Op::Buy {
                            user: rng.random_range(0..USERS),
                            qty: rng.random_range(1..=3),
                            crash: crash(&mut rng),
                        },
                        50..64 => Op::Replay {
                            pick: rng.random_range(0..1000),
                        },
                        64..76 => Op::Cancel {
                            pick: rng.random_range(0..1000),
                            crash: crash(&mut rng),
                        },
                        76..82 => Op::Transfer {
                            from: rng.random_range(0..8),
                            to: rng.random_range(0..8),
                            units: rng.random_range(1..=6),
                        },
                        82..89 => Op::Rebalance,
                        89..92 if reshards => Op::Reshard {
                            buckets: rng.random_range(1..=8),
                        },
                        _ => Op::Flush,
                    })
                    .collect()
            })
            .collect();
        // A quarter of the schedules close the sale while it runs.
        if rng.random_bool(0.25) {
            let actor = rng.random_range(0..ACTORS);
            let at = rng.random_range(actors[actor].len() / 2..=actors[actor].len());
            let crash = crash(&mut rng);
            actors[actor].insert(at, Op::Close { crash });
        }
        Plan {
            seed,
            spec,
            fault_rate: rng.random_range(0.005..0.06),
            max_delay: Duration::from_millis(rng.random_range(2..=20)),
            actors,
        }
    }

    /// Whether the schedule reshards the event.
    pub fn reshards(&self) -> bool {
        self.actors
            .iter()
            .flatten()
            .any(|op| matches!(op, Op::Reshard { .. }))
    }

    pub fn ops(&self) -> usize {
        self.actors.iter().map(Vec::len).sum()
    }

    /// The options of engine `i`: batched and not, short waits (a schedule
    /// must not wait 5 s for a reshard its own fault stalled).
    pub fn engine_options(i: usize) -> EngineOptions {
        EngineOptions {
            max_batch: i.is_multiple_of(2).then_some(8),
            reshard_wait: Duration::from_millis(300),
            gather_wait: Duration::from_millis(200),
            ..EngineOptions::default()
        }
    }

    /// The rule every engine's wrapper follows. `release_lease` is spared: a
    /// lease that is never given back only expires after its TTL (30 s for a
    /// reshard), which shows nothing new and would make schedules wait.
    pub fn rules<S: Store>(&self, faulty: &Faulty<S>) {
        faulty.everywhere(Rule {
            probability: self.fault_rate,
            mode: Mode::Any {
                max_delay: self.max_delay,
            },
        });
        faulty.rule(
            "release_lease",
            Rule {
                probability: 0.0,
                mode: Mode::Any {
                    max_delay: self.max_delay,
                },
            },
        );
    }
}
