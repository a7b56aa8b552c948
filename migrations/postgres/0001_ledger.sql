-- The order ledger: the truth behind the hot path. Portable SQL (PostgreSQL
-- and SQLite run the same file); counts and times are BIGINT (unix ms).

-- Events as created; a Redis that lost its state is rebuilt from here.
CREATE TABLE IF NOT EXISTS events (
    event_id        TEXT PRIMARY KEY,
    stock           BIGINT NOT NULL,
    buckets         BIGINT NOT NULL,
    per_user_limit  BIGINT,
    max_per_order   BIGINT NOT NULL,
    starts_ms       BIGINT,
    ends_ms         BIGINT,
    status          TEXT NOT NULL,   -- on_sale | closed
    created_ms      BIGINT NOT NULL,
    closed_ms       BIGINT
);

-- Per-event totals and the database's final guard:
--   sold - released + leftover <= stock, checked with every flushed batch.
CREATE TABLE IF NOT EXISTS event_totals (
    event_id          TEXT PRIMARY KEY,
    stock             BIGINT NOT NULL,
    sold              BIGINT NOT NULL DEFAULT 0,   -- units in order records
    released          BIGINT NOT NULL DEFAULT 0,   -- units given back (cancel, void)
    leftover          BIGINT NOT NULL DEFAULT 0,   -- units left in buckets at close
    guard_violations  BIGINT NOT NULL DEFAULT 0
);

-- Every stream record, once: the key is the record's own stream id, so a
-- batch flushed twice (a flusher that died before acknowledging) adds nothing.
CREATE TABLE IF NOT EXISTS order_records (
    stream      TEXT NOT NULL,       -- <event>#<gen>#<bucket>
    ms          BIGINT NOT NULL,     -- stream id <ms>-<seq>
    seq         BIGINT NOT NULL,
    event_id    TEXT NOT NULL,
    kind        TEXT NOT NULL,       -- o order | c cancel | v void | l leftover
    order_id    TEXT NOT NULL,
    user_id     TEXT NOT NULL,
    quantity    BIGINT NOT NULL,
    bucket      BIGINT NOT NULL,
    home        BIGINT NOT NULL,
    request_id  TEXT NOT NULL,
    at_ms       BIGINT NOT NULL,
    PRIMARY KEY (stream, ms, seq)
);
-- The primary key serves the audit's per-stream range reads; this serves the
-- (rare) derivation of an order from all its records.
CREATE INDEX IF NOT EXISTS order_records_order ON order_records (order_id);

-- Orders as clients see them, one row per order id.
CREATE TABLE IF NOT EXISTS orders (
    order_id    TEXT PRIMARY KEY,
    event_id    TEXT NOT NULL,
    user_id     TEXT NOT NULL,
    quantity    BIGINT NOT NULL,
    bucket      BIGINT NOT NULL,
    request_id  TEXT NOT NULL,
    status      TEXT NOT NULL,       -- confirmed | cancelled | voided
    created_ms  BIGINT NOT NULL,
    updated_ms  BIGINT NOT NULL
);
CREATE INDEX IF NOT EXISTS orders_event ON orders (event_id);
