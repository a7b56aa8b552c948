//! Group commit of the home step: purchases of one bucket that arrive while a
//! call for that bucket is in flight go together in the next call.
//!
//! Each bucket has a lock-free queue (crossbeam `SegQueue`) and a busy flag
//! (`engine::handoff`, whose fences a `loom` model checks). A purchase pushes
//! its entry and a reply channel; if no call is in flight it starts a driver
//! task, which takes up to `max_batch` entries, runs
//! `purchase.lua` once for all of them (the script applies them in order with
//! exactly the single-purchase semantics), hands each caller its own reply, and
//! goes on while entries keep arriving. A lone purchase is sent at once — the
//! only wait is for a call already in flight — and no caller ever drives the
//! queue for others, so nobody's answer waits behind someone else's batch.
//! With `batching.max_wait_us` above zero the driver lingers that long after
//! the first entry of a batch to let more join (a latency-for-throughput knob;
//! off by default). No lock is held across an `.await`.
//!
//! **Shared lanes.** On a store that serves several buckets in one call (one
//! Redis server:
//! [`Buckets::groups_buckets`](crate::store::Buckets::groups_buckets)) a lane
//! is not a bucket's own: bucket `b` queues in lane `b % shared_lanes` (the
//! engine's option), and a driver sends what it took as one group per bucket
//! (in arrival order within each) in one `purchase_groups` call. Every call
//! costs a fixed part beside its entries (the command's trip through the
//! client, both kernels and Redis's event loop), and with a lane per bucket a
//! sale of 16 buckets on one server ran ~2 purchases a call; sharing, the same
//! load fills calls several times fuller. Each group is exactly a
//! `purchase.lua` batch. A failed call fails every group of it: each caller
//! answers as of unknown outcome, as for a bucket's own call (groups before
//! the failure may have applied). On a Cluster each bucket keeps its lane.
//!
//! An event of fewer buckets than lanes would leave lanes idle while its
//! buckets' own queue: bucket b of an event of N buckets may also use lanes
//! b + N, b + 2N, … — an idle one when its own has a call in flight, else in
//! turn — so such a bucket can have a call in flight on each of them. Each
//! call is one atomic script that checks what it buys (stock, limit, request
//! id) when it runs, so two calls of one bucket may run in either order as
//! two concurrent requests may; an entry never waits for a call it is not
//! in. One bucket on one server sold as fast as two (1.0× over three runs;
//! it sold 0.58–0.60× as fast with one call in flight).
//!
//! **Spilling follows the server's load.** A second call in flight only
//! pays while the server is the limit: it keeps Redis working while the
//! first call's answers travel back. Where the service's own box is the
//! limit (the HTTP front, as on a box shared with Redis and the database)
//! two calls in flight are each half as full, and every call's fixed part
//! costs the service and Redis again. So a bucket spills onto another lane
//! only while the server is busy: the drivers read its CPU time
//! ([`Buckets::server_cpu`](crate::store::Buckets::server_cpu), `INFO cpu`)
//! every [`Spill::EVERY`] while calls flow, and spilling turns off below
//! [`Spill::OFF_BELOW`] of a core and on again from [`Spill::ON_AT`]. The
//! share is the gauge `shardstock_store_server_busy_ratio`. Buckets of an
//! event of as many buckets as lanes, or more, keep their own lanes either
//! way, and while only such events sell the server's CPU is not read.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, RwLock};
use std::time::{Duration, Instant};

use crossbeam::queue::SegQueue;
use tokio::sync::oneshot;

use super::handoff::{Handoff, PeriodClaim};
use super::{Activity, Clock};
use crate::domain::keys::BucketRef;
use crate::domain::model::MAX_BATCH;
use crate::metrics as m;
use crate::store::{PurchaseEntry, PurchaseReply, Store, StoreError};

type Reply = Result<PurchaseReply, StoreError>;

struct Queued {
    bucket: BucketRef,
    entry: PurchaseEntry,
    reply: oneshot::Sender<Reply>,
}

/// A queue and who drives it (`Handoff`: the busy flag, and why the two
/// steps that pass it on are fenced).
#[derive(Default)]
struct Lane {
    queue: SegQueue<Queued>,
    handoff: Handoff,
}

/// The per-bucket batchers of one engine.
pub(crate) struct Batcher<S: Store> {
    store: S,
    max_batch: usize,
    wait: std::time::Duration,
    /// Each bucket's own lane (a store that calls one bucket at a time).
    lanes: RwLock<HashMap<BucketRef, Arc<Lane>>>,
    /// The lanes the buckets share, when the store groups buckets (fixed at
    /// start, serving every event); empty: a lane per bucket.
    shared: Vec<Arc<Lane>>,
    /// Turns among the lanes an event of fewer buckets than lanes spreads over.
    turn: std::sync::atomic::AtomicU32,
    /// Whether such an event may spread now (the server is busy).
    spill: Arc<Spill>,
    clock: Clock,
    activity: Arc<Activity>,
}

impl<S: Store> Batcher<S> {
    /// `shared_lanes`: how many lanes buckets share when the store groups
    /// them (at least one); ignored otherwise.
    pub fn new(
        store: S,
        max_batch: usize,
        wait: std::time::Duration,
        shared_lanes: usize,
        activity: Arc<Activity>,
    ) -> Self {
        let shared = if store.groups_buckets() {
            let n = shared_lanes.clamp(1, 1024);
            (0..n).map(|_| Arc::default()).collect()
        } else {
            Vec::new()
        };
        Self {
            store,
            max_batch: max_batch.clamp(1, MAX_BATCH),
            wait,
            lanes: RwLock::new(HashMap::new()),
            spill: Arc::new(Spill::new()),
            shared,
            turn: std::sync::atomic::AtomicU32::new(0),
            clock: Clock::system(),
            activity,
        }
    }

    /// How many lanes the buckets of one server share (0: a lane per bucket).
    pub fn shared_lanes(&self) -> u32 {
        self.shared.len() as u32
    }

    /// The clock a batch after the first reads its time from (the engine's).
    pub(crate) fn set_clock(&mut self, clock: Clock) {
        self.clock = clock;
    }

    /// The lane of `bucket`, of an event of `buckets` buckets: its own, or
    /// shared lane `index % shared`. An event of fewer buckets than the
    /// shared lanes would leave lanes idle while its buckets' lanes queue:
    /// bucket b may then also use lanes b + buckets, b + 2 × buckets, …, and
    /// takes the first of them with no call in flight when its own has one.
    fn lane_for(&self, bucket: &BucketRef, buckets: u32) -> Arc<Lane> {
        let n = self.shared.len();
        if n == 0 {
            return self.lane(bucket);
        }
        let home = bucket.index as usize % n;
        let step = (buckets as usize).max(1);
        let busy = |l: usize| self.shared[l].handoff.is_busy();
        if step >= n || !self.spill.spreads() || !busy(home) {
            return self.shared[home].clone();
        }
        let chosen = match (home + step..n).step_by(step).find(|&l| !busy(l)) {
            Some(idle) => idle,
            // Every one has a call in flight: take turns.
            None => {
                let turn = self.turn.fetch_add(1, Ordering::Relaxed) as usize;
                home + turn % (n - home).div_ceil(step) * step
            }
        };
        self.shared[chosen].clone()
    }

    /// `bucket`'s own lane.
    fn lane(&self, bucket: &BucketRef) -> Arc<Lane> {
        if let Some(lane) = self.lanes.read().expect("lanes poisoned").get(bucket) {
            return lane.clone();
        }
        let mut lanes = self.lanes.write().expect("lanes poisoned");
        lanes.entry(bucket.clone()).or_default().clone()
    }

    /// The home step for one entry of an event of `buckets` buckets, batched
    /// with whatever else is waiting.
    pub async fn home(
        &self,
        bucket: &BucketRef,
        buckets: u32,
        now_ms: i64,
        entry: PurchaseEntry,
    ) -> Reply {
        let (tx, rx) = oneshot::channel();
        let lane = self.lane_for(bucket, buckets);
        lane.queue.push(Queued {
            bucket: bucket.clone(),
            entry,
            reply: tx,
        });
        if lane.handoff.claim_after_push() {
            let (store, max, wait) = (self.store.clone(), self.max_batch, self.wait);
            let (clock, activity) = (self.clock.clone(), self.activity.clone());
            let driver = Driver {
                spill: self.spill.clone(),
                store,
                clock,
                activity,
                max_batch: max,
                wait,
            };
            tokio::spawn(driver.drive(lane, now_ms));
        }
        rx.await
            .unwrap_or_else(|_| Err(StoreError::Unavailable("the batch driver stopped".into())))
    }

    /// Lanes of buckets of their own.
    pub(crate) fn lanes(&self) -> usize {
        self.lanes.read().expect("lanes poisoned").len()
    }

    /// Forgets the lanes of buckets that no longer exist (after a reshard or
    /// close); shared lanes stay (they are few and serve every event).
    pub fn forget(&self, event: &crate::domain::ids::EventId) {
        self.lanes
            .write()
            .expect("lanes poisoned")
            .retain(|b, lane| &b.event != event || lane.handoff.is_busy());
    }
}

/// Whether an event of fewer buckets than lanes may spread its calls over
/// more than one lane: while the server is busy (the module's "Spilling
/// follows the server's load").
pub(crate) struct Spill {
    on: AtomicBool,
    /// Wanted by a purchase of an event that could spread (only then is the
    /// server's CPU read: no `INFO` for events that keep their own lanes, nor
    /// where every bucket has a lane of its own), and claimed by one driver a
    /// period (ms since `start`).
    sampling: PeriodClaim,
    start: Instant,
    /// The last sample: when, and the server's CPU seconds then.
    last: Mutex<Option<(Instant, f64)>>,
}

impl Spill {
    /// How often the server's CPU time is read while calls flow.
    pub(crate) const EVERY: Duration = Duration::from_millis(500);
    /// Below this share of a core the server is not the limit: one lane.
    pub(crate) const OFF_BELOW: f64 = 0.35;
    /// From this share of a core on, spill again. Measured on two shared
    /// cores: Redis near 0.95 in the engine rows with two lanes (0.6 with
    /// one), 0.2–0.3 over HTTP, where the service's box is the limit.
    pub(crate) const ON_AT: f64 = 0.5;

    fn new() -> Self {
        Self {
            on: AtomicBool::new(true),
            sampling: PeriodClaim::default(),
            start: Instant::now(),
            last: Mutex::new(None),
        }
    }

    fn on(&self) -> bool {
        self.on.load(Ordering::Relaxed)
    }

    /// For a purchase of an event of fewer buckets than lanes: whether it may
    /// spread now. It marks the next sample wanted.
    fn spreads(&self) -> bool {
        self.sampling.want();
        self.on()
    }

    /// Whether a sample is due: an event that could spread sold since the
    /// last one, and [`Spill::EVERY`] has passed (true for one caller).
    fn due(&self) -> bool {
        let now = self.start.elapsed().as_millis() as u64;
        self.sampling.claim(now, Self::EVERY.as_millis() as u64)
    }

    /// Takes the server's CPU seconds read at `at`. A share needs two samples
    /// close together: after a pause (no calls, so no samples) the first one
    /// only starts the next interval.
    fn sample(&self, at: Instant, cpu: f64) {
        let mut last = self.last.lock().expect("spill poisoned");
        if let Some((then, was)) = *last {
            // A reading older than the last one (two overlapping reads) is dropped.
            let Some(wall) = at.checked_duration_since(then) else {
                return;
            };
            if !wall.is_zero() && wall <= 4 * Self::EVERY {
                let share = (cpu - was).max(0.0) / wall.as_secs_f64();
                metrics::gauge!(m::STORE_SERVER_BUSY).set(share);
                self.on.store(spills(self.on(), share), Ordering::Relaxed);
            }
        }
        *last = Some((at, cpu));
    }
}

/// Whether to spill, given whether it did and the server's busy share.
fn spills(on: bool, share: f64) -> bool {
    if on {
        share >= Spill::OFF_BELOW
    } else {
        share >= Spill::ON_AT
    }
}

/// What a lane's driver task needs.
struct Driver<S> {
    spill: Arc<Spill>,
    store: S,
    clock: Clock,
    activity: Arc<Activity>,
    max_batch: usize,
    wait: std::time::Duration,
}

impl<S: Store> Driver<S> {
    /// Sends batches for one lane until its queue is empty.
    async fn drive(self, lane: Arc<Lane>, mut now_ms: i64) {
        let Self {
            spill,
            store,
            clock,
            activity,
            max_batch,
            wait,
        } = self;
        let take = |batch: &mut Vec<Queued>| {
            while batch.len() < max_batch {
                match lane.queue.pop() {
                    Some(q) => batch.push(q),
                    None => break,
                }
            }
        };
        loop {
            let mut batch = Vec::with_capacity(max_batch.min(64));
            take(&mut batch);
            if !wait.is_zero() && !batch.is_empty() && batch.len() < max_batch {
                tokio::time::sleep(wait).await;
                take(&mut batch);
                now_ms = clock.now_ms();
            }
            if batch.is_empty() {
                // An entry pushed after the last pop but before the flag dropped
                // found the lane busy and started no driver: take over again.
                if lane.handoff.release(|| lane.queue.is_empty()) {
                    return;
                }
                continue;
            }
            metrics::histogram!(m::BATCH_SIZE).record(batch.len() as f64);
            metrics::counter!(m::SCRIPT_CALLS).increment(1);
            let (groups, replies) = group(batch);
            let results = if let [(bucket, entries)] = groups.as_slice() {
                vec![store.purchase(bucket, now_ms, entries).await]
            } else {
                store.purchase_groups(now_ms, &groups).await
            };
            for (bucket, _) in &groups {
                activity.wrote(bucket);
            }
            if spill.due() {
                let (spill, store) = (spill.clone(), store.clone());
                tokio::spawn(async move {
                    if let Some(cpu) = store.server_cpu().await {
                        spill.sample(Instant::now(), cpu);
                    }
                });
            }
            if results.len() != groups.len() {
                let e = StoreError::Protocol(format!(
                    "{} results for {} groups",
                    results.len(),
                    groups.len()
                ));
                for reply in replies.into_iter().flatten() {
                    let _ = reply.send(Err(e.clone()));
                }
            } else {
                for (result, replies) in results.into_iter().zip(replies) {
                    answer(result, replies);
                }
            }
            now_ms = clock.now_ms();
        }
    }
}

/// A lane's batch as one group a bucket, in the order each bucket's entries
/// arrived (a lane of its own makes one group), and the groups' reply senders.
#[allow(clippy::type_complexity)]
fn group(
    batch: Vec<Queued>,
) -> (
    Vec<(BucketRef, Vec<PurchaseEntry>)>,
    Vec<Vec<oneshot::Sender<Reply>>>,
) {
    // Sized for the common shapes (a few buckets of a few entries each): a
    // vector grown from one entry reallocates on the second.
    let room = batch.len().min(8);
    let mut groups: Vec<(BucketRef, Vec<PurchaseEntry>)> = Vec::with_capacity(room);
    let mut replies: Vec<Vec<oneshot::Sender<Reply>>> = Vec::with_capacity(room);
    for q in batch {
        match groups.iter().position(|(b, _)| *b == q.bucket) {
            Some(i) => {
                groups[i].1.push(q.entry);
                replies[i].push(q.reply);
            }
            None => {
                let (mut entries, mut senders) = (Vec::with_capacity(4), Vec::with_capacity(4));
                entries.push(q.entry);
                senders.push(q.reply);
                groups.push((q.bucket, entries));
                replies.push(senders);
            }
        }
    }
    (groups, replies)
}

/// Hands each caller of one group its own answer.
fn answer(result: Result<Vec<PurchaseReply>, StoreError>, replies: Vec<oneshot::Sender<Reply>>) {
    match result {
        Ok(answers) if answers.len() == replies.len() => {
            for (reply, answer) in replies.into_iter().zip(answers) {
                let _ = reply.send(Ok(answer));
            }
        }
        Ok(answers) => {
            let e = StoreError::Protocol(format!(
                "{} replies for {} entries",
                answers.len(),
                replies.len()
            ));
            for reply in replies {
                let _ = reply.send(Err(e.clone()));
            }
        }
        Err(e) => {
            for reply in replies {
                let _ = reply.send(Err(e.clone()));
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn spilling_turns_off_below_a_third_of_a_core_and_on_again_from_half() {
        assert!(spills(true, 0.95));
        assert!(spills(true, Spill::OFF_BELOW));
        assert!(!spills(true, 0.25));
        // Between the two marks it stays as it was.
        assert!(spills(true, 0.4));
        assert!(!spills(false, 0.4));
        assert!(spills(false, Spill::ON_AT));
    }

    #[test]
    fn a_share_is_read_from_two_samples_close_together() {
        let spill = Spill::new();
        let t0 = Instant::now();
        assert!(spill.on(), "spills until a share says otherwise");
        spill.sample(t0, 10.0);
        assert!(spill.on(), "one sample is no share");
        // 0.1 s of CPU in 0.5 s: a fifth of a core.
        spill.sample(t0 + Spill::EVERY, 10.1);
        assert!(!spill.on());
        // After a pause the first sample only starts the next interval.
        let later = t0 + 20 * Spill::EVERY;
        spill.sample(later, 100.0);
        assert!(!spill.on(), "the CPU over the pause is not read as a share");
        spill.sample(later + Spill::EVERY, 100.45);
        assert!(spill.on(), "0.9 of a core");
    }

    #[test]
    fn one_caller_a_period_samples_and_only_for_an_event_that_could_spread() {
        let spill = Spill::new();
        assert!(!spill.due(), "no event that could spread sold");
        assert!(spill.spreads());
        assert!(spill.due());
        spill.spreads();
        assert!(!spill.due(), "claimed until the next period");
    }
}
