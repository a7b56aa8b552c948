//! The replay: one model action at a time, run as the store steps it stands
//! for (the table in `model_replay.rs`), with the model's state as the
//! expectation beside it.
//!
//! The driver plays every actor the model has (clients, sagas' drivers, the
//! sweeper, the engines' runs): it takes each step's arguments from the
//! model's state before the action (which request, which lease token, which
//! bucket a saga took from), as the real actor would know them, and checks
//! each step's reply against what the model's state became (a purchase
//! bought, a run fenced, a switch made). `observe` then compares everything
//! the store holds.

use std::collections::HashMap;
use std::fmt;

use shardstock::Engine;
use shardstock::domain::ids::{EventId, OrderId, UserId};
use shardstock::domain::keys::BucketRef;
use shardstock::domain::model::{DEFAULT_MAX_PER_ORDER, EventSpec, EventStatus};
use shardstock::domain::routing::{home, user_hash};
use shardstock::store::{CreateEventReply, Store, StoreError, TakeArgs};
use shardstock_model::state::{Records, State};
use shardstock_model::steps::Action;
use shardstock_model::{Bounds, Protocol, Variant};
use stateright::Model;

use super::draw::{Clock, HOLD_MS};
use crate::harness::event_id;

/// The mover lease's TTL: longer than any replay (a lapse is a release).
pub const LEASE_TTL_MS: u64 = 600_000;
/// Probe markers outlive the replay (the model's markers never expire).
const MARKER_TTL_MS: u64 = 7 * 86_400_000;

/// Where a replay and its model parted.
#[derive(Debug)]
pub struct Mismatch {
    /// 1-based.
    pub step: usize,
    pub action: Action,
    pub problems: Vec<String>,
}

impl fmt::Display for Mismatch {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        writeln!(f, "after step {} ({:?}):", self.step, self.action)?;
        for p in &self.problems {
            writeln!(f, "  - {p}")?;
        }
        Ok(())
    }
}

/// A change to the model's expected state after one step: the replay's own
/// check that a wrong expectation is caught.
pub type Perturb = (usize, fn(&mut State));

/// One event replayed against a store, with the model beside it.
pub struct Replay<'a, S: Store> {
    pub engine: &'a Engine<S>,
    pub model: Protocol,
    /// The model's state: what the store must hold.
    pub state: State,
    pub clock: Clock,
    pub event: EventId,
    pub users: Vec<UserId>,
    /// Per request, its client request id (`<user>/r<n>`).
    pub rids: Vec<String>,
    /// Per request, its order id.
    pub orders: Vec<OrderId>,
    /// Model token → the real lease's token.
    pub tokens: HashMap<u8, u64>,
    /// Per order, the records read from the streams so far (what the
    /// flusher would carry to the ledger).
    pub ledger: Vec<Records>,
    /// Units in leftover records read so far.
    pub leftover: u64,
    /// Model bucket → the fence a `raise_fence` left on it while it did not
    /// exist: none since `raise_fence.lua` answers stale for a bucket not
    /// created yet, as the memory store and the model do (`STRAY_FENCE` in
    /// `model_replay.rs`); still counted, and reported if it comes back.
    pub stray_fences: HashMap<usize, u64>,
}

/// A user id whose home is `u mod n` in each layout of `bounds`.
fn user_for(u: usize, bounds: &Bounds) -> UserId {
    let layouts = [bounds.old_buckets as u32, bounds.new_buckets as u32];
    (0..)
        .map(|i| UserId::parse(format!("m{u}-{i}")).unwrap())
        .find(|user| {
            layouts
                .iter()
                .all(|&n| home(user_hash(user), n) == u as u32 % n)
        })
        .unwrap()
}

/// The owner name of engine `engine`'s lease.
pub fn owner_of(engine: u8) -> String {
    format!("replay-{engine}")
}

impl<'a, S: Store> Replay<'a, S> {
    /// Creates the event as the model's initial state has it: layout 0 with
    /// every unit in its first bucket, on sale.
    pub async fn start(engine: &'a Engine<S>, bounds: Bounds, variant: Variant) -> Self {
        let model = Protocol::new(bounds, variant);
        let state = model.init_states().remove(0);
        let event = event_id("replay");
        let users: Vec<UserId> = (0..bounds.users as usize)
            .map(|u| user_for(u, &bounds))
            .collect();
        let requests = bounds.requests();
        let per = bounds.requests_per_user as usize;
        let rids = (0..requests)
            .map(|r| format!("{}/r{}", users[r / per], r % per))
            .collect();
        let orders = (0..requests)
            .map(|r| OrderId::generate(&event, user_hash(&users[r / per])))
            .collect();
        let clock = Clock::new(requests);
        let store = engine.store();
        let spec = EventSpec {
            id: event.clone(),
            stock: u64::from(bounds.stock),
            buckets: u32::from(bounds.old_buckets),
            per_user_limit: bounds.limit.map(u32::from),
            max_per_order: DEFAULT_MAX_PER_ORDER,
            starts_at: None,
            ends_at: None,
            hold_seconds: Some((HOLD_MS / 1000) as u32),
            auto_buckets: None,
            tokens: None,
            draw: None,
        };
        let created = store.create_event(&spec, clock.now()).await.unwrap();
        assert_eq!(created, CreateEventReply::Created);
        for b in &state.buckets[model.layout(0)] {
            let bucket = BucketRef::new(&event, 0, u32::from(b.index));
            store
                .init_bucket(&bucket, u64::from(b.stock))
                .await
                .unwrap();
        }
        let on_sale = store
            .set_status(&event, EventStatus::Creating, EventStatus::OnSale)
            .await
            .unwrap();
        assert!(on_sale);
        Replay {
            engine,
            ledger: vec![Records::default(); requests],
            model,
            state,
            clock,
            event,
            users,
            rids,
            orders,
            tokens: HashMap::new(),
            leftover: 0,
            stray_fences: HashMap::new(),
        }
    }

    pub fn store(&self) -> &S {
        self.engine.store()
    }

    /// The real bucket of the model's bucket `b`.
    pub fn bucket(&self, b: usize) -> BucketRef {
        let bk = &self.state.buckets[b];
        BucketRef::new(&self.event, u32::from(bk.generation), u32::from(bk.index))
    }

    /// The real token of model token `t` (0: none).
    pub fn token(&self, t: u8) -> u64 {
        if t == 0 { 0 } else { self.tokens[&t] }
    }

    pub fn user_of(&self, r: usize) -> &UserId {
        &self.users[self.model.user(r)]
    }

    /// Request `r`'s model index, from a real order id.
    pub fn order_index(&self, order: &str) -> Option<usize> {
        self.orders.iter().position(|o| o.as_str() == order)
    }

    pub fn take_args(&self, r: usize, home: u32) -> TakeArgs {
        TakeArgs {
            rid: self.rids[r].clone(),
            pass: 1,
            user: self.user_of(r).clone(),
            qty: 1,
            order_id: self.orders[r].clone(),
            home,
            marker_ttl_ms: MARKER_TTL_MS,
            pay_by: None,
            keep_taken: false,
        }
    }

    /// Takes `action` in the model and in the store, then compares them.
    pub async fn step(&mut self, action: Action, perturb: Option<Perturb>) -> Result<(), Mismatch> {
        let before = self.state.clone();
        let after = self
            .model
            .next_state(&before, action)
            .unwrap_or_else(|| panic!("{action:?} changes nothing in the model"));
        self.state = after.clone();
        let mut problems = self.act(action, &before, &after).await;
        self.clock.taken(action);
        if let Some((at, change)) = perturb
            && at == self.clock.step
        {
            change(&mut self.state);
        }
        problems.extend(super::observe::compare(self).await);
        if problems.is_empty() {
            Ok(())
        } else {
            Err(Mismatch {
                step: self.clock.step,
                action,
                problems,
            })
        }
    }

    /// The store steps `action` stands for; the replies that disagree with
    /// the model's new state.
    async fn act(&mut self, action: Action, before: &State, after: &State) -> Vec<String> {
        let mut problems = Vec::new();
        let store = self.engine.store();
        match action {
            Action::StartReshard(e) => {
                let run = after.engines[e as usize].expect("the model started a run");
                match store
                    .acquire_lease(&self.event, &owner_of(e), LEASE_TTL_MS)
                    .await
                {
                    Ok(Some(token)) => {
                        self.tokens.insert(run.token, token);
                    }
                    other => {
                        problems.push(format!("the lease answered {other:?}; the model took it"))
                    }
                }
            }
            Action::StartClose(e) => {
                let run = after.engines[e as usize].expect("the model started a close");
                let status = store.load_meta(&self.event).await.unwrap().unwrap().status;
                if status != EventStatus::Closed
                    && !store
                        .set_status(&self.event, status, EventStatus::Closed)
                        .await
                        .unwrap()
                {
                    problems.push(format!("set_status {status:?} → closed refused"));
                }
                let token = store
                    .seize_lease(&self.event, &owner_of(e), LEASE_TTL_MS)
                    .await
                    .unwrap();
                self.tokens.insert(run.token, token);
            }
            Action::Run(e, step) => {
                problems.extend(super::runs::run(self, e, step, before, after).await);
            }
            Action::Crash(_) => {}
            Action::LeaseLapse => {
                let lease = before.lease.expect("a lease to lapse");
                store
                    .release_lease(&self.event, &owner_of(lease.owner), self.token(lease.token))
                    .await
                    .unwrap();
            }
            _ => problems.extend(super::clients::step(self, action, before, after).await),
        }
        problems
    }
}

/// A step's answer, with "the bucket does not exist" as `None`.
pub fn stale_is_none<T>(r: Result<T, StoreError>) -> Result<Option<T>, StoreError> {
    match r {
        Ok(v) => Ok(Some(v)),
        Err(StoreError::Stale(_)) => Ok(None),
        Err(e) => Err(e),
    }
}
