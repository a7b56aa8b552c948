//! Group commit of the home step: purchases of one bucket that arrive while a
//! call for that bucket is in flight go together in the next call.
//!
//! Each bucket has a lock-free queue (crossbeam `SegQueue`) and a busy flag.
//! A purchase pushes its entry and a reply channel; if no call is in flight it
//! starts a driver task, which takes up to `max_batch` entries, runs
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

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, RwLock};

use crossbeam::queue::SegQueue;
use tokio::sync::oneshot;

use super::{Activity, Clock};
use crate::domain::keys::BucketRef;
use crate::metrics as m;
use crate::store::{PurchaseEntry, PurchaseReply, Store, StoreError};

type Reply = Result<PurchaseReply, StoreError>;

struct Queued {
    bucket: BucketRef,
    entry: PurchaseEntry,
    reply: oneshot::Sender<Reply>,
}

#[derive(Default)]
struct Lane {
    queue: SegQueue<Queued>,
    busy: AtomicBool,
}

/// The per-bucket batchers of one engine.
pub struct Batcher<S: Store> {
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
            max_batch: max_batch.max(1),
            wait,
            lanes: RwLock::new(HashMap::new()),
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
    pub fn set_clock(&mut self, clock: Clock) {
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
        let busy = |l: usize| self.shared[l].busy.load(Ordering::Acquire);
        if step >= n || !busy(home) {
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
        if !lane.busy.swap(true, Ordering::AcqRel) {
            let (store, max, wait) = (self.store.clone(), self.max_batch, self.wait);
            let (clock, activity) = (self.clock.clone(), self.activity.clone());
            let driver = Driver {
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

    /// Forgets the lanes of buckets that no longer exist (after a reshard or
    /// close); shared lanes stay (they are few and serve every event).
    pub fn forget(&self, event: &crate::domain::ids::EventId) {
        self.lanes
            .write()
            .expect("lanes poisoned")
            .retain(|b, lane| &b.event != event || lane.busy.load(Ordering::Acquire));
    }
}

/// What a lane's driver task needs.
struct Driver<S> {
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
                lane.busy.store(false, Ordering::Release);
                // An entry pushed after the last pop but before the flag dropped
                // found the lane busy and started no driver: take over again.
                if lane.queue.is_empty() || lane.busy.swap(true, Ordering::AcqRel) {
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
