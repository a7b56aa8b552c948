//! `Faulty`: a store that fails, delays or times out its steps on purpose.
//!
//! A wrapper over any [`Store`]. Before each step it draws a decision from a
//! seeded generator, keyed by `(seed, step, n)` where `n` counts that step's
//! calls through this wrapper (and its clones, which share the state): the
//! same seed makes the same decision for the nth `take`, whichever task makes
//! that call. A decision is either nothing, or a [`Fault`] applied at a
//! [`When`]:
//! - `Before`: the inner store is never called (`Fail`: an error at once;
//!   `Timeout(d)`: an error after `d`; `Delay(d)`: the step runs after `d`);
//! - `After`: the inner store applied the step and its reply is lost — the
//!   caller sees an error although the step happened (`Fail`, `Timeout(d)`),
//!   the "lying" case that only a real network can produce otherwise; or the
//!   reply arrives `d` late (`Delay(d)`).
//!
//! Every injected error is `StoreError::Unavailable` (what a timeout or a
//! dropped connection is); a `Stale` or `Protocol` answer means something
//! specific that a network fault cannot fake. Steps are named like their
//! scripts (`purchase`, `take`, `bump_seq`, …; [`STEPS`] lists them, a name
//! outside it is a test bug and panics). Rules are per step ([`Faulty::rule`])
//! or for every step ([`Faulty::everywhere`]); [`Faulty::arm`] fails exactly
//! the nth call of a step; [`Faulty::heal`] drops every rule (the store is
//! plain from then on); [`Faulty::plain`] starts without any.

use std::collections::HashMap;
use std::future::Future;
use std::sync::{Arc, Mutex};
use std::time::Duration;

// Globs: the steps' signatures come from the store's own list
// (`forward_<section>!`), so a new step's types are in scope here without
// this file naming them.
use shardstock::domain::ids::*;
use shardstock::domain::keys::*;
use shardstock::domain::model::*;
use shardstock::domain::offer::*;
use shardstock::domain::release::*;
use shardstock::domain::stream::*;
use shardstock::domain::token::TokenAccess;
use shardstock::domain::transfer::*;
use shardstock::store::*;

/// What goes wrong with a step.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Fault {
    /// An error, at once.
    Fail,
    /// The reply (or the request) takes this long, then goes through.
    Delay(Duration),
    /// An error after this long: a client-side timeout.
    Timeout(Duration),
}

/// Whether the fault strikes before the inner store runs the step, or after.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum When {
    /// The step never reaches the store.
    Before,
    /// The step ran; its reply is lost (an error) or late (a delay).
    After,
}

/// Which fault a rule injects when it fires.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Mode {
    /// Always this fault, at this moment.
    Only(Fault, When),
    /// Any of the six (fail, delay, time out × before, after), drawn evenly;
    /// delays and timeouts last 1 ms to `max_delay`.
    Any { max_delay: Duration },
}

/// How often a step fails, and how.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Rule {
    /// Of each call, in [0, 1].
    pub probability: f64,
    pub mode: Mode,
}

/// One fault that was injected: for the report of a failing schedule.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Injected {
    pub step: &'static str,
    /// Which call of the step (1-based).
    pub nth: u64,
    pub fault: Fault,
    pub when: When,
}

#[derive(Debug, Default)]
struct State {
    seed: u64,
    rules: HashMap<&'static str, Rule>,
    everywhere: Option<Rule>,
    armed: HashMap<(&'static str, u64), (Fault, When)>,
    calls: HashMap<&'static str, u64>,
    total: u64,
    /// Steps started and not yet ended (or dropped).
    in_flight: u64,
    injected: Vec<Injected>,
}

/// A store whose steps fail on purpose (see the module docs). Clones share
/// the rules and counters, as an engine's clones of its store share one
/// connection.
#[derive(Clone)]
pub struct Faulty<S> {
    inner: S,
    state: Arc<Mutex<State>>,
    /// Whether a call of several buckets' purchases goes to the store as one
    /// `purchase_groups` step (where the store groups them) instead of one
    /// `purchase` step a bucket: see [`Faulty::grouping`].
    grouping: bool,
}

/// At most this many injected faults are remembered for a report.
const REMEMBERED: usize = 4096;

/// splitmix64: a tiny, good mixer. Each decision is a pure function of
/// `(seed, step, n)`, so it does not depend on which task asks first.
fn mix(mut z: u64) -> u64 {
    z = z.wrapping_add(0x9e37_79b9_7f4a_7c15);
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

/// A stable number for a step name (FNV-1a).
fn name_hash(name: &str) -> u64 {
    name.bytes().fold(0xcbf2_9ce4_8422_2325, |h, b| {
        (h ^ u64::from(b)).wrapping_mul(0x0100_0000_01b3)
    })
}

/// A uniform number in [0, 1) from 53 bits of `x`.
fn unit(x: u64) -> f64 {
    (x >> 11) as f64 / (1u64 << 53) as f64
}

impl<S: Store> Faulty<S> {
    /// A wrapper with no rules yet; decisions will be drawn from `seed`.
    pub fn new(inner: S, seed: u64) -> Self {
        Self {
            inner,
            state: Arc::new(Mutex::new(State {
                seed,
                ..State::default()
            })),
            grouping: false,
        }
    }

    /// Lets the engine send several buckets' purchases in one call where the
    /// store can (a standalone Redis: `purchase_groups.lua`), as it does in
    /// production, and fails that call as one step, `purchase_groups`: a
    /// fault after it applied loses every group's reply at once. Without it
    /// every purchase is a `purchase` step of its own bucket.
    pub fn grouping(mut self) -> Self {
        self.grouping = true;
        self
    }

    /// A wrapper that injects nothing (until told to).
    pub fn plain(inner: S) -> Self {
        Self::new(inner, 0)
    }

    /// The store underneath.
    pub fn inner(&self) -> &S {
        &self.inner
    }

    fn state(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.lock().expect("fault state poisoned")
    }

    /// Sets the rule of one step (it wins over [`Faulty::everywhere`]).
    pub fn rule(&self, step: &'static str, rule: Rule) -> &Self {
        known(step);
        self.state().rules.insert(step, rule);
        self
    }

    /// Sets the rule of every step that has none of its own.
    pub fn everywhere(&self, rule: Rule) -> &Self {
        self.state().everywhere = Some(rule);
        self
    }

    /// Fails exactly the `nth` call of `step` (1-based, counted from the
    /// wrapper's creation), before or after it applies.
    pub fn arm(&self, step: &'static str, nth: u64, when: When) -> &Self {
        self.arm_fault(step, nth, Fault::Fail, when)
    }

    /// Injects `fault` into exactly the `nth` call of `step` (a delay of
    /// one bucket's read, say, where a rule would delay them all).
    pub fn arm_fault(&self, step: &'static str, nth: u64, fault: Fault, when: When) -> &Self {
        known(step);
        self.state().armed.insert((step, nth), (fault, when));
        self
    }

    /// Drops every rule and armed fault: the store is plain from now on.
    pub fn heal(&self) {
        let mut st = self.state();
        st.rules.clear();
        st.everywhere = None;
        st.armed.clear();
    }

    /// Calls of `step` so far (injected or not).
    pub fn calls(&self, step: &'static str) -> u64 {
        known(step);
        self.state().calls.get(step).copied().unwrap_or(0)
    }

    /// Calls of every step so far.
    pub fn total_calls(&self) -> u64 {
        self.state().total
    }

    /// Steps under way now: started, neither ended nor dropped. An engine
    /// finishes some work in tasks of its own (the batcher sends a home step
    /// whose caller went away), so "the schedule is over" is this being 0.
    pub fn in_flight(&self) -> u64 {
        self.state().in_flight
    }

    /// The faults injected so far (the first few thousand).
    pub fn injected(&self) -> Vec<Injected> {
        self.state().injected.clone()
    }

    /// Counts the call and decides its fault.
    fn decide(&self, step: &'static str) -> Option<(Fault, When)> {
        let mut st = self.state();
        st.total += 1;
        let n = {
            let calls = st.calls.entry(step).or_insert(0);
            *calls += 1;
            *calls
        };
        let decision = if let Some(armed) = st.armed.remove(&(step, n)) {
            Some(armed)
        } else {
            let rule = st.rules.get(step).copied().or(st.everywhere)?;
            let r = mix(st.seed ^ mix(name_hash(step) ^ mix(n)));
            if unit(r) >= rule.probability {
                return None;
            }
            Some(match rule.mode {
                Mode::Only(fault, when) => (fault, when),
                Mode::Any { max_delay } => {
                    let r2 = mix(r);
                    let ms = max_delay.as_millis().max(1) as u64;
                    let d = Duration::from_millis(1 + (r2 >> 8) % ms);
                    let fault =
                        [Fault::Fail, Fault::Delay(d), Fault::Timeout(d)][(r2 % 3) as usize];
                    let when = if (r2 >> 4).is_multiple_of(2) {
                        When::Before
                    } else {
                        When::After
                    };
                    (fault, when)
                }
            })
        };
        if let Some((fault, when)) = decision
            && st.injected.len() < REMEMBERED
        {
            st.injected.push(Injected {
                step,
                nth: n,
                fault,
                when,
            });
        }
        decision
    }

    /// Runs one step through its fault, if any.
    async fn step<T>(
        &self,
        step: &'static str,
        op: impl Future<Output = Result<T, StoreError>>,
    ) -> Result<T, StoreError> {
        let decision = self.decide(step);
        let _under_way = InFlight::start(&self.state);
        let Some((fault, when)) = decision else {
            return op.await;
        };
        let lost = |what: &str| {
            Err(StoreError::Unavailable(format!(
                "injected: {step} {what} ({when:?})"
            )))
        };
        match (fault, when) {
            (Fault::Fail, When::Before) => lost("failed"),
            (Fault::Timeout(d), When::Before) => {
                tokio::time::sleep(d).await;
                lost("timed out")
            }
            (Fault::Delay(d), When::Before) => {
                tokio::time::sleep(d).await;
                op.await
            }
            (fault, When::After) => {
                let reply = op.await?;
                match fault {
                    Fault::Fail => lost("applied, reply lost"),
                    Fault::Timeout(d) => {
                        tokio::time::sleep(d).await;
                        lost("applied, timed out")
                    }
                    Fault::Delay(d) => {
                        tokio::time::sleep(d).await;
                        Ok(reply)
                    }
                }
            }
        }
    }
}

/// Counts a step as under way until it ends or is dropped.
struct InFlight(Arc<Mutex<State>>);

impl InFlight {
    fn start(state: &Arc<Mutex<State>>) -> Self {
        state.lock().expect("fault state poisoned").in_flight += 1;
        Self(state.clone())
    }
}

impl Drop for InFlight {
    fn drop(&mut self) {
        if let Ok(mut st) = self.0.lock() {
            st.in_flight -= 1;
        }
    }
}

fn known(step: &str) {
    assert!(STEPS.contains(&step), "no store step is named {step:?}");
}

/// Every step a `Faulty` can fail: the store's own list of its steps.
pub use shardstock::store::STEPS;

/// Implements a section's trait by running every step through
/// [`Faulty::step`] (called by the store's `forward_<section>!` with the
/// section's list of steps, and the methods written here by hand).
macro_rules! faulty_sections {
    ($section:ident {
        $(fn $name:ident($($arg:ident: $ty:ty),*) -> $ret:ty;)*
    } $([$($extra:item)*])?) => {
        impl<S: Store> $section for Faulty<S> {
            $(
                async fn $name(&self, $($arg: $ty),*) -> Result<$ret, StoreError> {
                    self.step(stringify!($name), self.inner.$name($($arg),*)).await
                }
            )*
            $($($extra)*)?
        }
    };
}

shardstock::forward_events!(faulty_sections);
shardstock::forward_buckets! { faulty_sections,
    /// With [`Faulty::grouping`] on a store that groups: one
    /// `purchase_groups` step, whose fault is every group's. Else one
    /// `purchase` step a group, each failing as the schedule says.
    async fn purchase_groups(
        &self,
        now_ms: i64,
        groups: &[(BucketRef, Vec<PurchaseEntry>)],
    ) -> Vec<Result<Vec<PurchaseReply>, StoreError>> {
        if !self.groups_buckets() {
            return shardstock::store::buckets::purchase_each(self, now_ms, groups).await;
        }
        let call = async { Ok(self.inner.purchase_groups(now_ms, groups).await) };
        match self.step("purchase_groups", call).await {
            Ok(results) => results,
            Err(e) => groups.iter().map(|_| Err(e.clone())).collect(),
        }
    }
    /// Only with [`Faulty::grouping`], where the store groups.
    fn groups_buckets(&self) -> bool {
        self.grouping && self.inner.groups_buckets()
    }
    /// With [`Faulty::grouping`] on a store that groups, where it reads
    /// these buckets at once: one `bucket_state` step for all, its fault
    /// applied to the read's answer (the store is asked first, since it
    /// may answer none: too many buckets). Else none: a step a bucket.
    async fn bucket_states_at_once(
        &self,
        buckets: &[BucketRef],
    ) -> Option<Result<Vec<BucketState>, StoreError>> {
        if !self.groups_buckets() {
            return None;
        }
        let read = self.inner.bucket_states_at_once(buckets).await?;
        Some(self.step("bucket_state", async { read }).await)
    }
}
shardstock::forward_holds!(faulty_sections);
shardstock::forward_leases!(faulty_sections);
shardstock::forward_limits!(faulty_sections);
shardstock::forward_transfers!(faulty_sections);
shardstock::forward_streams!(faulty_sections);
shardstock::forward_retire!(faulty_sections);
shardstock::forward_releases!(faulty_sections);
shardstock::forward_draws!(faulty_sections);
shardstock::forward_offers!(faulty_sections);

impl<S: Store> Store for Faulty<S> {
    /// The inner store's: the harness picks a ledger by it.
    fn kind(&self) -> &'static str {
        self.inner.kind()
    }

    async fn ping(&self) -> Result<(), StoreError> {
        self.step("ping", self.inner.ping()).await
    }

    fn spread(&self, event: &EventId, generation: u32, max: u32) -> u32 {
        self.inner.spread(event, generation, max)
    }

    fn forget_event(&self, event: &EventId) {
        self.inner.forget_event(event);
    }

    fn cached_entries(&self) -> usize {
        self.inner.cached_entries()
    }
}
