//! A draw's entries and record in memory: the state `lua/enter.lua`,
//! `lua/close_entries.lua`, `lua/entries_page.lua`, `lua/entry_rank.lua`,
//! `lua/init_draw.lua` and `lua/finish_draw.lua` keep in Redis, each step
//! one critical section under the draws' mutex.

use std::collections::{BTreeSet, HashMap};
use std::ops::Bound;

use super::MemoryStore;
use crate::domain::draw::{DrawDone, ENTRY_SHARDS};
use crate::domain::ids::{EventId, UserId};
use crate::store::{DrawRecord, Draws, EnterReply, StoreError};

/// One entry shard (`ss:{d#<event>#<k>}:*`).
#[derive(Debug, Default)]
pub(super) struct Shard {
    ent: BTreeSet<UserId>,
    shut: bool,
    rank: HashMap<UserId, u64>,
}

/// One event's draw: its record (`ss:{d#<event>}:draw`) and shards.
#[derive(Debug)]
pub(super) struct Draw {
    seed: Option<String>,
    done: Option<DrawDone>,
    shards: Vec<Shard>,
}

impl Default for Draw {
    fn default() -> Self {
        Self {
            seed: None,
            done: None,
            shards: (0..ENTRY_SHARDS).map(|_| Shard::default()).collect(),
        }
    }
}

impl MemoryStore {
    fn with_draw<T>(&self, event: &EventId, f: impl FnOnce(&mut Draw) -> T) -> T {
        let mut draws = self.inner.draws.lock().expect("draws poisoned");
        f(draws.entry(event.clone()).or_default())
    }

    fn with_shard<T>(
        &self,
        event: &EventId,
        shard: u32,
        f: impl FnOnce(&mut Shard) -> T,
    ) -> Result<T, StoreError> {
        self.with_draw(event, |d| d.shards.get_mut(shard as usize).map(f))
            .ok_or_else(|| StoreError::Protocol(format!("no entry shard {shard}")))
    }
}

impl Draws for MemoryStore {
    /// Mirrors `lua/init_draw.lua`.
    async fn init_draw(&self, event: &EventId, seed: &str) -> Result<String, StoreError> {
        Ok(self.with_draw(event, |d| {
            d.seed.get_or_insert_with(|| seed.to_owned()).clone()
        }))
    }

    async fn draw_record(&self, event: &EventId) -> Result<Option<DrawRecord>, StoreError> {
        Ok(self.with_draw(event, |d| {
            d.seed.clone().map(|seed| DrawRecord { seed, done: d.done })
        }))
    }

    /// Mirrors `lua/finish_draw.lua`.
    async fn finish_draw(&self, event: &EventId, done: &DrawDone) -> Result<DrawDone, StoreError> {
        Ok(self.with_draw(event, |d| *d.done.get_or_insert(*done)))
    }

    /// Mirrors `lua/enter.lua`.
    async fn enter(
        &self,
        event: &EventId,
        shard: u32,
        users: &[UserId],
    ) -> Result<Vec<EnterReply>, StoreError> {
        self.with_shard(event, shard, |s| {
            users
                .iter()
                .map(|user| {
                    if s.shut {
                        EnterReply::Closed
                    } else if s.ent.insert(user.clone()) {
                        EnterReply::New
                    } else {
                        EnterReply::Already
                    }
                })
                .collect()
        })
    }

    /// Mirrors `lua/close_entries.lua`.
    async fn close_entries(&self, event: &EventId, shard: u32) -> Result<u64, StoreError> {
        self.with_shard(event, shard, |s| {
            s.shut = true;
            s.ent.len() as u64
        })
    }

    /// Mirrors `lua/entries_page.lua`.
    async fn entries_page(
        &self,
        event: &EventId,
        shard: u32,
        after: Option<&UserId>,
        limit: u32,
    ) -> Result<Vec<UserId>, StoreError> {
        self.with_shard(event, shard, |s| {
            let from = after.map_or(Bound::Unbounded, Bound::Excluded);
            s.ent
                .range((from, Bound::Unbounded))
                .take(limit as usize)
                .cloned()
                .collect()
        })
    }

    async fn entry_count(&self, event: &EventId, shard: u32) -> Result<u64, StoreError> {
        self.with_shard(event, shard, |s| s.ent.len() as u64)
    }

    async fn write_ranks(
        &self,
        event: &EventId,
        shard: u32,
        ranks: &[(UserId, u64)],
    ) -> Result<(), StoreError> {
        self.with_shard(event, shard, |s| {
            s.rank.extend(ranks.iter().cloned());
        })
    }

    /// Mirrors `lua/entry_rank.lua`.
    async fn entry_rank(
        &self,
        event: &EventId,
        shard: u32,
        user: &UserId,
    ) -> Result<Option<Option<u64>>, StoreError> {
        self.with_shard(event, shard, |s| {
            s.ent.contains(user).then(|| s.rank.get(user).copied())
        })
    }
}

/// The draws of every event.
pub(super) type DrawMap = HashMap<EventId, Draw>;
