-- Webhook subscriptions: where the relay leader POSTs the outbox's changes.
-- Rows come from the configuration (`[[outbox.webhooks]]`, written at start,
-- origin 'config') or the admin API (origin 'api'), so both survive a
-- restart and every instance sees the same set. A subscription's place is
-- its row in `outbox_cursors` (target `webhook:<id>`), fenced by the relay
-- leader's term like the JetStream target's.
--
-- `types` and `secrets` are JSON arrays: the change types delivered (empty:
-- every type) and the signing secrets (one, or two while a secret is
-- rotated). `paused_ms` is set when deliveries kept failing past the bound
-- (or NULL: active); `paused_reason` says why.
CREATE TABLE webhook_subscriptions (
    id             TEXT PRIMARY KEY,
    url            TEXT NOT NULL,
    types          TEXT NOT NULL,
    secrets        TEXT NOT NULL,
    origin         TEXT NOT NULL,
    created_ms     BIGINT NOT NULL,
    paused_ms      BIGINT,
    paused_reason  TEXT
);
