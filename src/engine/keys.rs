//! A token or draw event's keys, rotated while it sells: the admin replaces
//! them in the store (`lua/set_token_keys.lua`), and every engine reads
//! them again within a second (the draw timer's tick, in the control
//! plane).
//!
//! A token is verified against the keys of the engine's cached meta, with
//! no store read (`domain::token::verify`), so a rotation reaches an
//! engine when its meta is reloaded: at once on the engine that rotated,
//! and on every other by [`Engine::refresh_token_keys`], which the draw
//! timer runs each tick. Until then an engine verifies with the keys it
//! had; a meta read begun before a refresh never puts older keys in the
//! cache after it (`Engine::reload` numbers its reads). The rotation is the
//! usual two steps: add the new key as the first (`[new, old]`: tokens of
//! either verify, new ones are signed with it),
//! and, once the old key's tokens are spent or expired, drop the old
//! (`[new]`).

use std::sync::atomic::Ordering;

use super::{Engine, EngineError};
use crate::domain::ids::EventId;
use crate::domain::model::EventStatus;
use crate::domain::token::TokenAccess;
use crate::store::Store;

impl<S: Store> Engine<S> {
    /// Replaces `event`'s keys with `keys` (1 or 2; the first signs).
    /// Refused for an event without keys (open: keys would refuse every
    /// buyer without a token) and for a closed one.
    pub async fn rotate_token_keys(
        &self,
        event: &EventId,
        keys: TokenAccess,
    ) -> Result<(), EngineError> {
        keys.validate().map_err(|reason| EngineError::Invalid {
            field: "token_keys",
            reason,
        })?;
        let meta = self.reload(event).await?;
        if meta.status == EventStatus::Closed {
            return Err(closed(event));
        }
        if meta.spec.tokens.is_none() {
            return Err(EngineError::Invalid {
                field: "token_keys",
                reason: "the event's access mode is open: only a token or draw event has keys"
                    .into(),
            });
        }
        if !self.store.set_token_keys(event, &keys).await? {
            // Closed (or gone) between the read and the write.
            let meta = self.reload(event).await?;
            return Err(match meta.status {
                EventStatus::Closed => closed(event),
                _ => EngineError::UnknownEvent(event.clone()),
            });
        }
        self.reload(event).await?;
        tracing::info!(%event, keys = keys.keys.len(), "token keys rotated");
        Ok(())
    }

    /// Reloads the meta of every cached event with keys whose keys changed
    /// in the store (a rotation by another instance). One read of the keys
    /// alone per such event (`load_token_keys`: not the meta, whose layout
    /// history grows with every reshard), and a meta read only where they
    /// changed; events without keys are not read.
    pub async fn refresh_token_keys(&self) -> Result<(), EngineError> {
        // A meta read begun before this point and cached after the scan
        // below would go unchecked: `reload` leaves it out of the cache.
        let floor = self.meta_reads.fetch_add(1, Ordering::SeqCst);
        self.meta_floor.fetch_max(floor, Ordering::SeqCst);
        let cached: Vec<(EventId, Option<TokenAccess>)> = self
            .events
            .read()
            .expect("meta cache poisoned")
            .iter()
            .filter(|(_, (_, m))| m.spec.tokens.is_some())
            .map(|(id, (_, m))| (id.clone(), m.spec.tokens.clone()))
            .collect();
        let mut first = None;
        for (event, keys) in cached {
            match self.store.load_token_keys(&event).await {
                // Keys are never removed: none stored means the meta is gone.
                Ok(Some(stored)) if Some(&stored) != keys.as_ref() => {
                    if let Err(e) = self.reload(&event).await {
                        first.get_or_insert(e);
                    }
                }
                Ok(_) => {}
                Err(e) => {
                    first.get_or_insert(e.into());
                }
            }
        }
        first.map_or(Ok(()), Err)
    }
}

fn closed(event: &EventId) -> EngineError {
    EngineError::NotOnSale {
        event: event.clone(),
        why: "closed",
        starts_at: None,
    }
}
