//! The `draw` access mode's engine side: the seed's commitment at create,
//! entries, the draw itself (exactly once in effect) and each entrant's
//! standing with a winner's token.
//!
//! The draw (docs/API.md, "Draws"): every entry shard is closed first (an
//! entry landing after is refused by the store's step), then read whole;
//! the entrants are ordered by `domain::draw::order` under the seed, each
//! one's rank written to its shard, and only then the draw's record, by
//! compare-and-set. The order is a function of the seed and the entrants
//! alone, so a draw interrupted half-way is redone to the same ranks, and
//! two instances drawing at once write the same ones; the first record
//! (its `drawn_at`) stands for both. A winner's token is minted statelessly
//! with the `token` mode's `mint` each time it is asked: the same token.

use futures::future::try_join_all;
use serde::Serialize;

use super::{Engine, EngineError};
use crate::domain::draw::{
    self, DrawDone, DrawSpec, ENTRY_SHARDS, MAX_ENTRIES_PAGE, OfferStanding, Standing, entry_shard,
};
use crate::domain::ids::{EventId, UserId};
use crate::domain::model::{EventMeta, EventSpec};
use crate::domain::token::mint;
use crate::metrics::{DRAW_ENTRIES, DRAW_WINNERS};
use crate::store::{DrawRecord, EnterReply, Store, StoreError};

/// A draw as its event's view and `GET /v1/events/{id}/draw` show it.
#[derive(Debug, Clone, PartialEq, Serialize, utoipa::ToSchema)]
pub struct DrawView {
    /// Entries are refused from then on (RFC 3339).
    #[serde(with = "crate::domain::model::rfc3339_ms")]
    #[schema(value_type = Option<String>, format = DateTime)]
    pub entries_until: Option<i64>,
    /// The leader draws then (RFC 3339); absent: only the admin call draws.
    #[serde(
        with = "crate::domain::model::rfc3339_ms",
        skip_serializing_if = "Option::is_none"
    )]
    #[schema(value_type = Option<String>, format = DateTime)]
    pub draw_at: Option<i64>,
    /// Winners per unit of stock (read to the thousandth).
    pub oversubscription: f64,
    /// Units a winner's token buys.
    pub allowance: u32,
    /// A winner's token expires this long after the draw.
    pub buy_seconds: u32,
    /// A waiting user's offer is open this long.
    pub offer_seconds: u32,
    /// Lowercase hex SHA-256 of the seed's 32 bytes, published at creation.
    #[schema(min_length = 64, max_length = 64)]
    pub seed_hash: String,
    /// The seed (64 lowercase hex), once drawn; never before.
    #[serde(skip_serializing_if = "Option::is_none")]
    #[schema(min_length = 64, max_length = 64)]
    pub seed: Option<String>,
    /// Entrants so far (all of them, once drawn).
    pub entries: u64,
    /// Entrants who won, once drawn.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub winners: Option<u64>,
    /// When the draw was made (RFC 3339), once drawn.
    #[serde(
        with = "crate::domain::model::rfc3339_ms",
        skip_serializing_if = "Option::is_none"
    )]
    #[schema(value_type = Option<String>, format = DateTime)]
    pub drawn_at: Option<i64>,
}

/// Where an entrant stands, and a winner's token.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct EntryStatus {
    pub user: UserId,
    pub standing: Standing,
    /// A winner's token and its expiry (unix ms).
    pub token: Option<(String, i64)>,
    /// A waiting user's: what became of its place in line.
    pub offer: Option<OfferStanding>,
}

impl DrawView {
    fn new(spec: &DrawSpec, record: Option<&DrawRecord>, entries: u64) -> Self {
        let done = record.and_then(|r| r.done);
        Self {
            entries_until: Some(spec.entries_until),
            draw_at: spec.draw_at,
            oversubscription: spec.oversubscription(),
            allowance: spec.allowance,
            buy_seconds: spec.buy_seconds,
            offer_seconds: spec.offer_seconds,
            seed_hash: spec.seed_hash.clone(),
            seed: done.and(record.map(|r| r.seed.clone())),
            entries: done.map_or(entries, |d| d.entries),
            winners: done.map(|d| d.winners),
            drawn_at: done.map(|d| d.drawn_at_ms),
        }
    }
}

/// The event's draw settings, or `NotADraw`.
fn draw_of(meta: &EventMeta) -> Result<&DrawSpec, EngineError> {
    meta.spec
        .draw
        .as_ref()
        .ok_or_else(|| EngineError::NotADraw(meta.spec.id.clone()))
}

impl<S: Store> Engine<S> {
    /// The commit of a draw event's create: keeps a fresh seed (or the one
    /// a create of the same event kept before) and puts its hash in the
    /// spec. Nothing for another event.
    pub async fn commit_draw(&self, spec: &mut EventSpec) -> Result<(), EngineError> {
        let Some(d) = spec.draw.as_mut() else {
            return Ok(());
        };
        let seed = self.store.init_draw(&spec.id, &draw::new_seed()).await?;
        d.seed_hash = draw::seed_hash(&seed)
            .ok_or_else(|| StoreError::Protocol(format!("bad seed kept for {}", spec.id)))?;
        Ok(())
    }

    /// Enters `user` in `event`'s draw: `true` when entered now, `false`
    /// when entered before. One store step.
    pub async fn enter(&self, event: &EventId, user: &UserId) -> Result<bool, EngineError> {
        let meta = self.meta(event).await?;
        let spec = draw_of(&meta)?;
        if self.clock.now_ms() >= spec.entries_until {
            return Err(EngineError::EntriesClosed(event.clone()));
        }
        let shard = entry_shard(user);
        let reply = match &self.entries {
            Some(batcher) => batcher.enter(event, shard, user.clone()).await?,
            None => {
                let mut one = self
                    .store
                    .enter(event, shard, std::slice::from_ref(user))
                    .await?;
                one.pop()
                    .ok_or_else(|| StoreError::Protocol("enter answered no entry".into()))?
            }
        };
        match reply {
            EnterReply::New => {
                metrics::counter!(DRAW_ENTRIES, "event" => event.to_string()).increment(1);
                Ok(true)
            }
            EnterReply::Already => Ok(false),
            EnterReply::Closed => Err(EngineError::EntriesClosed(event.clone())),
        }
    }

    /// The draw of a draw event, read now.
    pub async fn draw_view(&self, event: &EventId) -> Result<DrawView, EngineError> {
        let meta = self.meta(event).await?;
        self.draw_view_of(&meta).await
    }

    pub(super) async fn draw_view_of(&self, meta: &EventMeta) -> Result<DrawView, EngineError> {
        let spec = draw_of(meta)?;
        let event = &meta.spec.id;
        let record = self.store.draw_record(event).await?;
        let entries = if record.as_ref().is_some_and(|r| r.done.is_some()) {
            0
        } else {
            try_join_all((0..ENTRY_SHARDS).map(|k| self.store.entry_count(event, k)))
                .await?
                .into_iter()
                .sum()
        };
        Ok(DrawView::new(spec, record.as_ref(), entries))
    }

    /// Draws `event`, once: a draw done answers its record again. Refused
    /// before the entry window closes.
    pub async fn draw(&self, event: &EventId) -> Result<DrawView, EngineError> {
        let meta = self.meta(event).await?;
        let spec = draw_of(&meta)?;
        let now = self.clock.now_ms();
        if now < spec.entries_until {
            return Err(EngineError::DrawNotDue {
                event: event.clone(),
                entries_until: spec.entries_until,
            });
        }
        let record = self
            .store
            .draw_record(event)
            .await?
            .ok_or_else(|| StoreError::Protocol(format!("no seed kept for draw {event}")))?;
        if record.done.is_some() {
            return Ok(DrawView::new(spec, Some(&record), 0));
        }
        // Every shard closed before any is read: what is read is final.
        try_join_all((0..ENTRY_SHARDS).map(|k| self.store.close_entries(event, k))).await?;
        let shards = try_join_all((0..ENTRY_SHARDS).map(|k| self.all_entries(event, k))).await?;
        let entrants: Vec<UserId> = shards.into_iter().flatten().collect();
        let entries = entrants.len() as u64;
        let seed = record.seed.clone();
        let ordered = tokio::task::spawn_blocking(move || draw::order(&seed, entrants))
            .await
            .map_err(|e| StoreError::Protocol(format!("the draw's task failed: {e}")))?
            .ok_or_else(|| StoreError::Protocol(format!("bad seed kept for draw {event}")))?;
        let mut ranks: Vec<Vec<(UserId, u64)>> = vec![Vec::new(); ENTRY_SHARDS as usize];
        for (i, user) in ordered.iter().enumerate() {
            ranks[entry_shard(user) as usize].push((user.clone(), i as u64 + 1));
        }
        let mut ranks_order = ordered;
        try_join_all(
            ranks
                .iter()
                .enumerate()
                .map(|(k, r)| self.store.write_ranks(event, k as u32, r)),
        )
        .await?;
        let winners = spec.winners(meta.spec.stock).min(entries);
        // The waiting list is open (the buckets' returned units go aside,
        // the line is kept) before the record gives any winner a token.
        let waiting: Vec<UserId> = ranks_order.split_off(winners as usize);
        self.open_waitlist(&meta, waiting).await?;
        let done = DrawDone {
            drawn_at_ms: now,
            entries,
            winners,
        };
        let done = self.store.finish_draw(event, &done).await?;
        metrics::gauge!(DRAW_WINNERS, "event" => event.to_string()).set(done.winners as f64);
        tracing::info!(%event, entries = done.entries, winners = done.winners, "drawn");
        let record = DrawRecord {
            seed: record.seed,
            done: Some(done),
        };
        Ok(DrawView::new(spec, Some(&record), entries))
    }

    /// Every entrant of shard `k`, page by page.
    async fn all_entries(&self, event: &EventId, k: u32) -> Result<Vec<UserId>, StoreError> {
        let mut all: Vec<UserId> = Vec::new();
        loop {
            let page = self
                .store
                .entries_page(event, k, all.last(), MAX_ENTRIES_PAGE as u32)
                .await?;
            let last = page.len() < MAX_ENTRIES_PAGE;
            all.extend(page);
            if last {
                return Ok(all);
            }
        }
    }

    /// Where `user` stands in `event`'s draw; a winner's token with it.
    pub async fn entry_status(
        &self,
        event: &EventId,
        user: &UserId,
    ) -> Result<EntryStatus, EngineError> {
        let meta = self.meta(event).await?;
        let spec = draw_of(&meta)?;
        let rank = self
            .store
            .entry_rank(event, entry_shard(user), user)
            .await?
            .ok_or_else(|| EngineError::NotEntered {
                event: event.clone(),
                user: user.clone(),
            })?;
        let done = match rank {
            Some(_) => self.store.draw_record(event).await?.and_then(|r| r.done),
            None => None,
        };
        let (Some(rank), Some(done)) = (rank, done) else {
            return Ok(EntryStatus {
                user: user.clone(),
                standing: Standing::Entered,
                token: None,
                offer: None,
            });
        };
        let standing = Standing::of(rank, done.winners);
        let offer = match standing {
            Standing::Waiting(p) => Some(self.offer_standing(&meta, p, user).await?),
            _ => None,
        };
        let token = match (standing, meta.spec.tokens.as_ref()) {
            (Standing::Won, Some(access)) => {
                let key = access
                    .keys
                    .first()
                    .ok_or_else(|| StoreError::Protocol(format!("no key for draw {event}")))?;
                let expiry = spec.token_expiry(done.drawn_at_ms);
                Some((
                    mint(key, event, user.as_str(), spec.allowance, expiry),
                    expiry * 1000,
                ))
            }
            _ => None,
        };
        Ok(EntryStatus {
            user: user.clone(),
            standing,
            token,
            offer,
        })
    }

    /// Entrants of a drawn event in ascending id order after `after`, at
    /// most `limit` (1 to [`MAX_ENTRIES_PAGE`]): anyone recomputes the draw
    /// from them and the revealed seed. Refused before the draw.
    pub async fn entrants(
        &self,
        event: &EventId,
        after: Option<&UserId>,
        limit: usize,
    ) -> Result<Vec<UserId>, EngineError> {
        let meta = self.meta(event).await?;
        draw_of(&meta)?;
        let drawn = self
            .store
            .draw_record(event)
            .await?
            .is_some_and(|r| r.done.is_some());
        if !drawn {
            return Err(EngineError::NotDrawn(event.clone()));
        }
        let limit = limit.clamp(1, MAX_ENTRIES_PAGE);
        let pages = try_join_all(
            (0..ENTRY_SHARDS).map(|k| self.store.entries_page(event, k, after, limit as u32)),
        )
        .await?;
        let mut all: Vec<UserId> = pages.into_iter().flatten().collect();
        all.sort_unstable();
        all.truncate(limit);
        Ok(all)
    }
}
