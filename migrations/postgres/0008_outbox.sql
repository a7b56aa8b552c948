-- Order events out (issue 47): the transactional outbox. The flusher writes a
-- batch's changes (order.created, order.confirmed, order.cancelled,
-- order.expired) in the transaction that writes its records, and a close
-- writes event.closed in the transaction that closes the event; a relay
-- publishes them in `seq` order and keeps its place in `outbox_cursors`.
--
-- `seq` is handed out from `outbox_head`, whose one row each writer locks
-- until it commits: sequence numbers become visible in order, so a reader
-- that has seen `seq` N never finds a smaller one committed later (a plain
-- sequence would let a slow transaction commit a smaller number behind a
-- relay's cursor). Numbers may skip (a change already there is not written
-- again), never go back.
CREATE TABLE outbox_head (
    id   BIGINT PRIMARY KEY,
    seq  BIGINT NOT NULL
);
INSERT INTO outbox_head (id, seq) VALUES (1, 0);

-- One row per change, once: (subject, type) is unique, the subject being the
-- order id (the event id for event.closed). `change_id` is
-- `<subject>:<type>`, the id consumers deduplicate by.
CREATE TABLE outbox_changes (
    seq        BIGINT PRIMARY KEY,
    change_id  TEXT NOT NULL,
    event_id   TEXT NOT NULL,
    subject    TEXT NOT NULL,
    type       TEXT NOT NULL,
    at_ms      BIGINT NOT NULL,
    payload    TEXT NOT NULL        -- JSON
);
-- Keyed by the order id's last 8 characters first: they rise (an instance's
-- order counter), so a batch's keys land on a few neighbouring pages of the
-- B-tree; keyed by the whole id (random after the event and user hash), a
-- flushed order cost PostgreSQL 13 µs instead of 4 (ledger_cost, batches of
-- 2,000), most of it this index.
CREATE UNIQUE INDEX outbox_changes_subject ON outbox_changes (right(subject, 8), subject, type);
CREATE INDEX outbox_changes_event ON outbox_changes (event_id, seq);

-- An order's terminal change that reached the ledger before the order's
-- creation (a saga's take is in another bucket's stream than the home
-- bucket's cancel): kept here, and given its `seq` right after the
-- order.created that releases it, so each order's changes keep their order.
CREATE TABLE outbox_parked (
    change_id  TEXT PRIMARY KEY,
    event_id   TEXT NOT NULL,
    subject    TEXT NOT NULL,
    type       TEXT NOT NULL,
    at_ms      BIGINT NOT NULL,
    payload    TEXT NOT NULL
);
CREATE INDEX outbox_parked_subject ON outbox_parked (subject);

-- Each relay target's place: every change up to `seq` is delivered. `term`
-- is the relay leader's term (a fencing token): a leader that lost its lease
-- cannot move the cursor of one with a newer term.
CREATE TABLE outbox_cursors (
    target      TEXT PRIMARY KEY,
    seq         BIGINT NOT NULL,
    term        BIGINT NOT NULL,
    updated_ms  BIGINT NOT NULL
);
