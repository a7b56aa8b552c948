//! One randomized schedule: what it does (a [`Plan`] drawn from a seed) and
//! what every answer was (the [`Log`]).
//!
//! A plan is a spec, a fault rate and a list of operations per actor; actors
//! run side by side, each on one of the engines, each engine on its own
//! `Faulty` wrapper of the one shared store. The plan is a pure function of
//! the seed; the interleaving of the actors is not (it is real concurrency),
//! but the fault decisions are keyed by call count per step, so a seed
//! reproduces the same kinds of trouble.
//!
//! What came before holds is drawn first and as it always was, so a seed
//! found then still draws its purchases, cancels, reshards and closes; the
//! rest comes from a second generator of the same seed: whether the event
//! holds its purchases (half the schedules), confirms, expiry sweeps and
//! moves of the clock past deadlines put between those operations, a sale
//! window that ends mid-schedule (a quarter), and a reshard or close cut at
//! a named checkpoint (half of those that reshard or close). Whether the
//! ledger writes the outbox (order events) comes from a third generator of
//! the seed, so turning it on changed no earlier draw: half the schedules
//! run with it on, the others check that it stays empty. Whether the event
//! sells by access token (a third of the schedules), each user's allowance
//! and expiry and what each purchase carries ([`Carry`]) come from a fourth
//! generator, after everything else is drawn, for the same reason; half of
//! those events are draw events ([`DrawPlan`]), whose winners' tokens the
//! buyers carry. Half of the token events that are not draw events rotate
//! their keys mid-sale ([`Op::Rotate`]), and some purchases carry a token
//! of the rotation's new key ([`Carry::Rotated`]): from a sixth generator,
//! after everything else.

use std::time::Duration;

use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use shardstock::EngineOptions;
use shardstock::control::checkpoint::Checkpoint;
use shardstock::domain::draw::{DrawSpec, MIN_BUY_SECONDS};
use shardstock::domain::ids::EventId;
use shardstock::domain::model::EventSpec;
use shardstock::domain::token::{TokenAccess, mint};
use shardstock::store::Store;

use super::offers::{OFFER_SECONDS, OfferPlan};
use crate::harness::faulty::{Faulty, Mode, Rule, When};
use crate::harness::{event_id, spec};

/// Engines per schedule, and actors (tasks) over them.
pub const ENGINES: usize = 3;
const ACTORS: usize = 4;
/// Buyers per schedule: few, so per-user limits bite.
pub const USERS: usize = 12;

/// The keys of a token schedule's event: tokens are minted under either
/// (two, as while one is rotated).
const TOKEN_KEYS: [&str; 2] = ["fault-key-0123456789abcdef", "fault-key-fedcba9876543210"];
/// The key a rotation adds: the event's keys go from `TOKEN_KEYS` to
/// `[ROTATED_KEY, TOKEN_KEYS[0]]`, so the second key retires and the first
/// stays live throughout.
const ROTATED_KEY: &str = "fault-key-rotated-0a1b2c3d4e";
/// An expiry far in the future (unix seconds, 2100-01-01): past every
/// `Op::End` too.
const LATER: i64 = 4_102_444_800;

/// What a purchase of a token schedule carries.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Carry {
    /// The buyer's own token (its allowance may be spent: a reuse).
    Own,
    /// Another user's token.
    Theirs,
    /// A token signed with a key that is not the event's.
    Forged,
    /// A token whose expiry passed before the schedule began.
    Expired,
    /// No token at all.
    Missing,
    /// The buyer's own token (the same allowance and expiry, so the same
    /// token record), signed with the key a rotation adds: invalid until
    /// the rotation reaches the engine.
    Rotated,
}

/// Which of a token schedule's keys signed a token: whether a rotation
/// ([`Op::Rotate`]) makes it valid, invalid, or leaves it as it was.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum KeyFate {
    /// Valid before and after the rotation (`TOKEN_KEYS[0]`), or a token
    /// no key signs (forged) or none at all: the rotation changes nothing.
    Unchanged,
    /// `TOKEN_KEYS[1]`: valid until the rotation, invalid once every
    /// engine read it.
    Retired,
    /// [`ROTATED_KEY`]: invalid until the rotation, valid once every engine
    /// read it.
    Added,
}

/// A token schedule's tokens: each user's allowance and expiry.
#[derive(Debug, Clone)]
pub struct Tokens {
    /// Units each user's token may buy in all (1–3).
    pub allowance: Vec<u32>,
    /// Seconds after the schedule starts at which each user's token expires:
    /// about the k-th move of the clock past deadlines (`Op::Advance`), or
    /// never within the schedule (`None`: an `Op::End` passes neither).
    pub expires_after: Vec<Option<i64>>,
    /// The schedule's start (unix seconds), set when its clock starts (a
    /// draw schedule's: when it was drawn).
    pub start_s: i64,
    /// A draw schedule (the `draw` access mode): its entries and draw.
    pub draw: Option<DrawPlan>,
    /// A draw schedule's tokens, once drawn: each buyer's if it won.
    pub won: Option<Vec<Option<String>>>,
    /// The schedule rotates the event's keys ([`Op::Rotate`]).
    pub rotates: bool,
}

/// A draw schedule's entries and draw (`faults::draw`).
#[derive(Debug, Clone)]
pub struct DrawPlan {
    /// Entrants besides the buyers, who never buy: as many as the stock,
    /// so that about one buyer in four loses (winners = stock).
    pub crowd: usize,
    /// The step that fails in one of two draws run at once: its nth call,
    /// before or after it applied.
    pub fail: (&'static str, u64, When),
    /// Units a winner's token buys, and how long it lasts.
    pub allowance: u32,
    pub buy_seconds: u32,
}

/// One thing an actor does.
#[derive(Debug, Clone)]
pub enum Op {
    /// A new request; `crash`: the caller drops it after this long.
    Buy {
        user: usize,
        qty: u32,
        crash: Option<Duration>,
        /// What the purchase carries on a token schedule (else nothing).
        carry: Carry,
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
    /// Confirm an order its client was told of and may still pay (`pick`
    /// among them).
    Confirm {
        pick: usize,
        crash: Option<Duration>,
    },
    /// One expiry sweep (every due bucket, as the sweeper's tick does).
    Expire,
    /// The clock passes every deadline of the holds made so far.
    Advance,
    /// The clock passes the end of the sale window.
    End,
    /// A draw schedule's offer round (`faults::offers`): on the actor's
    /// engine, or on it and the next one at once.
    Offers {
        both: bool,
    },
    /// A draw schedule's waiting line reads its standings and claims.
    Claims,
    /// The clock passes the offer window (`offers::OFFER_SECONDS`).
    PassOffers,
    /// A token schedule's key rotation ([`Plan::rotated_keys`]) through the
    /// actor's engine, then every engine's refresh (`faults::tokens`).
    Rotate {
        crash: Option<Duration>,
    },
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
    /// A reshard or close cut at this checkpoint the nth time a run reaches
    /// it (once): the run stops as if its process died there.
    pub cut: Option<(Checkpoint, u32)>,
    /// The ledger writes the outbox (`Ledger::with_outbox`): every flush and
    /// close of the schedule (its release's too) writes its order changes.
    pub outbox: bool,
    /// The event sells by access token (`token` access mode): every
    /// purchase carries one ([`Op::Buy`]'s `carry`).
    pub tokens: Option<Tokens>,
    /// A draw schedule's offers: what the draw's losers do, from a fifth
    /// generator of the seed (`faults::offers`).
    pub offers: Option<OfferPlan>,
}

/// How far the sale window ends after the schedule starts: only [`Op::End`]
/// gets there (every [`Op::Advance`] together moves the clock minutes).
pub const WINDOW: Duration = Duration::from_secs(24 * 3600);

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
                            carry: Carry::Own,
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
        let fault_rate = rng.random_range(0.005..0.06);
        let max_delay = Duration::from_millis(rng.random_range(2..=20));
        let mut more = StdRng::seed_from_u64(seed ^ 0x401d_5eed);
        spec.hold_seconds = more.random_bool(0.5).then(|| more.random_range(1..=20));
        for ops in &mut actors {
            let extra = more.random_range(ops.len() / 8..=ops.len() / 4);
            for _ in 0..extra {
                let op = match more.random_range(0..100) {
                    0..60 => Op::Confirm {
                        pick: more.random_range(0..1000),
                        crash: crash(&mut more),
                    },
                    60..85 if spec.hold_seconds.is_some() => Op::Expire,
                    _ => Op::Advance,
                };
                let at = more.random_range(0..=ops.len());
                ops.insert(at, op);
            }
        }
        // A quarter of the schedules' sale windows end while they run;
        // retries of earlier request ids follow.
        if more.random_bool(0.25) {
            let actor = more.random_range(0..ACTORS);
            let len = actors[actor].len();
            let at = more.random_range(len / 3..=len * 2 / 3);
            actors[actor].insert(at, Op::End);
            for _ in 0..3 {
                let ops = &mut actors[more.random_range(0..ACTORS)];
                let at = more.random_range(ops.len() * 2 / 3..=ops.len());
                ops.insert(
                    at,
                    Op::Replay {
                        pick: more.random_range(0..1000),
                    },
                );
            }
        }
        let mut plan = Plan {
            seed,
            spec,
            fault_rate,
            max_delay,
            actors,
            cut: None,
            outbox: StdRng::seed_from_u64(seed ^ 0x0b0c_5eed).random_bool(0.5),
            tokens: None,
            offers: None,
        };
        let mut cuts = Vec::new();
        if plan.reshards() {
            cuts.extend(Checkpoint::reshard_steps());
            cuts.push(Checkpoint::PruneRetired);
        }
        if plan.closes() {
            cuts.extend([
                Checkpoint::CloseBegin,
                Checkpoint::CloseFenced,
                Checkpoint::CloseSealed,
                Checkpoint::CloseRetired,
                Checkpoint::CloseDrained,
            ]);
        }
        if !cuts.is_empty() && more.random_bool(0.5) {
            let at = cuts[more.random_range(0..cuts.len())];
            plan.cut = Some((at, more.random_range(1..=2)));
        }
        plan.draw_tokens();
        if plan.draws() {
            plan.offers = Some(OfferPlan::draw(seed, &mut plan.actors));
        }
        plan.draw_rotation();
        plan
    }

    /// A third of the schedules sell by token: the event gets keys, each
    /// user a token of 1–3 units (a third of them expiring about the 1st to
    /// 3rd move of the clock), and each purchase what it carries: mostly the
    /// buyer's own token, else another user's, a forged, an expired or none.
    fn draw_tokens(&mut self) {
        let mut rng = StdRng::seed_from_u64(self.seed ^ 0x70c3_5eed);
        if !rng.random_bool(1.0 / 3.0) {
            return;
        }
        self.spec.tokens = Some(TokenAccess {
            keys: TOKEN_KEYS.iter().map(|k| k.to_string()).collect(),
        });
        let advance = self.advance_by().as_secs() as i64;
        let tokens = Tokens {
            allowance: (0..USERS).map(|_| rng.random_range(1..=3)).collect(),
            expires_after: (0..USERS)
                .map(|_| {
                    rng.random_bool(1.0 / 3.0)
                        .then(|| advance * rng.random_range(1..=3) - 1)
                })
                .collect(),
            start_s: 0,
            draw: None,
            won: None,
            rotates: false,
        };
        for op in self.actors.iter_mut().flatten() {
            if let Op::Buy { carry, .. } = op {
                *carry = match rng.random_range(0..100) {
                    0..76 => Carry::Own,
                    76..82 => Carry::Theirs,
                    82..88 => Carry::Forged,
                    88..94 => Carry::Expired,
                    _ => Carry::Missing,
                };
            }
        }
        self.tokens = Some(tokens);
        // Half of those are draw events: the buyers' tokens are the draw's.
        if rng.random_bool(0.5) {
            let steps: [(&'static str, u64); 4] = [
                ("close_entries", 16),
                ("entries_page", 16),
                ("write_ranks", 16),
                ("finish_draw", 1),
            ];
            let (step, calls) = steps[rng.random_range(0..steps.len())];
            let when = if rng.random_bool(0.5) {
                When::Before
            } else {
                When::After
            };
            let d = DrawPlan {
                crowd: self.spec.stock as usize,
                fail: (step, rng.random_range(1..=calls), when),
                allowance: rng.random_range(1..=3),
                buy_seconds: MIN_BUY_SECONDS,
            };
            // The entry window's end is set when the schedule's clock starts.
            self.spec.draw = Some(
                DrawSpec::new(0, None, 1.0, d.allowance, d.buy_seconds, OFFER_SECONDS)
                    .expect("a draw spec"),
            );
            self.tokens.as_mut().expect("tokens").draw = Some(d);
        }
    }

    /// Half the token events that are not draw events rotate their keys
    /// once, at a third to two thirds of an actor's operations (the call
    /// dropped in some), and a quarter of the purchases that carried the
    /// buyer's own token carry it signed with the new key instead.
    fn draw_rotation(&mut self) {
        let mut rng = StdRng::seed_from_u64(self.seed ^ 0x6e75_5eed);
        let Some(tokens) = self.tokens.as_mut().filter(|t| t.draw.is_none()) else {
            return;
        };
        if !rng.random_bool(0.5) {
            return;
        }
        tokens.rotates = true;
        let actor = rng.random_range(0..self.actors.len());
        let len = self.actors[actor].len();
        let at = rng.random_range(len / 3..=len * 2 / 3);
        let crash = rng
            .random_bool(0.3)
            .then(|| Duration::from_millis(rng.random_range(0..10)));
        self.actors[actor].insert(at, Op::Rotate { crash });
        for op in self.actors.iter_mut().flatten() {
            if let Op::Buy { carry, .. } = op
                && *carry == Carry::Own
                && rng.random_bool(0.25)
            {
                *carry = Carry::Rotated;
            }
        }
    }

    /// The keys a rotation sets: the second key retired, a new one added.
    pub fn rotated_keys() -> TokenAccess {
        TokenAccess {
            keys: vec![ROTATED_KEY.to_string(), TOKEN_KEYS[0].to_string()],
        }
    }

    /// Which key signed what a purchase by user `user` carries, as a
    /// rotation sees it.
    pub fn key_fate(&self, user: usize, carry: Carry) -> KeyFate {
        let Some(t) = self.tokens.as_ref().filter(|t| t.rotates) else {
            return KeyFate::Unchanged;
        };
        let signer = match carry {
            Carry::Own => user,
            Carry::Theirs => (user + 1) % USERS,
            Carry::Rotated => return KeyFate::Added,
            Carry::Forged | Carry::Expired | Carry::Missing => return KeyFate::Unchanged,
        };
        if t.won.is_none() && signer % 2 == 1 {
            KeyFate::Retired
        } else {
            KeyFate::Unchanged
        }
    }

    /// Whether the event is a draw event.
    pub fn draws(&self) -> bool {
        self.tokens.as_ref().is_some_and(|t| t.draw.is_some())
    }

    /// The token a purchase by user `user` carries (`None` without one, or
    /// on an open event).
    pub fn token(&self, event: &EventId, user: usize, carry: Carry) -> Option<String> {
        let t = self.tokens.as_ref()?;
        match carry {
            Carry::Own => t.own(event, user),
            Carry::Theirs => t.own(event, (user + 1) % USERS),
            Carry::Forged => Some(mint(
                "not-this-events-key-00000",
                event,
                &user_name(user),
                3,
                LATER,
            )),
            Carry::Expired => Some(mint(TOKEN_KEYS[0], event, &user_name(user), 3, 1_000_000)),
            Carry::Missing => None,
            Carry::Rotated => t.signed(ROTATED_KEY, event, user),
        }
    }

    /// Whether the schedule reshards the event.
    pub fn reshards(&self) -> bool {
        self.actors
            .iter()
            .flatten()
            .any(|op| matches!(op, Op::Reshard { .. }))
    }

    /// Whether the schedule closes the sale: by hand, or by the leader of a
    /// rebalancer round once the window ended.
    pub fn closes(&self) -> bool {
        self.actors
            .iter()
            .flatten()
            .any(|op| matches!(op, Op::Close { .. } | Op::End))
    }

    /// Whether the sale window ends during the schedule.
    pub fn ends(&self) -> bool {
        self.actors.iter().flatten().any(|op| matches!(op, Op::End))
    }

    /// How far an [`Op::Advance`] moves the clock: past the deadline of
    /// every hold made so far.
    pub fn advance_by(&self) -> Duration {
        Duration::from_secs(u64::from(self.spec.hold_seconds.unwrap_or(1)) + 1)
    }

    /// The name of the schedule's user `i`.
    pub fn user(i: usize) -> String {
        user_name(i)
    }

    pub fn ops(&self) -> usize {
        self.actors.iter().map(Vec::len).sum()
    }

    /// A fresh buyer's own token (the settling's quiet phase): `allowance`
    /// units, no expiry within the schedule, signed with the key no
    /// rotation retires. `None` on an open event.
    pub fn quiet_token(&self, event: &EventId, user: &str, allowance: u32) -> Option<String> {
        self.tokens
            .as_ref()
            .map(|_| mint(TOKEN_KEYS[0], event, user, allowance, LATER))
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

fn user_name(i: usize) -> String {
    format!("u{i}")
}

impl Tokens {
    /// User `user`'s own token, signed with one of the two keys; on a draw
    /// event the one the draw gave, if it won.
    pub fn own(&self, event: &EventId, user: usize) -> Option<String> {
        if let Some(won) = &self.won {
            return won[user].clone();
        }
        self.signed(TOKEN_KEYS[user % 2], event, user)
    }

    /// User `user`'s own token (its allowance and expiry) signed with `key`.
    fn signed(&self, key: &str, event: &EventId, user: usize) -> Option<String> {
        let expiry = self.expires_after[user].map_or(LATER, |s| self.start_s + s);
        Some(mint(
            key,
            event,
            &user_name(user),
            self.allowance[user],
            expiry,
        ))
    }
}
