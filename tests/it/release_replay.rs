//! The release model, tied to the store: seeded random traces of
//! `shardstock_model::release`'s actions (and its fixed trace) replayed on
//! the store's release steps on memory, standalone Redis and the Cluster,
//! each step's reply checked against the model's transition and the store
//! compared with the model after every action.
//!
//! | model action | store step |
//! |---|---|
//! | `Reserve(r)` | `reserve` at the user's home (units 2, the model's limit) |
//! | `Take(r, k)` | `take_line` at each bucket of the ring from the user's home to the first the model's walk does not pass (each passed one answering short), pass 1 |
//! | `Commit(r)` / `Abort(r)` | `commit_order` (with holds `hold_order`, pending → held open) / `abort_order`, pending → bought / refused |
//! | `Undo(r, k)` | `undo_line` at the first bucket the walk does not pass |
//! | `Release(r)` | `release_order`, refused → released |
//! | `Confirm(r)` / `Cancel(r)` / `Expire(r)` | `move_hold`, open → confirming / cancelling / expiring |
//! | `ConfirmLine(r, k)` | `confirm_line` at the bucket of the line's take |
//! | `GiveBack(r, k)` | `give_back_line` (a cancel or expiry record) at that bucket |
//! | `End(r)` | `move_hold` confirming → confirmed, or `release_order` cancelling / expiring → cancelled / expired |
//!
//! Compared after every action: each bucket's stock, each user's count,
//! each order's record, and each line's take, void, confirm and give-back
//! records in its pool's streams. The model's pools are buckets of made-up
//! events made with `init_bucket` (each bucket's units the model's), homes
//! one a user. Only actions that change the model's state are drawn: the
//! store's replays of a step are the engine's to show.

use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use shardstock::domain::ids::{EventId, OrderId, UserId};
use shardstock::domain::keys::{BucketRef, HomeRef};
use shardstock::domain::release::{HoldState, HomeRecord, Line, OrderHead, line_order_id};
use shardstock::domain::stream::RecordKind;
use shardstock::store::{
    Decided, LineConfirm, LineTake, LineUndo, ReserveArgs, ReserveReply, TakeArgs,
};
use shardstock::{Engine, Store};
use shardstock_model::release::state::{Hold, Marker, Rec};
use shardstock_model::release::steps::{finish_stop, stop};
use shardstock_model::release::{Action, Bounds, POOLS, Release, State, Variant};
use stateright::Model;

use crate::harness::{event_id, on_every_backend};

const BOUNDS: Bounds = Bounds::LARGE;
const STEPS: usize = 40;
/// A held order's deadline (the model has no clock: any open hold may
/// expire, which is the sweeper's decision to take, not the store's).
const PAY_BY: i64 = 60_000;

/// One trace's store objects.
struct Replay<'a, S: Store> {
    store: &'a S,
    model: Release,
    release: EventId,
    pools: Vec<EventId>,
    /// Records read from each pool bucket's stream so far: (kind, order id).
    records: Vec<(RecordKind, String)>,
}

impl<S: Store> Replay<'_, S> {
    fn bucket(&self, k: usize, j: usize) -> BucketRef {
        BucketRef::new(&self.pools[k], 0, j as u32)
    }

    fn user(&self, r: usize) -> (usize, UserId) {
        let u = self.model.bounds.user(r);
        (u, UserId::parse(format!("u{u}")).unwrap())
    }

    fn home(&self, r: usize) -> HomeRef {
        HomeRef::new(&self.release, self.user(r).0 as u32)
    }

    fn head(&self, r: usize) -> OrderHead {
        OrderHead {
            order_id: OrderId::from_stored(&format!(
                "{}.{:016x}.{:016x}",
                self.release,
                self.user(r).0,
                r
            )),
            user: self.user(r).1,
            at_ms: 0,
            lines: (0..POOLS as u32)
                .map(|pool| Line { pool, qty: 1 })
                .collect(),
        }
    }

    fn take_args(&self, r: usize, k: usize) -> TakeArgs {
        let (u, user) = self.user(r);
        TakeArgs {
            rid: format!("{}/r{r}", self.release),
            pass: 1,
            user,
            qty: 1,
            order_id: line_order_id(&self.head(r).order_id, &self.release, &self.pools[k]),
            home: (u % self.model.bounds.buckets[k] as usize) as u32,
            marker_ttl_ms: 3_600_000,
            pay_by: self.model.bounds.holds.then_some(PAY_BY),
            keep_taken: self.model.bounds.holds,
        }
    }

    fn held(&self, r: usize, state: HoldState) -> HomeRecord {
        HomeRecord::Held(self.head(r), PAY_BY, state)
    }

    /// The store's hold state of the model's.
    fn hold_state(hold: Hold) -> HoldState {
        match hold {
            Hold::Open => HoldState::Open,
            Hold::Confirming => HoldState::Confirming,
            Hold::Cancelling => HoldState::Cancelling,
            Hold::Expiring => HoldState::Expiring,
        }
    }

    /// Takes `a` on the store; `before` is the model's state before it.
    async fn apply(&mut self, before: &State, a: Action) -> Result<(), String> {
        let store = self.store;
        let rid = |r: u8| format!("r{r}");
        let pending = |r: u8| HomeRecord::Pending(self.head(r as usize));
        let refused = |r: u8| HomeRecord::Refused(self.head(r as usize), Vec::new());
        let err = |e: shardstock::StoreError| e.to_string();
        match a {
            Action::Reserve(r) => {
                let head = self.head(r as usize);
                let args = ReserveArgs {
                    rid: rid(r),
                    user: head.user.clone(),
                    units: head.units(),
                    limit: u32::from(self.model.bounds.limit),
                    pending: pending(r),
                    limited: HomeRecord::Limit {
                        units: head.units(),
                        limit: u32::from(self.model.bounds.limit),
                    },
                };
                let reply = store
                    .reserve(&self.home(r as usize), 0, &args)
                    .await
                    .map_err(err)?;
                let ok = match before.reqs[r as usize] {
                    Rec::None => {
                        matches!(reply, ReserveReply::Reserved | ReserveReply::Limit { .. })
                    }
                    _ => matches!(reply, ReserveReply::Replay { .. }),
                };
                ok.then_some(())
                    .ok_or(format!("reserve answered {reply:?}"))
            }
            Action::Take(r, k) => {
                let (r, k) = (r as usize, k as usize);
                let j = stop(&self.model, before, r, k, self.model.variant)
                    .ok_or("a take with no bucket")?;
                // The walk from the user's home: every bucket the model's
                // walk passes must answer short on the store too.
                for passed in self.model.bounds.ring(k, self.user(r).0) {
                    let reply = store
                        .take_line(&self.bucket(k, passed), 0, &self.take_args(r, k))
                        .await
                        .map_err(err)?;
                    if passed == j {
                        let want_taken = before.pools[k][j].stock >= 1;
                        return match (&reply, want_taken) {
                            (LineTake::Taken { .. }, true) | (LineTake::Short { .. }, false) => {
                                Ok(())
                            }
                            _ => Err(format!("take at {k}/{j} answered {reply:?}")),
                        };
                    }
                    if !matches!(reply, LineTake::Short { .. }) {
                        return Err(format!("take at {k}/{passed}, passed, answered {reply:?}"));
                    }
                }
                Err(format!("the walk of {r}/{k} never reached bucket {j}"))
            }
            Action::Commit(r) if self.model.bounds.holds => {
                let open = self.held(r as usize, HoldState::Open);
                let order_id = self.head(r as usize).order_id;
                let reply = store
                    .hold_order(
                        &self.home(r as usize),
                        &rid(r),
                        &pending(r),
                        &open,
                        &order_id,
                    )
                    .await
                    .map_err(err)?;
                (reply == Decided::Done)
                    .then_some(())
                    .ok_or(format!("hold answered {reply:?}"))
            }
            Action::Commit(r) => {
                let bought = HomeRecord::Bought(self.head(r as usize));
                let reply = store
                    .commit_order(&self.home(r as usize), &rid(r), &pending(r), &bought)
                    .await
                    .map_err(err)?;
                (reply == Decided::Done)
                    .then_some(())
                    .ok_or(format!("commit answered {reply:?}"))
            }
            Action::Abort(r) => {
                let reply = store
                    .abort_order(&self.home(r as usize), &rid(r), &pending(r), &refused(r))
                    .await
                    .map_err(err)?;
                (reply == Decided::Done)
                    .then_some(())
                    .ok_or(format!("abort answered {reply:?}"))
            }
            Action::Undo(r, k) => {
                let (r, k) = (r as usize, k as usize);
                let j = stop(&self.model, before, r, k, Variant::DESIGNED)
                    .ok_or("an undo with no bucket")?;
                let reply = store
                    .undo_line(&self.bucket(k, j), 0, &self.take_args(r, k))
                    .await
                    .map_err(err)?;
                let want = match before.pools[k][j].markers[r] {
                    Marker::Taken => LineUndo::GaveBack,
                    _ => LineUndo::Closed,
                };
                (reply == want)
                    .then_some(())
                    .ok_or(format!("undo at {k}/{j} answered {reply:?}"))
            }
            Action::Release(r) => {
                let head = self.head(r as usize);
                let released = HomeRecord::Released(head.clone(), Vec::new());
                let reply = store
                    .release_order(
                        &self.home(r as usize),
                        &rid(r),
                        &head.user,
                        head.units(),
                        &refused(r),
                        &released,
                    )
                    .await
                    .map_err(err)?;
                (reply == Decided::Done)
                    .then_some(())
                    .ok_or(format!("release answered {reply:?}"))
            }
            Action::Confirm(r) | Action::Cancel(r) | Action::Expire(r) => {
                let next = match a {
                    Action::Confirm(_) => HoldState::Confirming,
                    Action::Cancel(_) => HoldState::Cancelling,
                    _ => HoldState::Expiring,
                };
                let r = r as usize;
                let reply = store
                    .move_hold(
                        &self.home(r),
                        &rid(r as u8),
                        &self.held(r, HoldState::Open),
                        &self.held(r, next),
                        false,
                    )
                    .await
                    .map_err(err)?;
                (reply == Decided::Done)
                    .then_some(())
                    .ok_or(format!("move_hold to {next:?} answered {reply:?}"))
            }
            Action::ConfirmLine(r, k) => {
                let (r, k) = (r as usize, k as usize);
                let j = finish_stop(&self.model, before, r, k, Marker::Confirmed)
                    .ok_or("a confirm with no take")?;
                let reply = store
                    .confirm_line(&self.bucket(k, j), 0, &self.take_args(r, k))
                    .await
                    .map_err(err)?;
                (reply == LineConfirm::Confirmed)
                    .then_some(())
                    .ok_or(format!("confirm at {k}/{j} answered {reply:?}"))
            }
            Action::GiveBack(r, k) => {
                let (r, k) = (r as usize, k as usize);
                let kind = match before.reqs[r] {
                    Rec::Held(Hold::Cancelling) => RecordKind::Cancel,
                    _ => RecordKind::Expire,
                };
                let j = finish_stop(&self.model, before, r, k, Marker::Undone)
                    .ok_or("a give-back with no take")?;
                let reply = store
                    .give_back_line(&self.bucket(k, j), 0, &self.take_args(r, k), kind)
                    .await
                    .map_err(err)?;
                (reply == LineUndo::GaveBack)
                    .then_some(())
                    .ok_or(format!("give-back at {k}/{j} answered {reply:?}"))
            }
            Action::End(r) => {
                let r = r as usize;
                let Rec::Held(hold) = before.reqs[r] else {
                    return Err(format!("order {r} ended from {:?}", before.reqs[r]));
                };
                let state = Self::hold_state(hold);
                let (current, ended) = (self.held(r, state), self.held(r, state.ended()));
                let head = self.head(r);
                let reply = if hold == Hold::Confirming {
                    store
                        .move_hold(&self.home(r), &rid(r as u8), &current, &ended, true)
                        .await
                } else {
                    store
                        .release_order(
                            &self.home(r),
                            &rid(r as u8),
                            &head.user,
                            head.units(),
                            &current,
                            &ended,
                        )
                        .await
                }
                .map_err(err)?;
                (reply == Decided::Done)
                    .then_some(())
                    .ok_or(format!("end of {hold:?} answered {reply:?}"))
            }
        }
    }

    /// The store against the model's state.
    async fn compare(&mut self, s: &State) -> Result<(), String> {
        let mut problems = Vec::new();
        for k in 0..POOLS {
            for j in 0..self.model.bounds.buckets[k] as usize {
                let bucket = self.bucket(k, j);
                let stock = self
                    .store
                    .bucket_state(&bucket)
                    .await
                    .map_err(|e| e.to_string())?
                    .stock;
                if stock != u64::from(s.pools[k][j].stock) {
                    problems.push(format!(
                        "pool {k} bucket {j}: stock {stock}, model {}",
                        s.pools[k][j].stock
                    ));
                }
                for e in self
                    .store
                    .stream_read(&bucket, "replay", 1_000, None)
                    .await
                    .map_err(|e| e.to_string())?
                {
                    self.records.push((e.kind, e.order_id));
                }
            }
        }
        for (u, &units) in s.users.iter().enumerate() {
            let user = UserId::parse(format!("u{u}")).unwrap();
            let held = self
                .store
                .home_units(&HomeRef::new(&self.release, u as u32), &user)
                .await
                .map_err(|e| e.to_string())?;
            if held != u64::from(units) {
                problems.push(format!("user {u}: count {held}, model {units}"));
            }
        }
        for (r, rec) in s.reqs.iter().enumerate() {
            let found = self
                .store
                .home_record(&self.home(r), &format!("r{r}"))
                .await
                .map_err(|e| e.to_string())?;
            let kind = match found {
                None => Rec::None,
                Some(HomeRecord::Pending(_)) => Rec::Pending,
                Some(HomeRecord::Bought(_)) => Rec::Bought,
                Some(HomeRecord::Refused(..)) => Rec::Refused,
                Some(HomeRecord::Released(..)) => Rec::Released,
                Some(HomeRecord::Limit { .. }) => Rec::Limit,
                Some(HomeRecord::Held(_, _, state)) => match state {
                    HoldState::Open => Rec::Held(Hold::Open),
                    HoldState::Confirming => Rec::Held(Hold::Confirming),
                    HoldState::Cancelling => Rec::Held(Hold::Cancelling),
                    HoldState::Expiring => Rec::Held(Hold::Expiring),
                    HoldState::Confirmed => Rec::Confirmed,
                    HoldState::Cancelled => Rec::Cancelled,
                    HoldState::Expired => Rec::Expired,
                },
            };
            if kind != *rec {
                problems.push(format!("order {r}: record {kind:?}, model {rec:?}"));
            }
            for k in 0..POOLS {
                let oid = self.take_args(r, k).order_id.to_string();
                let count = |kind| {
                    self.records
                        .iter()
                        .filter(|(k, o)| *k == kind && *o == oid)
                        .count()
                };
                let (t, v) = (count(RecordKind::Order), count(RecordKind::Void));
                let (c, g) = (
                    count(RecordKind::Confirm),
                    count(RecordKind::Cancel) + count(RecordKind::Expire),
                );
                let line = s.lines[r][k];
                let model = [line.t, line.v, line.c, line.g].map(usize::from);
                if [t, v, c, g] != model {
                    problems.push(format!(
                        "order {r} line {k}: {t} takes {v} voids {c} confirms \
                         {g} give-backs, model {line:?}"
                    ));
                }
            }
        }
        if problems.is_empty() {
            Ok(())
        } else {
            Err(problems.join("; "))
        }
    }
}

/// A random trace of actions that change the model's state.
fn draw(model: &Release, seed: u64) -> Vec<Action> {
    let mut rng = StdRng::seed_from_u64(seed);
    let mut state = model.init_states().remove(0);
    let mut trace = Vec::new();
    for _ in 0..STEPS {
        let mut actions = Vec::new();
        model.actions(&state, &mut actions);
        let live: Vec<(Action, State)> = actions
            .into_iter()
            .filter_map(|a| model.next_state(&state, a).map(|n| (a, n)))
            .collect();
        if live.is_empty() {
            break;
        }
        let (a, next) = live[rng.random_range(0..live.len())].clone();
        trace.push(a);
        state = next;
    }
    trace
}

async fn replay<'a, S: Store>(
    store: &'a S,
    model: &Release,
    trace: &[Action],
) -> Result<Replay<'a, S>, String> {
    let release = event_id("rr");
    let pools: Vec<EventId> = (0..POOLS)
        .map(|k| EventId::parse(format!("{release}.p{k}")).unwrap())
        .collect();
    let mut state = model.init_states().remove(0);
    let mut r = Replay {
        store,
        model: model.clone(),
        release,
        pools,
        records: Vec::new(),
    };
    for k in 0..POOLS {
        for j in 0..model.bounds.buckets[k] as usize {
            let stock = u64::from(state.pools[k][j].stock);
            store
                .init_bucket(&r.bucket(k, j), stock)
                .await
                .map_err(|e| e.to_string())?;
        }
    }
    for (i, &a) in trace.iter().enumerate() {
        let Some(next) = model.next_state(&state, a) else {
            return Err(format!("step {i} {a:?} changes nothing in the model"));
        };
        r.apply(&state, a)
            .await
            .map_err(|e| format!("step {i} {a:?}: {e}"))?;
        state = next;
        r.compare(&state)
            .await
            .map_err(|e| format!("after step {i} {a:?}: {e}"))?;
    }
    Ok(r)
}

/// Replays seeded random traces of the designed model at `bounds`.
async fn traces_match<S: Store>(engine: Engine<S>, bounds: Bounds) {
    let traces: u64 = std::env::var("SHARDSTOCK_RELEASE_TRACES")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(if engine.store().kind() == "memory" {
            200
        } else {
            25
        });
    let first: u64 = std::env::var("SHARDSTOCK_RELEASE_SEED")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(1);
    let model = Release::new(bounds, Variant::DESIGNED);
    let mut parted = Vec::new();
    let mut steps = 0;
    for seed in first..first + traces {
        let trace = draw(&model, seed);
        steps += trace.len();
        if let Err(e) = replay(engine.store(), &model, &trace).await {
            println!("seed {seed}: {e}\nthe trace: {trace:?}\n");
            parted.push(seed);
        }
    }
    println!("{traces} traces, {steps} steps replayed");
    assert!(
        parted.is_empty(),
        "traces parted from the model: seeds {parted:?}"
    );
}

async fn release_traces_match_the_model<S: Store>(engine: Engine<S>) {
    traces_match(engine, BOUNDS).await;
}

/// A release with holds: orders held, confirmed, cancelled and expired,
/// with late walks of their lines.
async fn held_release_traces_match_the_model<S: Store>(engine: Engine<S>) {
    traces_match(engine, Bounds::HOLDS).await;
}

/// The replay tells a broken protocol from the built one: traces of the
/// variant that releases the reservation with the abort part from the store
/// (whose abort keeps it counted until every line is closed).
async fn a_variant_that_releases_at_the_abort_parts_from_the_store<S: Store>(engine: Engine<S>) {
    let model = Release::new(BOUNDS, Variant::RELEASE_AT_DECISION);
    let mut parted = 0;
    for seed in 1..=20 {
        let trace = draw(&model, seed);
        if replay(engine.store(), &model, &trace).await.is_err() {
            parted += 1;
        }
    }
    assert!(
        parted > 0,
        "no trace of the broken variant parted from the store"
    );
}

/// The model's fixed trace: a late driver takes both lines of an order the
/// sweeper aborted; as designed, its undo closes or gives back each line,
/// and the commit has nothing to do (the record is refused).
async fn the_unchecked_commit_trace_leaves_the_commit_nothing_to_do<S: Store>(engine: Engine<S>) {
    let model = Release::new(BOUNDS, Variant::DESIGNED);
    let (last, before) = shardstock_model::traces::UNCHECKED_COMMIT
        .split_last()
        .expect("a trace");
    assert_eq!(*last, Action::Commit(0));
    let r = replay(engine.store(), &model, before).await.unwrap();
    let mut state = model.init_states().remove(0);
    for &a in before {
        state = model
            .next_state(&state, a)
            .expect("each step of the trace applies");
    }
    assert!(model.next_state(&state, Action::Commit(0)).is_none());
    let bought = HomeRecord::Bought(r.head(0));
    let reply = engine
        .store()
        .commit_order(&r.home(0), "r0", &HomeRecord::Pending(r.head(0)), &bought)
        .await
        .unwrap();
    assert!(
        matches!(reply, Decided::Found(HomeRecord::Refused(..))),
        "{reply:?}"
    );
}

/// The model's fixed trace of the bug of commit 8d8b2d3: a late walk of a
/// line whose take was confirmed. The broken variant's walk passes the
/// `K` and takes the line again; on the store the take at the `K` answers
/// confirmed, so that trace parts from it, and the designed model's walk
/// stops there as the store does.
async fn a_late_walk_stops_at_its_confirmed_take_as_the_model_does<S: Store>(engine: Engine<S>) {
    let trace = shardstock_model::traces::WALK_PAST_CONFIRMED;
    let broken = Release::new(Bounds::HOLDS, Variant::WALK_PAST_CONFIRMED);
    let parted = replay(engine.store(), &broken, trace)
        .await
        .err()
        .expect("the broken variant's late walk parts from the store");
    assert!(parted.contains("Confirmed"), "{parted}");
    let model = Release::new(Bounds::HOLDS, Variant::DESIGNED);
    let (last, before) = trace.split_last().expect("a trace");
    assert_eq!(*last, Action::Take(2, 0));
    let r = replay(engine.store(), &model, before).await.unwrap();
    let mut state = model.init_states().remove(0);
    for &a in before {
        state = model.next_state(&state, a).expect("each step applies");
    }
    assert!(model.next_state(&state, *last).is_none());
    let j = stop(&model, &state, 2, 0, Variant::DESIGNED).expect("the walk stops");
    assert_eq!(state.pools[0][j].markers[2], Marker::Confirmed);
    let reply = engine
        .store()
        .take_line(&r.bucket(0, j), 0, &r.take_args(2, 0))
        .await
        .unwrap();
    assert_eq!(reply, LineTake::Confirmed);
}

on_every_backend!(namespace_per_test:
    release_traces_match_the_model,
    held_release_traces_match_the_model,
    a_late_walk_stops_at_its_confirmed_take_as_the_model_does,
    a_variant_that_releases_at_the_abort_parts_from_the_store,
    the_unchecked_commit_trace_leaves_the_commit_nothing_to_do,
);
