//! Named points in the long runs of the control plane (a reshard, a close,
//! the leader's pruning of retired layouts),
//! where a test can stop a run as if its process had died there, or pause it
//! as if it had stalled.
//!
//! A reshard or a close is many store steps; each must be safe to cut off
//! after any of them, and a run that stalls and wakes up late must not undo
//! what a newer run did. The steps between two checkpoints are what a test can
//! reach: [`inject`] registers a hook for one event, every run of that event
//! calls it at each [`Checkpoint`], and the hook answers [`Flow::Go`] (after
//! pausing as long as it likes) or [`Flow::Crash`]: the run then stops with
//! [`EngineError::InjectedCrash`] and leaves its work where it was, its mover
//! lease given back as if it had lapsed.
//!
//! Hooks are keyed by event id in one process-wide table, so tests running in
//! parallel on other events never see each other's hooks; without a hook a
//! checkpoint costs one read of an empty table.
//!
//! The hooks exist in test builds only (feature `fault-injection`, which the
//! tests turn on): the service's own build keeps the [`Checkpoint`] names the
//! runs mark, and [`reach`] does nothing there.

#[cfg(feature = "fault-injection")]
use std::collections::HashMap;
#[cfg(feature = "fault-injection")]
use std::sync::{Arc, LazyLock, RwLock};

#[cfg(feature = "fault-injection")]
use futures::future::BoxFuture;

use crate::domain::ids::EventId;
use crate::engine::EngineError;

/// Where a reshard or a close can be stopped.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Checkpoint {
    /// The reshard holds the mover lease, both layouts are fenced to its token
    /// and transfers a previous run left open are completed.
    ReshardFenced,
    /// The old layout is sealed and the sagas cut off there are settled.
    ReshardSealed,
    /// Before each write of user holdings, order entries or request records
    /// into the new layout.
    ReshardRestore,
    /// Everything the old buckets remember is in the new layout.
    ReshardRestored,
    /// After the OUT of the reshard's n-th transfer (1-based): its units sit
    /// in the old bucket's journal.
    ReshardOut(u32),
    /// After the reshard's n-th transfer is complete.
    ReshardMoved(u32),
    /// The old layout was found empty: right before the layout switch.
    ReshardSwitch,
    /// The close read the event, before it sets the status to `closed`.
    CloseBegin,
    /// The status is `closed`, the lease seized and every bucket fenced.
    CloseFenced,
    /// Every bucket is sealed.
    CloseSealed,
    /// Sagas are settled and leftovers recorded.
    CloseRetired,
    /// Every stream is drained into the ledger, before the ledger marks the
    /// event closed.
    CloseDrained,
    /// The rebalancer's leader found drained retired layouts, before it drops
    /// them from the meta.
    PruneRetired,
}

impl Checkpoint {
    /// Every point a test can crash a reshard at, in the order a run meets
    /// them (transfers: the first three).
    pub fn reshard_steps() -> Vec<Self> {
        let mut steps = vec![
            Self::ReshardFenced,
            Self::ReshardSealed,
            Self::ReshardRestore,
            Self::ReshardRestored,
        ];
        for n in 1..=3 {
            steps.extend([Self::ReshardOut(n), Self::ReshardMoved(n)]);
        }
        steps.push(Self::ReshardSwitch);
        steps
    }

    /// The name an injected crash reports.
    pub fn name(self) -> &'static str {
        match self {
            Self::ReshardFenced => "reshard: fenced",
            Self::ReshardSealed => "reshard: sealed",
            Self::ReshardRestore => "reshard: restore",
            Self::ReshardRestored => "reshard: restored",
            Self::ReshardOut(_) => "reshard: after a transfer's OUT",
            Self::ReshardMoved(_) => "reshard: after a transfer",
            Self::ReshardSwitch => "reshard: before the switch",
            Self::CloseBegin => "close: begin",
            Self::CloseFenced => "close: fenced",
            Self::CloseSealed => "close: sealed",
            Self::CloseRetired => "close: retired",
            Self::CloseDrained => "close: drained",
            Self::PruneRetired => "rebalancer: prune retired layouts",
        }
    }
}

/// What a hook tells the run to do.
#[cfg(feature = "fault-injection")]
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Flow {
    Go,
    Crash,
}

/// A test's hook: called at every checkpoint of the event's runs.
#[cfg(feature = "fault-injection")]
pub(crate) type Hook = Arc<dyn Fn(Checkpoint) -> BoxFuture<'static, Flow> + Send + Sync>;

#[cfg(feature = "fault-injection")]
static HOOKS: LazyLock<RwLock<HashMap<EventId, Hook>>> = LazyLock::new(RwLock::default);

/// Registers `hook` for every run on `event` (replacing one registered before).
#[cfg(feature = "fault-injection")]
#[doc(hidden)]
pub fn inject(event: &EventId, hook: Hook) {
    HOOKS
        .write()
        .expect("checkpoint hooks poisoned")
        .insert(event.clone(), hook);
}

/// Removes the hook of `event`.
#[cfg(feature = "fault-injection")]
#[doc(hidden)]
pub fn clear(event: &EventId) {
    HOOKS
        .write()
        .expect("checkpoint hooks poisoned")
        .remove(event);
}

/// A run on `event` reached `at`: runs the hook, if any; `Err` when it crashes there.
#[cfg(feature = "fault-injection")]
pub async fn reach(event: &EventId, at: Checkpoint) -> Result<(), EngineError> {
    let hook = HOOKS
        .read()
        .expect("checkpoint hooks poisoned")
        .get(event)
        .cloned();
    match hook {
        Some(hook) if hook(at).await == Flow::Crash => Err(EngineError::InjectedCrash(at.name())),
        _ => Ok(()),
    }
}

/// A run on `event` reached `at`: without test hooks, nothing to do.
#[cfg(not(feature = "fault-injection"))]
#[inline(always)]
pub async fn reach(event: &EventId, at: Checkpoint) -> Result<(), EngineError> {
    let _ = (event, at);
    Ok(())
}
