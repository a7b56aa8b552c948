//! Webhook subscriptions in the ledger (migration 0009): where the relay
//! leader POSTs the outbox's changes, and whether a subscription is paused.
//!
//! A subscription's place is its row in `outbox_cursors` (target
//! [`webhook_target`]), fenced by the relay leader's term like the JetStream
//! cursor: this module creates that row at the outbox's head when the
//! subscription is made (a new subscription gets the changes that follow its
//! creation; older ones are in `GET /v1/events/{id}/changes`), and drops it
//! with the subscription. Delivery itself is `control::webhook`'s.
//!
//! Rows come from the configuration (origin `config`, written at every
//! start by [`Ledger::sync_config_webhooks`]) or the admin API (origin
//! `api`), so both survive restarts and every instance sees one set.

use serde_json::Value;
use sqlx::Row;

use super::{Ledger, LedgerError};

/// Where a subscription came from.
pub const ORIGIN_CONFIG: &str = "config";
pub const ORIGIN_API: &str = "api";

/// A webhook subscription as stored.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Subscription {
    pub id: String,
    pub url: String,
    /// The change types delivered; empty: every type.
    pub types: Vec<String>,
    /// The signing secrets: one, or two while a secret is rotated.
    pub secrets: Vec<String>,
    /// [`ORIGIN_CONFIG`] or [`ORIGIN_API`].
    pub origin: String,
    pub created_ms: i64,
    /// When deliveries were paused (unix ms); `None`: active.
    pub paused_ms: Option<i64>,
    pub paused_reason: Option<String>,
}

impl Subscription {
    /// Whether a change of type `kind` is delivered to it.
    pub fn wants(&self, kind: &str) -> bool {
        self.types.is_empty() || self.types.iter().any(|t| t == kind)
    }
}

/// The cursor row (`outbox_cursors.target`) of a subscription.
pub fn webhook_target(id: &str) -> String {
    format!("webhook:{id}")
}

/// What creating a subscription found.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Created {
    Created,
    /// A subscription with that id exists.
    Exists,
}

const COLUMNS: &str = "id, url, types, secrets, origin, created_ms, paused_ms, paused_reason";

fn strings(column: &str, text: &str) -> Result<Vec<String>, LedgerError> {
    let value: Value = serde_json::from_str(text)
        .map_err(|e| LedgerError::Data(format!("webhook {column}: {e}")))?;
    serde_json::from_value(value).map_err(|e| LedgerError::Data(format!("webhook {column}: {e}")))
}

fn subscription_of(row: &sqlx::any::AnyRow) -> Result<Subscription, LedgerError> {
    Ok(Subscription {
        id: row.try_get(0)?,
        url: row.try_get(1)?,
        types: strings("types", &row.try_get::<String, _>(2)?)?,
        secrets: strings("secrets", &row.try_get::<String, _>(3)?)?,
        origin: row.try_get(4)?,
        created_ms: row.try_get(5)?,
        paused_ms: row.try_get(6)?,
        paused_reason: row.try_get(7)?,
    })
}

fn json(list: &[String]) -> String {
    Value::from(list.to_vec()).to_string()
}

impl Ledger {
    /// Every subscription, by id.
    pub async fn webhooks(&self) -> Result<Vec<Subscription>, LedgerError> {
        let rows = sqlx::query(sqlx::AssertSqlSafe(format!(
            "SELECT {COLUMNS} FROM webhook_subscriptions ORDER BY id"
        )))
        .fetch_all(&self.pool)
        .await?;
        rows.iter().map(subscription_of).collect()
    }

    /// One subscription.
    pub async fn webhook(&self, id: &str) -> Result<Option<Subscription>, LedgerError> {
        let row = sqlx::query(sqlx::AssertSqlSafe(format!(
            "SELECT {COLUMNS} FROM webhook_subscriptions WHERE id = $1"
        )))
        .bind(id)
        .fetch_optional(&self.pool)
        .await?;
        row.as_ref().map(subscription_of).transpose()
    }

    /// Creates a subscription (active) and its cursor at the outbox's head,
    /// in one transaction; [`Created::Exists`] (nothing written) when its id
    /// is taken.
    pub async fn create_webhook(&self, sub: &Subscription) -> Result<Created, LedgerError> {
        let mut tx = self.pool.begin().await?;
        let done = sqlx::query(
            "INSERT INTO webhook_subscriptions (id, url, types, secrets, origin, created_ms) \
             VALUES ($1, $2, $3, $4, $5, $6) ON CONFLICT (id) DO NOTHING",
        )
        .bind(&sub.id)
        .bind(&sub.url)
        .bind(json(&sub.types))
        .bind(json(&sub.secrets))
        .bind(&sub.origin)
        .bind(sub.created_ms)
        .execute(&mut *tx)
        .await?
        .rows_affected();
        if done == 0 {
            return Ok(Created::Exists);
        }
        // A stale cursor of a deleted namesake goes: the new one starts at
        // the head.
        sqlx::query("DELETE FROM outbox_cursors WHERE target = $1")
            .bind(webhook_target(&sub.id))
            .execute(&mut *tx)
            .await?;
        sqlx::query(
            "INSERT INTO outbox_cursors (target, seq, term, updated_ms) \
             SELECT $1, seq, 0, $2 FROM outbox_head WHERE id = 1",
        )
        .bind(webhook_target(&sub.id))
        .bind(sub.created_ms)
        .execute(&mut *tx)
        .await?;
        tx.commit().await?;
        Ok(Created::Created)
    }

    /// Writes the configuration's subscriptions: new ones are created at the
    /// head, existing ones take the file's URL, types and secrets (keeping
    /// their cursor and pause), and config subscriptions no longer in the
    /// file are deleted. An id the admin API holds is refused by name.
    pub async fn sync_config_webhooks(
        &self,
        subs: &[Subscription],
        now_ms: i64,
    ) -> Result<(), LedgerError> {
        let stored = self.webhooks().await?;
        for sub in subs {
            match stored.iter().find(|s| s.id == sub.id) {
                Some(s) if s.origin != ORIGIN_CONFIG => {
                    return Err(LedgerError::Data(format!(
                        "webhook {:?} of the configuration was created by the admin API; delete it there or rename it",
                        sub.id
                    )));
                }
                Some(_) => {
                    sqlx::query(
                        "UPDATE webhook_subscriptions SET url = $2, types = $3, secrets = $4 WHERE id = $1",
                    )
                    .bind(&sub.id)
                    .bind(&sub.url)
                    .bind(json(&sub.types))
                    .bind(json(&sub.secrets))
                    .execute(&self.pool)
                    .await?;
                }
                None => {
                    let sub = Subscription {
                        origin: ORIGIN_CONFIG.into(),
                        created_ms: now_ms,
                        ..sub.clone()
                    };
                    self.create_webhook(&sub).await?;
                }
            }
        }
        for s in stored.iter().filter(|s| s.origin == ORIGIN_CONFIG) {
            if !subs.iter().any(|c| c.id == s.id) {
                self.delete_webhook(&s.id).await?;
            }
        }
        Ok(())
    }

    /// Deletes a subscription and its cursor; false when there was none.
    pub async fn delete_webhook(&self, id: &str) -> Result<bool, LedgerError> {
        let mut tx = self.pool.begin().await?;
        let done = sqlx::query("DELETE FROM webhook_subscriptions WHERE id = $1")
            .bind(id)
            .execute(&mut *tx)
            .await?
            .rows_affected();
        sqlx::query("DELETE FROM outbox_cursors WHERE target = $1")
            .bind(webhook_target(id))
            .execute(&mut *tx)
            .await?;
        tx.commit().await?;
        Ok(done == 1)
    }

    /// Pauses a subscription (its deliveries kept failing); false when there
    /// is none or it is paused already.
    pub async fn pause_webhook(
        &self,
        id: &str,
        now_ms: i64,
        reason: &str,
    ) -> Result<bool, LedgerError> {
        let done = sqlx::query(
            "UPDATE webhook_subscriptions SET paused_ms = $2, paused_reason = $3 \
             WHERE id = $1 AND paused_ms IS NULL",
        )
        .bind(id)
        .bind(now_ms)
        .bind(reason)
        .execute(&self.pool)
        .await?
        .rows_affected();
        Ok(done == 1)
    }

    /// Replaces a subscription's secrets (a rotation); false when there is
    /// none.
    pub async fn set_webhook_secrets(
        &self,
        id: &str,
        secrets: &[String],
    ) -> Result<bool, LedgerError> {
        let done = sqlx::query("UPDATE webhook_subscriptions SET secrets = $2 WHERE id = $1")
            .bind(id)
            .bind(json(secrets))
            .execute(&self.pool)
            .await?
            .rows_affected();
        Ok(done == 1)
    }

    /// Resumes a subscription from its cursor; false when there is none.
    pub async fn resume_webhook(&self, id: &str) -> Result<bool, LedgerError> {
        let done = sqlx::query(
            "UPDATE webhook_subscriptions SET paused_ms = NULL, paused_reason = NULL WHERE id = $1",
        )
        .bind(id)
        .execute(&self.pool)
        .await?
        .rows_affected();
        Ok(done == 1)
    }
}

#[cfg(test)]
mod tests {
    use super::super::outbox::*;
    use crate::domain::webhook::CHANGE_TYPES;

    #[test]
    fn subscriptions_may_ask_for_every_type_the_outbox_writes() {
        let written = [
            ORDER_CREATED,
            ORDER_CONFIRMED,
            ORDER_CANCELLED,
            ORDER_EXPIRED,
            ORDER_VOIDED,
            ORDER_RESTORED,
            EVENT_CLOSED,
        ];
        assert_eq!(CHANGE_TYPES, written);
    }
}
