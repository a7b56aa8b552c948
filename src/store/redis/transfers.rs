//! Fenced transfers on Redis: the journal `xfer` in the source bucket, the
//! applied set `xin` in the target, the `fence` in both, and the event's
//! settled tokens `xsettled` (what the buckets may forget).

use fred::prelude::*;

use super::scripts::reply;
use super::steps;
use super::{At, RedisStore, arg, code, is_stale, num, unavailable, unknown};
use crate::domain::ids::EventId;
use crate::domain::keys::BucketRef;
use crate::domain::transfer::{Forget, InEntry, OutEntry};
use crate::store::{OpenTransfer, StoreError, TransferReply, Transfers};

use super::steps::prelude::*;

steps! {
    /// OUT: units leave a bucket into the transfer journal.
    TransferOut = transfer_out {
        keys: [b(Bk::Stock), b(Bk::Xfer), b(Bk::Fence), b(Bk::Sealed), b(Bk::Adds)],
        argv: { token: u64, xid: String, units: u64, entry: String, sealed_ok: bool },
        reply: Reply::Codes(&[
            reply::STALE, reply::FENCED, reply::DUPLICATE, reply::APPLIED, reply::SHORT_STOCK,
        ]),
        writes: [Transfer],
    }
    /// A new leader's token, raised on a bucket.
    RaiseFence = raise_fence {
        keys: [b(Bk::Fence), b(Bk::Xfer), b(Bk::Xin), b(Bk::Stock)],
        argv: { token: u64, mover_below: u64, reshard_below: u64 },
        reply: Reply::Number,
        writes: [],
    }
    /// Notes the token below which a layout's transfers are all closed.
    SettleTransfers = settle_transfers {
        keys: [K::Event(Xsettled)],
        argv: { generation: u32, token: u64 },
        reply: Reply::Flag,
        writes: [],
    }
    /// IN: units arrive, once per transfer id.
    TransferIn = transfer_in {
        keys: [b(Bk::Stock), b(Bk::Xin), b(Bk::Fence), b(Bk::Adds), b(Bk::Sealed)],
        argv: { token: u64, xid: String, units: u64, entry: String, sealed_ok: bool },
        reply: Reply::Codes(&[reply::STALE, reply::FENCED, reply::DUPLICATE, reply::APPLIED]),
        writes: [Transfer],
    }
    /// Closes a transfer's journal entry.
    TransferClear = transfer_clear {
        keys: [b(Bk::Stock), b(Bk::Xfer), b(Bk::Fence)],
        argv: { token: u64, xid: String, open: String, done: String },
        reply: Reply::Codes(&[
            reply::STALE, reply::FENCED, reply::DUPLICATE, reply::APPLIED, reply::CHANGED,
        ]),
        writes: [Transfer],
    }
}

/// Calls a transfer step makes at most when the bucket answers that what it
/// was given no longer matches (SH, CH): each answer is the bucket's state,
/// so a second call nearly always applies.
const ASKS: usize = 16;

impl RedisStore {
    /// `transfer_out.lua`, optionally allowed on a sealed bucket.
    async fn out_step(
        &self,
        bucket: &BucketRef,
        token: u64,
        xid: &str,
        target: u32,
        units: u64,
        sealed_ok: bool,
    ) -> Result<TransferReply, StoreError> {
        // The journal entry is encoded here for the units asked; a bucket
        // holding fewer answers how many, and is asked again for those (its
        // stock only moves under this fence, or down by purchases).
        let mut units = units;
        for _ in 0..ASKS {
            let entry = OutEntry {
                target,
                units,
                token,
                open: true,
            };
            let step = steps::TransferOut {
                token,
                xid: xid.to_owned(),
                units,
                entry: entry.encode(),
                sealed_ok,
            };
            let parts = self.run_bucket(bucket, step).await?;
            if code(&parts)? == reply::SHORT_STOCK {
                units = num(arg(&parts, 1)?)?;
                continue;
            }
            return transfer_reply("transfer_out", &parts);
        }
        Err(StoreError::Protocol(format!(
            "transfer_out {xid}: the stock moved under {ASKS} calls"
        )))
    }
}

impl RedisStore {
    /// `transfer_in.lua`, optionally allowed on a sealed bucket.
    async fn in_step(
        &self,
        bucket: &BucketRef,
        token: u64,
        xid: &str,
        source: u32,
        units: u64,
        sealed_ok: bool,
    ) -> Result<TransferReply, StoreError> {
        let step = steps::TransferIn {
            token,
            xid: xid.to_owned(),
            units,
            entry: InEntry { source, units }.encode(),
            sealed_ok,
        };
        let parts = self.run_bucket(bucket, step).await?;
        transfer_reply("transfer_in", &parts)
    }
}

impl Transfers for RedisStore {
    async fn transfer_out(
        &self,
        bucket: &BucketRef,
        token: u64,
        xid: &str,
        target: u32,
        units: u64,
    ) -> Result<TransferReply, StoreError> {
        self.out_step(bucket, token, xid, target, units, false)
            .await
    }

    async fn drain_out(
        &self,
        bucket: &BucketRef,
        token: u64,
        xid: &str,
        target: u32,
        units: u64,
    ) -> Result<TransferReply, StoreError> {
        self.out_step(bucket, token, xid, target, units, true).await
    }

    async fn raise_fence(
        &self,
        bucket: &BucketRef,
        token: u64,
        forget: Forget,
    ) -> Result<u64, StoreError> {
        let step = steps::RaiseFence {
            token,
            mover_below: forget.mover_below,
            reshard_below: forget.reshard_below,
        };
        let v = self.run(step, At::Bucket(bucket)).await?;
        if is_stale(&v) {
            return Err(StoreError::Stale(bucket.tag()));
        }
        num(&v)
    }

    async fn settled_transfers(&self, event: &EventId) -> Result<Vec<(u32, u64)>, StoreError> {
        let all = self.hash(self.event_keys(event).xsettled).await?;
        all.into_iter()
            .map(|(g, t)| match (g.parse(), t.parse()) {
                (Ok(g), Ok(t)) => Ok((g, t)),
                _ => Err(StoreError::Protocol(format!(
                    "bad settled transfers {g:?}: {t:?}"
                ))),
            })
            .collect()
    }

    async fn settle_transfers(
        &self,
        event: &EventId,
        generation: u32,
        token: u64,
    ) -> Result<(), StoreError> {
        let step = steps::SettleTransfers { generation, token };
        self.run_flag(step, At::Event(event)).await.map(drop)
    }

    async fn transfer_in(
        &self,
        bucket: &BucketRef,
        token: u64,
        xid: &str,
        source: u32,
        units: u64,
    ) -> Result<TransferReply, StoreError> {
        self.in_step(bucket, token, xid, source, units, false).await
    }

    async fn complete_in(
        &self,
        bucket: &BucketRef,
        token: u64,
        xid: &str,
        source: u32,
        units: u64,
    ) -> Result<TransferReply, StoreError> {
        self.in_step(bucket, token, xid, source, units, true).await
    }

    async fn transfer_clear(
        &self,
        bucket: &BucketRef,
        token: u64,
        xid: &str,
    ) -> Result<TransferReply, StoreError> {
        // The entry is read first: its tombstone is encoded here, and the
        // script stores it only over the entry read (else it answers CH).
        for _ in 0..ASKS {
            let read: Option<String> = self
                .call(|| self.client.hget(self.keys(bucket).xfer, xid))
                .await?;
            let open = read
                .as_deref()
                .and_then(OutEntry::decode)
                .filter(|e| e.open);
            let step = steps::TransferClear {
                token,
                xid: xid.to_owned(),
                open: open.map(|e| e.encode()).unwrap_or_default(),
                done: open
                    .map(|e| OutEntry { open: false, ..e }.encode())
                    .unwrap_or_default(),
            };
            let parts = self.run_bucket(bucket, step).await?;
            if code(&parts)? == reply::CHANGED {
                continue;
            }
            return transfer_reply("transfer_clear", &parts);
        }
        Err(StoreError::Protocol(format!(
            "transfer_clear {xid}: the journal entry moved under {ASKS} calls"
        )))
    }

    async fn open_transfers(&self, bucket: &BucketRef) -> Result<Vec<OpenTransfer>, StoreError> {
        let mut open = Vec::new();
        for (xid, v) in self.hash(self.keys(bucket).xfer).await? {
            let entry = OutEntry::decode(&v)
                .ok_or_else(|| StoreError::Protocol(format!("bad journal entry {v:?}")))?;
            if entry.open {
                open.push(OpenTransfer {
                    xid,
                    target: entry.target,
                    units: entry.units,
                    token: entry.token,
                });
            }
        }
        Ok(open)
    }

    async fn delivered(&self, bucket: &BucketRef, xid: &str) -> Result<bool, StoreError> {
        self.client
            .hexists(self.keys(bucket).xin, xid)
            .await
            .map_err(unavailable)
    }
}

/// `{code, units}` of the three transfer scripts.
fn transfer_reply(step: &str, parts: &[Value]) -> Result<TransferReply, StoreError> {
    let n = num(arg(parts, 1)?)?;
    match code(parts)?.as_str() {
        reply::APPLIED => Ok(TransferReply::Applied(n)),
        reply::DUPLICATE => Ok(TransferReply::Duplicate(n)),
        reply::FENCED => Ok(TransferReply::Fenced { highest: n }),
        other => Err(unknown(step, other)),
    }
}
