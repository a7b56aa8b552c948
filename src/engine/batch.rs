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
    lanes: RwLock<HashMap<BucketRef, Arc<Lane>>>,
    clock: Clock,
    activity: Arc<Activity>,
}

impl<S: Store> Batcher<S> {
    pub fn new(
        store: S,
        max_batch: usize,
        wait: std::time::Duration,
        activity: Arc<Activity>,
    ) -> Self {
        Self {
            store,
            max_batch: max_batch.max(1),
            wait,
            lanes: RwLock::new(HashMap::new()),
            clock: Clock::system(),
            activity,
        }
    }

    /// The clock a batch after the first reads its time from (the engine's).
    pub fn set_clock(&mut self, clock: Clock) {
        self.clock = clock;
    }

    fn lane(&self, bucket: &BucketRef) -> Arc<Lane> {
        if let Some(lane) = self.lanes.read().expect("lanes poisoned").get(bucket) {
            return lane.clone();
        }
        let mut lanes = self.lanes.write().expect("lanes poisoned");
        lanes.entry(bucket.clone()).or_default().clone()
    }

    /// The home step for one entry, batched with whatever else is waiting.
    pub async fn home(&self, bucket: &BucketRef, now_ms: i64, entry: PurchaseEntry) -> Reply {
        let (tx, rx) = oneshot::channel();
        let lane = self.lane(bucket);
        lane.queue.push(Queued { entry, reply: tx });
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
            tokio::spawn(driver.drive(bucket.clone(), lane, now_ms));
        }
        rx.await
            .unwrap_or_else(|_| Err(StoreError::Unavailable("the batch driver stopped".into())))
    }

    /// Forgets the lanes of buckets that no longer exist (after a reshard or close).
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
    /// Sends batches for one bucket until its queue is empty.
    async fn drive(self, bucket: BucketRef, lane: Arc<Lane>, mut now_ms: i64) {
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
            let (entries, replies): (Vec<PurchaseEntry>, Vec<_>) =
                batch.into_iter().map(|q| (q.entry, q.reply)).unzip();
            metrics::histogram!(m::BATCH_SIZE).record(entries.len() as f64);
            metrics::counter!(m::SCRIPT_CALLS).increment(1);
            let result = store.purchase(&bucket, now_ms, &entries).await;
            activity.wrote(&bucket);
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
            now_ms = clock.now_ms();
        }
    }
}
