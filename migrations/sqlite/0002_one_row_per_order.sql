-- One row per flushed order (SQLite; PostgreSQL runs its own 0002 with the
-- same tables and view). Until 0001 every order cost two rows, its stream
-- record and its `orders` row. Now:
--   * `order_records` is the only truth. Its key is the record's stream id,
--     the stream named by a number (`ledger_streams`, written once per
--     stream) instead of its text on every row;
--   * `orders` becomes a view deriving each order from all its records (the
--     rule the flusher applied on write until now), so it reads the same.

CREATE TABLE ledger_streams (
    stream_no  INTEGER PRIMARY KEY,   -- the rowid: assigned on insert
    stream     TEXT NOT NULL UNIQUE,  -- <event>#<gen>#<bucket>
    event_id   TEXT NOT NULL
);
CREATE INDEX ledger_streams_event ON ledger_streams (event_id);
INSERT INTO ledger_streams (stream, event_id)
SELECT stream, MIN(event_id) FROM order_records GROUP BY stream ORDER BY stream;

-- Fixed-width columns first: no alignment padding between them.
CREATE TABLE order_records_v2 (
    stream_no   BIGINT NOT NULL,     -- ledger_streams.stream_no
    ms          BIGINT NOT NULL,     -- stream id <ms>-<seq>
    seq         BIGINT NOT NULL,
    quantity    BIGINT NOT NULL,
    bucket      BIGINT NOT NULL,
    home        BIGINT NOT NULL,
    at_ms       BIGINT NOT NULL,
    kind        TEXT NOT NULL,       -- o order | c cancel | v void | l leftover
    order_id    TEXT NOT NULL,
    user_id     TEXT NOT NULL,
    request_id  TEXT NOT NULL,
    CONSTRAINT order_records_key PRIMARY KEY (stream_no, ms, seq)
);
INSERT INTO order_records_v2
    (stream_no, ms, seq, quantity, bucket, home, at_ms, kind, order_id, user_id, request_id)
SELECT s.stream_no, r.ms, r.seq, r.quantity, r.bucket, r.home, r.at_ms, r.kind, r.order_id, r.user_id, r.request_id
FROM order_records r JOIN ledger_streams s ON s.stream = r.stream;

DROP TABLE orders;
DROP TABLE order_records;
ALTER TABLE order_records_v2 RENAME TO order_records;
CREATE INDEX order_records_order ON order_records (order_id);

-- An order as clients see it, from all its records in whatever order they
-- came: its row is its best take — one no void gave back, then the lowest
-- bucket (then the earliest record) — or, while none of its takes is here
-- yet, its cancel. Status: voided when that take was given back (the saga
-- never made it this order), cancelled once a cancel exists, else confirmed.
CREATE VIEW orders AS
SELECT r.order_id,
       s.event_id,
       r.user_id,
       r.quantity,
       CASE WHEN r.kind = 'c' THEN -1 ELSE r.bucket END AS bucket,
       r.request_id,
       CASE
           WHEN r.kind = 'o' AND EXISTS (
               SELECT 1 FROM order_records v
               WHERE v.order_id = r.order_id AND v.kind = 'v' AND v.bucket = r.bucket
           ) THEN 'voided'
           WHEN r.kind = 'c' OR EXISTS (
               SELECT 1 FROM order_records c WHERE c.order_id = r.order_id AND c.kind = 'c'
           ) THEN 'cancelled'
           ELSE 'confirmed'
       END AS status,
       r.at_ms AS created_ms,
       r.at_ms AS updated_ms
FROM order_records r
JOIN ledger_streams s ON s.stream_no = r.stream_no
WHERE (
    r.kind = 'o' AND NOT EXISTS (
        SELECT 1 FROM order_records o
        WHERE o.order_id = r.order_id AND o.kind = 'o' AND (
            (CASE WHEN EXISTS (SELECT 1 FROM order_records v
                               WHERE v.order_id = o.order_id AND v.kind = 'v' AND v.bucket = o.bucket)
                  THEN 1 ELSE 0 END,
             o.bucket, o.ms, o.seq, o.stream_no)
            <
            (CASE WHEN EXISTS (SELECT 1 FROM order_records v
                               WHERE v.order_id = r.order_id AND v.kind = 'v' AND v.bucket = r.bucket)
                  THEN 1 ELSE 0 END,
             r.bucket, r.ms, r.seq, r.stream_no)
        )
    )
) OR (
    r.kind = 'c' AND NOT EXISTS (
        SELECT 1 FROM order_records o WHERE o.order_id = r.order_id AND o.kind = 'o'
    )
);
