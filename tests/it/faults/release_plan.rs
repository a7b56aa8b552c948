//! The release's part of a fault schedule (`releases`): what it sells and
//! what its buyers, its reshard and its close do, drawn from a generator of
//! its own (the seed's other draws are as they were; holds, in a share of
//! them, are drawn from another, `release_holds`), and the book of what the
//! buyers sent and were answered.

use std::collections::HashMap;
use std::time::Duration;

use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use shardstock::EngineError;
use shardstock::domain::ids::{EventId, RequestId};
use shardstock::domain::release::{PoolSpec, ReleaseSpec};
use shardstock::engine::{LinesOutcome, LinesRefusal, LinesRequest};

use super::release_holds::HoldPlan;
use crate::harness::{event_id, user};

/// Users of the release's buyers (`ru0`, …).
pub const USERS: usize = 6;

/// One buyer's step.
#[derive(Debug, Clone)]
pub enum Buy {
    /// A new request of `(pool, quantity)` lines; dropped after `crash`.
    New {
        user: usize,
        lines: Vec<(usize, u32)>,
        crash: Option<Duration>,
    },
    /// An earlier request again (`pick` among them).
    Replay { pick: usize },
}

/// The release's part of a schedule.
#[derive(Debug, Clone)]
pub struct ReleasePlan {
    pub spec: ReleaseSpec,
    pub buyers: [Vec<Buy>; 2],
    /// The pool resharded, to this many buckets, after this long.
    pub reshard: (usize, u32, Duration),
    /// The pool closed after this long; cut right after it sealed (else
    /// dropped after the duration's tenth).
    pub close: (usize, Duration, bool),
    /// The release holds its orders.
    pub holds: Option<HoldPlan>,
}

impl ReleasePlan {
    /// Half the schedules sell a release too.
    pub fn draw(seed: u64) -> Option<Self> {
        let mut rng = StdRng::seed_from_u64(seed ^ 0x7e1e_a5e5);
        if !rng.random_bool(0.5) {
            return None;
        }
        let pools = rng.random_range(2..=3);
        let mut spec = ReleaseSpec {
            id: event_id("frel"),
            pools: (0..pools)
                .map(|k| PoolSpec {
                    name: EventId::parse(format!("p{k}")).unwrap(),
                    stock: rng.random_range(6..=14),
                    buckets: rng.random_range(2..=4),
                    auto_buckets: None,
                })
                .collect(),
            per_user_limit: rng.random_bool(0.5).then(|| rng.random_range(3..=6)),
            max_per_order: 3,
            starts_at: None,
            ends_at: None,
            hold_seconds: None,
            homes: 4,
        };
        let buyer = |rng: &mut StdRng| {
            (0..rng.random_range(8..=14))
                .map(|_| {
                    if rng.random_bool(0.2) {
                        return Buy::Replay {
                            pick: rng.random_range(0..1000),
                        };
                    }
                    let n = rng.random_range(1..=pools);
                    let mut lines: Vec<(usize, u32)> = Vec::new();
                    while lines.len() < n {
                        let k = rng.random_range(0..pools);
                        if lines.iter().all(|l| l.0 != k) {
                            lines.push((k, 1));
                        }
                    }
                    if n < 3 && rng.random_bool(0.4) {
                        lines[0].1 = 2;
                    }
                    Buy::New {
                        user: rng.random_range(0..USERS),
                        lines,
                        crash: rng
                            .random_bool(0.2)
                            .then(|| Duration::from_millis(rng.random_range(0..20))),
                    }
                })
                .collect::<Vec<_>>()
        };
        let buyers = [buyer(&mut rng), buyer(&mut rng)];
        let reshard = (
            rng.random_range(0..pools),
            rng.random_range(1..=5),
            Duration::from_millis(rng.random_range(0..60)),
        );
        let close = (
            rng.random_range(0..pools),
            Duration::from_millis(rng.random_range(20..120)),
            rng.random_bool(0.5),
        );
        let holds = HoldPlan::draw(seed, [buyers[0].len(), buyers[1].len()]);
        spec.hold_seconds = holds.as_ref().map(|h| h.seconds);
        Some(Self {
            spec,
            buyers,
            reshard,
            close,
            holds,
        })
    }

    pub fn pool(&self, k: usize) -> EventId {
        self.spec.pool_event(k).unwrap()
    }

    pub fn request(&self, u: usize, rid: &str, lines: &[(usize, u32)]) -> LinesRequest {
        LinesRequest {
            release: self.spec.id.clone(),
            user: user(format!("ru{u}")),
            lines: lines
                .iter()
                .map(|&(k, q)| (self.spec.pools[k].name.clone(), q))
                .collect(),
            request_id: Some(RequestId::parse(rid).unwrap()),
        }
    }
}

/// A request sent: user, request id, `(pool, quantity)` lines.
pub type Sent = (usize, String, Vec<(usize, u32)>);

/// Every request sent, and the first final answer of each.
#[derive(Default)]
pub struct Book {
    pub sent: Vec<Sent>,
    pub finals: HashMap<String, LinesOutcome>,
    pub changed: Vec<String>,
    pub tally: HashMap<String, u32>,
}

impl Book {
    /// The requests told bought: user, request id, order id.
    pub fn bought(&self) -> Vec<(usize, String, String)> {
        let order = |rid: &String| match self.finals.get(rid).map(|o| &o.result) {
            Some(Ok(o)) => Some(o.order_id.to_string()),
            _ => None,
        };
        self.sent
            .iter()
            .filter_map(|(u, rid, _)| Some((*u, rid.clone(), order(rid)?)))
            .collect()
    }

    pub fn note(&mut self, rid: &str, out: &LinesOutcome) {
        match self.finals.get(rid) {
            Some(first) if !same(&first.result, &out.result) => self
                .changed
                .push(format!("request {rid}: first {first:?}, then {out:?}")),
            Some(_) => {}
            None => {
                self.finals.insert(rid.to_owned(), out.clone());
            }
        }
    }
}

fn same(
    a: &Result<shardstock::engine::ReleaseOrder, LinesRefusal>,
    b: &Result<shardstock::engine::ReleaseOrder, LinesRefusal>,
) -> bool {
    match (a, b) {
        // A limit refusal replays with the user's count now.
        (
            Err(LinesRefusal::LimitExceeded { limit: x, .. }),
            Err(LinesRefusal::LimitExceeded { limit: y, .. }),
        ) => x == y,
        // A held order's status moves on: the same order and lines.
        (Ok(a), Ok(b)) => a.order_id == b.order_id && a.lines == b.lines,
        (a, b) => a == b,
    }
}

/// A short name of an error, for the tally.
pub fn kind(e: &EngineError) -> &'static str {
    match e {
        EngineError::OutcomeUnknown(why) if why.contains("stale") => "unknown (stale)",
        EngineError::OutcomeUnknown(why) if why.contains("injected") => "unknown (injected)",
        EngineError::OutcomeUnknown(_) => "unknown",
        EngineError::Store(_) => "store",
        EngineError::NotOnSale { .. } => "not on sale",
        EngineError::Contention { .. } => "contention",
        _ => "other",
    }
}
