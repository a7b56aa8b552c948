//! Fenced transfers in memory: a bucket's `xfer` journal, `xin` set and fence.

use super::{Bucket, Journal, MemoryStore};
use crate::domain::ids::EventId;
use crate::domain::keys::BucketRef;
use crate::domain::transfer::Forget;
use crate::store::{OpenTransfer, StoreError, TransferReply, Transfers};

impl Bucket {
    /// The fence check every transfer step (and a restore) starts with
    /// (raises the fence).
    pub(super) fn fence(&mut self, token: u64) -> Result<(), TransferReply> {
        if token < self.fence {
            return Err(TransferReply::Fenced {
                highest: self.fence,
            });
        }
        self.fence = token;
        Ok(())
    }

    /// The journal's fence check: raises the fence, and a raised fence drops
    /// the tombstones below it (`lua/transfer_out.lua`, `transfer_clear.lua`).
    fn journal_fence(&mut self, token: u64) -> Result<(), TransferReply> {
        let raised = token > self.fence;
        self.fence(token)?;
        if raised {
            self.xfer.retain(|_, j| j.open || j.token >= token);
        }
        Ok(())
    }

    /// OUT: stock into the journal (`lua/transfer_out.lua`).
    fn out(&mut self, token: u64, xid: &str, target: u32, units: u64) -> TransferReply {
        if let Err(fenced) = self.journal_fence(token) {
            return fenced;
        }
        if let Some(j) = self.xfer.get(xid) {
            return TransferReply::Duplicate(j.units);
        }
        let moved = units.min(self.stock);
        if moved > 0 {
            self.stock -= moved;
            self.adds += 1;
            self.xfer.insert(
                xid.to_owned(),
                Journal {
                    target,
                    units: moved,
                    token,
                    open: true,
                },
            );
        }
        TransferReply::Applied(moved)
    }

    /// IN: a transfer's units into the stock, once per id
    /// (`lua/transfer_in.lua`).
    fn take_in(&mut self, token: u64, xid: &str, units: u64) -> TransferReply {
        if let Err(fenced) = self.fence(token) {
            return fenced;
        }
        if let Some(&done) = self.xin.get(xid) {
            return TransferReply::Duplicate(done);
        }
        self.stock += units;
        self.adds += 1;
        self.xin.insert(xid.to_owned(), units);
        TransferReply::Applied(units)
    }
}

impl Transfers for MemoryStore {
    /// Mirrors `lua/transfer_out.lua`.
    async fn transfer_out(
        &self,
        b: &BucketRef,
        token: u64,
        xid: &str,
        target: u32,
        units: u64,
    ) -> Result<TransferReply, StoreError> {
        self.with_live(b, |bk| bk.out(token, xid, target, units))
    }

    /// Mirrors `lua/transfer_out.lua`, allowed on a sealed bucket.
    async fn drain_out(
        &self,
        b: &BucketRef,
        token: u64,
        xid: &str,
        target: u32,
        units: u64,
    ) -> Result<TransferReply, StoreError> {
        self.with(b, |bk| bk.out(token, xid, target, units))
    }

    /// Mirrors `lua/raise_fence.lua`.
    async fn raise_fence(
        &self,
        b: &BucketRef,
        token: u64,
        forget: Forget,
    ) -> Result<u64, StoreError> {
        self.with(b, |bk| {
            bk.fence = bk.fence.max(token);
            let fence = bk.fence;
            bk.xfer.retain(|_, j| j.open || j.token >= fence);
            bk.xin.retain(|xid, _| !forget.applied(xid));
            fence
        })
    }

    /// Mirrors the `HGETALL` of `xsettled`.
    async fn settled_transfers(&self, event: &EventId) -> Result<Vec<(u32, u64)>, StoreError> {
        Ok(self
            .with_event(event, |e| e.settled.iter().map(|(g, t)| (*g, *t)).collect())
            .unwrap_or_default())
    }

    /// Mirrors `lua/settle_transfers.lua`.
    async fn settle_transfers(
        &self,
        event: &EventId,
        generation: u32,
        token: u64,
    ) -> Result<(), StoreError> {
        self.with_event(event, |e| {
            let seen = e.settled.entry(generation).or_default();
            *seen = (*seen).max(token);
        });
        Ok(())
    }

    /// Mirrors `lua/transfer_in.lua`.
    async fn transfer_in(
        &self,
        b: &BucketRef,
        token: u64,
        xid: &str,
        _source: u32,
        units: u64,
    ) -> Result<TransferReply, StoreError> {
        self.with_live(b, |bk| bk.take_in(token, xid, units))
    }

    /// Mirrors `lua/transfer_in.lua`, allowed on a sealed bucket.
    async fn complete_in(
        &self,
        b: &BucketRef,
        token: u64,
        xid: &str,
        _source: u32,
        units: u64,
    ) -> Result<TransferReply, StoreError> {
        self.with(b, |bk| bk.take_in(token, xid, units))
    }

    /// Mirrors `lua/transfer_clear.lua`.
    async fn transfer_clear(
        &self,
        b: &BucketRef,
        token: u64,
        xid: &str,
    ) -> Result<TransferReply, StoreError> {
        self.with(b, |bk| {
            if let Err(fenced) = bk.journal_fence(token) {
                return fenced;
            }
            match bk.xfer.get_mut(xid) {
                None => TransferReply::Duplicate(0),
                Some(j) if !j.open => TransferReply::Duplicate(j.units),
                Some(j) => {
                    j.open = false;
                    TransferReply::Applied(j.units)
                }
            }
        })
    }

    async fn open_transfers(&self, b: &BucketRef) -> Result<Vec<OpenTransfer>, StoreError> {
        // A bucket that was never made (a reshard stopped before it made
        // every bucket of its layout) journals nothing: none open, as Redis
        // answers from the missing journal hash. It answered stale, and a
        // close taking over such an event failed (fault seed 5036 on memory).
        if matches!(self.bucket(b), Err(StoreError::Stale(_))) {
            return Ok(Vec::new());
        }
        self.with(b, |bk| {
            bk.xfer
                .iter()
                .filter(|(_, j)| j.open)
                .map(|(xid, j)| OpenTransfer {
                    xid: xid.clone(),
                    target: j.target,
                    units: j.units,
                    token: j.token,
                })
                .collect()
        })
    }

    /// The `xin` record `lua/transfer_in.lua` keeps.
    async fn delivered(&self, b: &BucketRef, xid: &str) -> Result<bool, StoreError> {
        self.with(b, |bk| bk.xin.contains_key(xid))
    }
}
