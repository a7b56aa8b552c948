//! A pool's reshard or close meets the release orders under way: the
//! orders that may have a take in the layout being sealed are decided and
//! that take given back before the layout is emptied or counted.
//!
//! A reshard moves stock and users' records into a new layout, but not a
//! release line's markers; a close turns what the layout holds into its
//! final counts. Either way, a take in the sealed layout by an order still
//! pending or refused would be missed: an undo after the switch walks the
//! new layout (the units lost for good), and a commit or undo after the
//! close acts on a pool whose counts are written. So after sealing, and
//! before anything moves or is counted, `settle_pool_orders` lists the
//! release's orders not ended (every home's `pend`: `P` and `R`), aborts
//! each pending one whose line in the pool has a take in the sealed layout
//! (the sweeper's compare-and-set: a driver that committed first wins, and
//! its takes stand), and undoes that line of each refused one there
//! (`undo_line` works on sealed buckets). A pending order with no take
//! there goes on: its walk reads the new layout before its record. Afterwards the sealed layout holds no take of an order
//! not bought, and none can be added (a sealed bucket takes nothing). The
//! order's other lines and its release are left to its driver, a retry or
//! the sweeper, which undo this line again in the layout current then
//! (`undo_walk`), closing it to a late walk there. docs/DESIGN.md,
//! "Releases" (As built), says why no walk takes after that.

use futures::future::try_join_all;

use super::release::OrderRun;
use super::{Engine, EngineError};
use crate::domain::keys::HomeRef;
use crate::domain::model::EventMeta;
use crate::domain::release::{HomeRecord, Line, line_order_id};
use crate::domain::stream::RecordKind;
use crate::store::{Decided, Store};

impl<S: Store> Engine<S> {
    /// Ends in the layout of `meta` (sealed: a reshard's old layout, or a
    /// closing event's current one) the release orders not ended that have
    /// a line in this pool; see the module docs. Idempotent. Returns how
    /// many orders had the line undone (0 for an event that is no pool).
    pub async fn settle_pool_orders(&self, meta: &EventMeta) -> Result<u32, EngineError> {
        let event = &meta.spec.id;
        let Some(release) = self.pool_release(event).await? else {
            return Ok(0);
        };
        let spec = self.release_spec(&release).await?;
        let pool_name = event.as_str().split_once('.').map_or("", |(_, p)| p);
        let Some(k) = spec.pool_index(pool_name) else {
            return Ok(0);
        };
        let mut undone = 0;
        for h in 0..spec.homes {
            let home = HomeRef::new(&spec.id, h);
            // Every order not ended, whenever it started.
            for (rid, record) in self.store.stale_orders(&home, i64::MAX, u32::MAX).await? {
                let Some(head) = record.head().cloned() else {
                    continue;
                };
                let Some(line) = head.lines.iter().find(|l| l.pool as usize == k).cloned() else {
                    continue;
                };
                let run = OrderRun {
                    spec: spec.clone(),
                    home: home.clone(),
                    rid,
                    head,
                };
                let refused = match record {
                    // No take here: its walk goes on in the new layout
                    // (one read before the record, `walk_line`), and an
                    // abort after the switch undoes it there.
                    HomeRecord::Pending(_) if !self.line_taken_in(&run, &line, meta).await? => {
                        false
                    }
                    HomeRecord::Pending(_) => {
                        let refused = HomeRecord::Refused(run.head.clone(), Vec::new());
                        match self
                            .store
                            .abort_order(&run.home, &run.rid, &run.pending(), &refused)
                            .await?
                        {
                            Decided::Done
                            | Decided::Found(HomeRecord::Refused(..) | HomeRecord::Released(..)) => {
                                true
                            }
                            // Bought first: its takes stand.
                            Decided::Found(_) | Decided::NoRecord => false,
                        }
                    }
                    HomeRecord::Refused(..) => true,
                    _ => false,
                };
                if refused {
                    self.undo_in(&run, &line, meta, RecordKind::Void).await?;
                    undone += 1;
                }
            }
        }
        if undone > 0 {
            tracing::info!(pool = %event, generation = meta.generation, undone, "release orders settled in a sealed layout");
        }
        Ok(undone)
    }

    /// Whether the order's line has a take in the layout of `meta` (any
    /// bucket, any pass): read-only, on sealed buckets too.
    async fn line_taken_in(
        &self,
        run: &OrderRun,
        line: &Line,
        meta: &EventMeta,
    ) -> Result<bool, EngineError> {
        let oid = line_order_id(&run.head.order_id, &run.spec.id, &run.pool(line));
        let rid = run.line_rid();
        let passes = self.opts.max_passes;
        let found = try_join_all((0..meta.spec.buckets).map(|j| {
            let bucket = Self::bucket(meta, j);
            let rid = &rid;
            async move { self.store.take_markers(&bucket, rid, passes).await }
        }))
        .await?;
        Ok(found.iter().flatten().any(|(_, taken)| *taken == oid))
    }
}
