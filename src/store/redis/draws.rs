//! A draw's steps on Redis: the record's scripts on the draw's slot, the
//! entries' on each entry shard's (`keys::draw_key`, `keys::entry_key`).
//! Ranks are written with plain `HSET`s (one command is atomic; a draw
//! redone writes the same ranks again).

use fred::prelude::*;

use super::scripts::reply;
use super::steps::{self, Step};
use super::{At, RedisStore, arg, num, protocol, text, unknown};
use crate::domain::draw::DrawDone;
use crate::domain::ids::{EventId, UserId};
use crate::domain::keys::{draw_key, entry_key};
use crate::store::{DrawRecord, Draws, EnterReply, StoreError};

use super::steps::prelude::*;

steps! {
    /// Keeps the draw's seed unless one is kept.
    InitDraw = init_draw {
        keys: [K::Given("draw")],
        argv: { seed: String },
        reply: Reply::Values,
        writes: [],
    }
    /// Writes the draw's record once.
    FinishDraw = finish_draw {
        keys: [K::Given("draw")],
        argv: { done: String },
        reply: Reply::Values,
        writes: [],
    }
    /// Closes a shard to entries.
    CloseEntries = close_entries {
        keys: [K::Given("ent"), K::Given("shut")],
        argv: {},
        reply: Reply::Number,
        writes: [],
    }
    /// A page of a shard's entrants (or their count).
    EntriesPage = entries_page {
        keys: [K::Given("ent")],
        argv: { after: String, limit: u32 },
        reply: Reply::Values,
        writes: [],
    }
    /// Whether a user entered, and its rank.
    EntryRank = entry_rank {
        keys: [K::Given("ent"), K::Given("rank")],
        argv: { user: String },
        reply: Reply::Values,
        writes: [],
    }
}

/// `enter.lua`: enters users, in order, unless the shard is closed.
pub(super) const ENTER: &Decl = &Decl {
    name: "enter",
    lua: lua!(enter),
    keys: &[K::Given("ent"), K::Given("shut")],
    more_keys: &[],
    argv: &[Arg::Each {
        count: "n",
        index: 'i',
        cols: &["user"],
    }],
    reply: Reply::Codes(&[reply::ENTERED, reply::ENTERED_BEFORE, reply::CLOSED]),
    writes: &[],
};

/// This section's steps whose columns repeat: built beside their decoders.
pub(super) const REPEATED: &[&Decl] = &[ENTER];

/// Ranks one `HSET` carries at most.
const RANKS_PER_CALL: usize = 1_000;

impl RedisStore {
    fn shard_keys(&self, event: &EventId, shard: u32, names: &[&str]) -> At<'static> {
        At::Given(
            names
                .iter()
                .map(|n| entry_key(&self.namespace, event, shard, n))
                .collect(),
        )
    }

    fn draw_at(&self, event: &EventId) -> At<'static> {
        At::Given(vec![draw_key(&self.namespace, event)])
    }
}

fn done(v: &Value) -> Result<DrawDone, StoreError> {
    let s = text(v)?;
    DrawDone::decode(&s).ok_or_else(|| StoreError::Protocol(format!("bad draw record {s:?}")))
}

fn user(v: &Value) -> Result<UserId, StoreError> {
    UserId::parse(text(v)?).map_err(|e| StoreError::Protocol(format!("bad entrant: {e}")))
}

impl Draws for RedisStore {
    async fn init_draw(&self, event: &EventId, seed: &str) -> Result<String, StoreError> {
        let step = steps::InitDraw {
            seed: seed.to_owned(),
        };
        text(&self.run(step, self.draw_at(event)).await?)
    }

    async fn draw_record(&self, event: &EventId) -> Result<Option<DrawRecord>, StoreError> {
        let key = draw_key(&self.namespace, event);
        let fields: std::collections::HashMap<String, String> =
            self.call(|| self.client.hgetall(&key)).await?;
        let Some(seed) = fields.get("seed") else {
            return Ok(None);
        };
        let done = match fields.get("done") {
            Some(s) => Some(
                DrawDone::decode(s)
                    .ok_or_else(|| StoreError::Protocol(format!("bad draw record {s:?}")))?,
            ),
            None => None,
        };
        Ok(Some(DrawRecord {
            seed: seed.clone(),
            done,
        }))
    }

    async fn finish_draw(&self, event: &EventId, d: &DrawDone) -> Result<DrawDone, StoreError> {
        let step = steps::FinishDraw { done: d.encode() };
        done(&self.run(step, self.draw_at(event)).await?)
    }

    async fn enter(
        &self,
        event: &EventId,
        shard: u32,
        users: &[UserId],
    ) -> Result<Vec<EnterReply>, StoreError> {
        let at = self.shard_keys(event, shard, &["ent", "shut"]);
        let keys = self.keys_for(steps::ENTER, at, false);
        let args = users.iter().map(UserId::to_string).collect();
        let script = self.scripts.get(steps::ENTER);
        let codes = self.eval(script, keys, args).await?.into_array();
        if codes.len() == 1 && text(&codes[0])? == reply::CLOSED {
            return Ok(vec![EnterReply::Closed; users.len()]);
        }
        if codes.len() != users.len() {
            return Err(StoreError::Protocol(format!(
                "enter: {} answers for {} users",
                codes.len(),
                users.len()
            )));
        }
        codes
            .iter()
            .map(|c| match text(c)?.as_str() {
                reply::ENTERED => Ok(EnterReply::New),
                reply::ENTERED_BEFORE => Ok(EnterReply::Already),
                other => Err(unknown("enter", other)),
            })
            .collect()
    }

    async fn close_entries(&self, event: &EventId, shard: u32) -> Result<u64, StoreError> {
        let at = self.shard_keys(event, shard, &["ent", "shut"]);
        num(&self.run(steps::CloseEntries {}, at).await?)
    }

    async fn entries_page(
        &self,
        event: &EventId,
        shard: u32,
        after: Option<&UserId>,
        limit: u32,
    ) -> Result<Vec<UserId>, StoreError> {
        if limit == 0 {
            return Ok(Vec::new());
        }
        let step = steps::EntriesPage {
            after: after.map(|u| u.to_string()).unwrap_or_default(),
            limit,
        };
        let at = self.shard_keys(event, shard, &["ent"]);
        match self.run(step, at).await? {
            Value::Array(parts) => parts.iter().map(user).collect(),
            other => Err(protocol("array", &other)),
        }
    }

    async fn entry_count(&self, event: &EventId, shard: u32) -> Result<u64, StoreError> {
        let step = steps::EntriesPage {
            after: String::new(),
            limit: 0,
        };
        num(&self
            .run(step, self.shard_keys(event, shard, &["ent"]))
            .await?)
    }

    async fn write_ranks(
        &self,
        event: &EventId,
        shard: u32,
        ranks: &[(UserId, u64)],
    ) -> Result<(), StoreError> {
        let key = entry_key(&self.namespace, event, shard, "rank");
        for chunk in ranks.chunks(RANKS_PER_CALL) {
            let values: Vec<(String, String)> = chunk
                .iter()
                .map(|(u, r)| (u.to_string(), r.to_string()))
                .collect();
            self.call(|| self.client.hset::<(), _, _>(&key, values.clone()))
                .await?;
        }
        Ok(())
    }

    async fn entry_rank(
        &self,
        event: &EventId,
        shard: u32,
        user: &UserId,
    ) -> Result<Option<Option<u64>>, StoreError> {
        let step = steps::EntryRank {
            user: user.to_string(),
        };
        let parts = self
            .run(step, self.shard_keys(event, shard, &["ent", "rank"]))
            .await?
            .into_array();
        if num(arg(&parts, 0)?)? == 0 {
            return Ok(None);
        }
        match parts.get(1) {
            None => Ok(Some(None)),
            Some(v) => {
                let s = text(v)?;
                let rank = s
                    .parse()
                    .map_err(|_| StoreError::Protocol(format!("bad rank {s:?}")))?;
                Ok(Some(Some(rank)))
            }
        }
    }
}
