//! Group commit of draw entries: entries of one entry shard that arrive
//! while a call for that shard is in flight go together in the next call,
//! as purchases of one bucket do (`batch`, whose busy flag, `handoff`, this
//! shares).
//!
//! Each entry shard (an event's `domain::draw::ENTRY_SHARDS`, each its own
//! slot) has a lock-free queue. An entry pushes its user and a reply
//! channel; if no call is in flight it starts a driver task, which takes up
//! to `max_batch` users, runs `lua/enter.lua` once for all of them (in
//! order: a user twice is entered once), hands each caller its own answer,
//! and goes on while entries keep arriving. A lone entry is sent at once.
//! A failed call fails each of its entries as of unknown outcome; an entry
//! is idempotent, so the caller's retry is safe.
//!
//! Unbatched, an entry cost more than a batched purchase: one script call
//! each (1.14× the CPU of an open purchase over HTTP at 16 buckets,
//! BENCHMARKS.md "Fair drops"). Lanes live while their event does
//! (`forget` drops them with the event).

use std::collections::HashMap;
use std::sync::{Arc, RwLock};

use crossbeam::queue::SegQueue;
use tokio::sync::oneshot;

use super::handoff::Handoff;
use crate::domain::ids::{EventId, UserId};
use crate::domain::model::MAX_BATCH;
use crate::store::{EnterReply, Store, StoreError};

type Reply = Result<EnterReply, StoreError>;

/// One entry shard's queue and who drives it.
#[derive(Default)]
struct Lane {
    queue: SegQueue<(UserId, oneshot::Sender<Reply>)>,
    handoff: Handoff,
}

/// The per-shard entry batchers of one engine.
pub(crate) struct EntryBatcher<S: Store> {
    store: S,
    max_batch: usize,
    lanes: RwLock<HashMap<(EventId, u32), Arc<Lane>>>,
}

impl<S: Store> EntryBatcher<S> {
    pub fn new(store: S, max_batch: usize) -> Self {
        Self {
            store,
            max_batch: max_batch.clamp(1, MAX_BATCH),
            lanes: RwLock::default(),
        }
    }

    /// Enters `user` in `shard` of `event`, with whatever else is waiting.
    pub async fn enter(&self, event: &EventId, shard: u32, user: UserId) -> Reply {
        let (tx, rx) = oneshot::channel();
        let lane = self.lane(event, shard);
        lane.queue.push((user, tx));
        if lane.handoff.claim_after_push() {
            let driver = drive(
                self.store.clone(),
                lane,
                event.clone(),
                shard,
                self.max_batch,
            );
            tokio::spawn(driver);
        }
        rx.await
            .unwrap_or_else(|_| Err(StoreError::Unavailable("the entry driver stopped".into())))
    }

    fn lane(&self, event: &EventId, shard: u32) -> Arc<Lane> {
        let key = (event.clone(), shard);
        if let Some(lane) = self.lanes.read().expect("lanes poisoned").get(&key) {
            return lane.clone();
        }
        let mut lanes = self.lanes.write().expect("lanes poisoned");
        lanes.entry(key).or_default().clone()
    }

    /// Lanes held (bounded by the open draw events' shards).
    pub(crate) fn lanes(&self) -> usize {
        self.lanes.read().expect("lanes poisoned").len()
    }

    /// Forgets `event`'s idle lanes (a busy one is left to its driver).
    pub fn forget(&self, event: &EventId) {
        self.lanes
            .write()
            .expect("lanes poisoned")
            .retain(|(e, _), lane| e != event || lane.handoff.is_busy());
    }
}

/// Sends calls for one lane until its queue is empty.
async fn drive<S: Store>(store: S, lane: Arc<Lane>, event: EventId, shard: u32, max: usize) {
    loop {
        let (mut users, mut replies) = (Vec::new(), Vec::new());
        while users.len() < max {
            match lane.queue.pop() {
                Some((user, reply)) => {
                    users.push(user);
                    replies.push(reply);
                }
                None => break,
            }
        }
        if users.is_empty() {
            // An entry pushed after the last pop but before the flag
            // dropped found the lane busy and started no driver.
            if lane.handoff.release(|| lane.queue.is_empty()) {
                return;
            }
            continue;
        }
        match store.enter(&event, shard, &users).await {
            Ok(answers) if answers.len() == replies.len() => {
                for (reply, answer) in replies.into_iter().zip(answers) {
                    let _ = reply.send(Ok(answer));
                }
            }
            Ok(answers) => {
                let e = StoreError::Protocol(format!(
                    "{} entry answers for {} users",
                    answers.len(),
                    users.len()
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
}
