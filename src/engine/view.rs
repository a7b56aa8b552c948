//! Views of an event: per-bucket remaining, totals, skew.

use futures::future::try_join_all;
use serde::Serialize;

use super::{Engine, EngineError};
use crate::domain::ids::EventId;
use crate::domain::keys::BucketRef;
use crate::domain::model::{BucketRange, BucketState, EventMeta, EventStatus};
use crate::domain::token::Access;
use crate::store::{OpenTransfer, Store, StoreError};

/// One bucket of an event view.
#[derive(Debug, Clone, PartialEq, Serialize, utoipa::ToSchema)]
pub struct BucketView {
    pub index: u32,
    pub remaining: u64,
}

/// The event as `GET /v1/events/{id}` shows it.
#[derive(Debug, Clone, PartialEq, Serialize, utoipa::ToSchema)]
pub struct EventView {
    pub id: EventId,
    pub stock: u64,
    /// Units still for sale: in buckets plus in transfer between them.
    pub remaining: u64,
    /// `stock - remaining - waiting`: units sold and not cancelled (held
    /// units included).
    pub sold: u64,
    /// A drawn draw event's units set aside for its waiting list or offered
    /// to it: not on open sale, not sold (absent when none).
    #[serde(skip_serializing_if = "is_zero")]
    pub waiting: u64,
    /// Units in live holds (events with `hold_seconds`): taken, not yet
    /// confirmed; not in `remaining` (they cannot be bought now) and back in
    /// it if their hold expires.
    pub held: u64,
    pub buckets: Vec<BucketView>,
    pub bucket_count: u32,
    /// Max bucket remaining ÷ mean bucket remaining (1.0 = even, also when empty).
    pub skew: f64,
    /// `on_sale`, `sold_out`, `scheduled`, `ended`, `creating`, `resharding` or `closed`.
    #[schema(value_type = String, pattern = "^(on_sale|sold_out|scheduled|ended|creating|resharding|closed)$")]
    pub status: &'static str,
    pub in_transfer: u64,
    /// Units one user may hold at most; null: no limit.
    #[schema(minimum = 0, maximum = 4294967295_u64, format = Int64)]
    pub per_user_limit: Option<u32>,
    pub max_per_order: u32,
    /// The sale opens (RFC 3339); null: on sale from creation.
    #[serde(with = "crate::domain::model::rfc3339_ms")]
    #[schema(value_type = Option<String>, format = DateTime)]
    pub starts_at: Option<i64>,
    /// The sale ends (RFC 3339); null: no end.
    #[serde(with = "crate::domain::model::rfc3339_ms")]
    #[schema(value_type = Option<String>, format = DateTime)]
    pub ends_at: Option<i64>,
    /// Bumped by every reshard.
    pub generation: u32,
    /// Units left unsold at the end of the sale (closed events).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub leftover: Option<u64>,
    /// Purchases are holds confirmed within this many seconds (absent: none).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub hold_seconds: Option<u32>,
    /// The bounds of an adaptive bucket count (created with `"auto"` or
    /// `{min, max}`; absent: the count stays as set); `bucket_count` is where
    /// it is now.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub auto_buckets: Option<BucketRange>,
    /// `open` (anyone may buy) or `token` (a purchase carries an access
    /// token; the keys are never shown).
    pub access: Access,
    /// `draw` events: the entry window, the draw's settings, the seed's
    /// hash, the entries so far and, once drawn, the result.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub draw: Option<super::DrawView>,
    /// The event's layouts over time, oldest first, the current one last
    /// (the last 32: creation, then each reshard with its reason).
    pub bucket_history: Vec<LayoutView>,
}

/// One layout of an event's history.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, utoipa::ToSchema)]
pub struct LayoutView {
    pub generation: u32,
    pub buckets: u32,
    /// When the event moved to it (RFC 3339).
    #[serde(with = "crate::domain::model::rfc3339_ms")]
    #[schema(value_type = Option<String>, format = DateTime)]
    pub at: Option<i64>,
    /// `created`, or the reshard's: `manual`, `config`, `resumed` (a stalled
    /// reshard finished by the leader), or the adaptive policy's `hot`,
    /// `spread`, `drain`.
    pub reason: String,
}

/// Max ÷ mean of the buckets' remaining units; 1.0 when all are empty.
pub fn skew(remaining: &[u64]) -> f64 {
    let total: u64 = remaining.iter().sum();
    if total == 0 || remaining.is_empty() {
        return 1.0;
    }
    let mean = total as f64 / remaining.len() as f64;
    remaining.iter().copied().max().unwrap_or(0) as f64 / mean
}

fn is_zero(n: &u64) -> bool {
    *n == 0
}

impl EventView {
    pub fn new(meta: &EventMeta, states: &[BucketState], now: i64) -> Self {
        let stocks: Vec<u64> = states.iter().map(|s| s.stock).collect();
        let in_transfer: u64 = states.iter().map(|s| s.in_transfer).sum();
        let remaining = stocks.iter().sum::<u64>() + in_transfer;
        let waiting: u64 = states.iter().map(|s| s.waiting).sum();
        let spec = &meta.spec;
        let status = match meta.status {
            EventStatus::OnSale if remaining == 0 => "sold_out",
            EventStatus::OnSale if spec.starts_at.is_some_and(|s| now < s) => "scheduled",
            EventStatus::OnSale if spec.ends_at.is_some_and(|e| now >= e) => "ended",
            other => other.as_str(),
        };
        Self {
            id: spec.id.clone(),
            stock: spec.stock,
            remaining,
            sold: spec.stock.saturating_sub(remaining + waiting),
            waiting,
            held: states.iter().map(|s| s.held).sum(),
            buckets: stocks
                .iter()
                .enumerate()
                .map(|(i, &remaining)| BucketView {
                    index: i as u32,
                    remaining,
                })
                .collect(),
            bucket_count: spec.buckets,
            skew: skew(&stocks),
            status,
            in_transfer,
            per_user_limit: spec.per_user_limit,
            max_per_order: spec.max_per_order,
            starts_at: spec.starts_at,
            ends_at: spec.ends_at,
            generation: meta.generation,
            leftover: None,
            hold_seconds: spec.hold_seconds,
            auto_buckets: spec.auto_buckets,
            access: Access::of(spec),
            draw: None,
            bucket_history: meta
                .history
                .iter()
                .map(|c| LayoutView {
                    generation: c.generation,
                    buckets: c.buckets,
                    at: Some(c.at_ms),
                    reason: c.reason.clone(),
                })
                .collect(),
        }
    }
}

/// How many times a view reads the buckets again when a transfer moved
/// between its reads: at once, then after 1, 2, … up to
/// [`MOVED_PAUSE_MAX_MS`] ms each time (~0.23 s in all), so a mover moving
/// transfer after transfer leaves a gap to read in.
const MOVED_RETRIES: u32 = 32;
const MOVED_PAUSE_MAX_MS: u32 = 8;
/// And no longer than this in all: a read of a thousand buckets on a loaded
/// machine is slow, and 32 of them during a consolidation moving unit after
/// unit outlasted the request's time limit (a view answering
/// `backend-unavailable`).
const MOVED_BUDGET: std::time::Duration = std::time::Duration::from_millis(500);

impl<S: Store> Engine<S> {
    /// The open transfers out of each bucket with units in transfer, and
    /// whether each was delivered (its IN ran), read after `states`.
    async fn delivered_transfers(
        &self,
        meta: &EventMeta,
        states: &[BucketState],
    ) -> Result<Vec<(usize, OpenTransfer, bool)>, StoreError> {
        let mut out = Vec::new();
        for (b, state) in states.iter().enumerate() {
            if state.in_transfer == 0 {
                continue;
            }
            let source = Self::bucket(meta, b as u32);
            for t in self.store.open_transfers(&source).await? {
                let generation =
                    crate::domain::transfer::target_generation(&t.xid, meta.generation);
                let target = BucketRef::new(&meta.spec.id, generation, t.target);
                let delivered = self.store.delivered(&target, &t.xid).await?;
                out.push((b, t, delivered));
            }
        }
        Ok(out)
    }

    /// Every bucket's state, with a transfer cut off after its IN (a mover
    /// that died before CLEAR) counted once, as the audit does: it is still
    /// open in its source's journal while its units are already in the
    /// target's stock.
    ///
    /// Where one server holds every bucket they are read in one atomic call,
    /// and only an open transfer needs more. Elsewhere, a double collect: the
    /// buckets are read (each one atomic read, at its own instant), then the
    /// journals of those with units in transfer and whether each open
    /// transfer was delivered, then every bucket's addition count again. Every OUT and IN bumps its bucket's count, so the same
    /// counts mean no transfer moved units into or out of any bucket between
    /// its read and the last read; then a transfer whose IN ran is in its
    /// target's stock as read (its IN came before the target's read), and
    /// one whose IN did not is only in its source's journal. `None` when a
    /// count moved (a transfer read half-way: units counted twice or
    /// nowhere) or a transfer the snapshot saw open was cleared before its
    /// journal was read, so the caller reads again.
    async fn states_counted_once(
        &self,
        meta: &EventMeta,
    ) -> Result<Option<Vec<BucketState>>, StoreError> {
        let (mut states, at_once) = self.read_states(meta).await?;
        // One instant (one server read them all): no transfer is half-way
        // between two reads, only one cut off between its IN and CLEAR.
        if at_once && states.iter().all(|s| s.in_transfer == 0) {
            return Ok(Some(states));
        }
        let open = self.delivered_transfers(meta, &states).await?;
        let adds = try_join_all((0..meta.spec.buckets).map(|b| {
            let bucket = Self::bucket(meta, b);
            async move { self.store.counters(&bucket).await.map(|(adds, _)| adds) }
        }))
        .await?;
        if states.iter().zip(&adds).any(|(s, &a)| s.adds != a) {
            return Ok(None);
        }
        for (b, state) in states.iter_mut().enumerate() {
            if state.in_transfer == 0 {
                continue;
            }
            let out = open.iter().filter(|(source, ..)| *source == b);
            if out.clone().map(|(_, t, _)| t.units).sum::<u64>() < state.in_transfer {
                return Ok(None);
            }
            for (_, t, delivered) in out {
                if *delivered {
                    state.in_transfer = state.in_transfer.saturating_sub(t.units);
                }
            }
        }
        Ok(Some(states))
    }

    /// Every bucket's state under the event's current layout.
    pub async fn bucket_states(&self, meta: &EventMeta) -> Result<Vec<BucketState>, StoreError> {
        Ok(self.read_states(meta).await?.0)
    }

    /// Every bucket's state, and whether they were read at one instant (one
    /// call where one server holds every bucket, else one a bucket).
    async fn read_states(&self, meta: &EventMeta) -> Result<(Vec<BucketState>, bool), StoreError> {
        let buckets: Vec<BucketRef> = (0..meta.spec.buckets)
            .map(|b| Self::bucket(meta, b))
            .collect();
        if let Some(states) = self.store.bucket_states_at_once(&buckets).await {
            return Ok((states?, true));
        }
        let states = try_join_all(buckets.iter().map(|b| self.store.bucket_state(b))).await?;
        Ok((states, false))
    }

    /// The event with its buckets (and a draw event's draw), read now.
    pub async fn view(&self, event: &EventId) -> Result<EventView, EngineError> {
        let mut view = self.bucket_view(event).await?;
        if view.access == Access::Draw {
            let meta = self.meta(event).await?;
            view.draw = Some(self.draw_view_of(&meta).await?);
        }
        Ok(view)
    }

    async fn bucket_view(&self, event: &EventId) -> Result<EventView, EngineError> {
        let mut meta = self.meta(event).await?;
        let mut moved = 0;
        let mut tries = 0;
        let mut checked = false;
        let started = std::time::Instant::now();
        while tries < 3 {
            let states = match self.states_counted_once(&meta).await {
                Ok(Some(states)) => Ok(states),
                // A transfer moved while the buckets were read: again (a
                // mover's step is short), at once and then a little later
                // each time.
                Ok(None) if moved < MOVED_RETRIES && started.elapsed() < MOVED_BUDGET => {
                    if moved > 0 {
                        let pause = moved.min(MOVED_PAUSE_MAX_MS);
                        tokio::time::sleep(std::time::Duration::from_millis(u64::from(pause)))
                            .await;
                    }
                    moved += 1;
                    continue;
                }
                // Past the tries (or the budget) the last snapshot stands,
                // counted as read.
                Ok(None) => {
                    tracing::debug!(%event, "transfers kept moving while the view read: counted as read");
                    self.bucket_states(&meta).await
                }
                Err(e) => Err(e),
            };
            match states {
                // A sealed bucket: a layout another instance resharded away
                // since this one cached it (its units are in the new layout;
                // counted here they would read as sold), or one sealed in
                // place (a partial loss). The stored meta tells which.
                Ok(states) if !checked && states.iter().any(|s| s.sealed) => {
                    checked = true;
                    let now = self.reload(event).await?;
                    if now.generation != meta.generation || now.status != meta.status {
                        meta = now;
                    } else {
                        return Ok(EventView::new(&meta, &states, self.clock.now_ms()));
                    }
                }
                Ok(states) => return Ok(EventView::new(&meta, &states, self.clock.now_ms())),
                Err(StoreError::Stale(_)) => {
                    meta = self.after_reshard(event).await?;
                    tries += 1;
                }
                Err(e) => return Err(e.into()),
            }
        }
        Err(StoreError::Stale(format!("layout of {event}")).into())
    }
}

#[cfg(test)]
mod tests {
    use super::skew;

    #[test]
    fn skew_is_max_over_mean() {
        assert_eq!(skew(&[5, 5, 5, 5]), 1.0);
        assert_eq!(skew(&[8, 0, 0, 0]), 4.0);
        assert_eq!(skew(&[0, 0]), 1.0);
        assert!((skew(&[3, 1]) - 1.5).abs() < 1e-9);
    }
}
