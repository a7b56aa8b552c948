-- The orders a purchase call buys at home share one stream entry (issue 12):
-- one XADD per call instead of one per order. Such an entry's orders are its
-- parts, numbered from 0 in field order, so a record is keyed by its stream,
-- its entry's id and its part (0 for every entry of one record, as before).
-- SQLite cannot change a table's key: the table is built again (and the
-- view over it, the same as 0004's).
DROP VIEW orders;

CREATE TABLE order_records_v3 (
    stream_no   BIGINT NOT NULL,     -- ledger_streams.stream_no
    ms          BIGINT NOT NULL,     -- stream id <ms>-<seq>
    seq         BIGINT NOT NULL,
    quantity    BIGINT NOT NULL,
    bucket      BIGINT NOT NULL,
    home        BIGINT NOT NULL,
    at_ms       BIGINT NOT NULL,
    kind        TEXT NOT NULL,       -- o c v l h k e (domain::stream)
    order_id    TEXT NOT NULL,
    user_id     TEXT NOT NULL,
    request_id  TEXT NOT NULL,
    pay_by_ms   BIGINT,
    part        BIGINT NOT NULL DEFAULT 0,
    CONSTRAINT order_records_key PRIMARY KEY (stream_no, ms, seq, part)
);
INSERT INTO order_records_v3
    (stream_no, ms, seq, quantity, bucket, home, at_ms, kind, order_id, user_id, request_id, pay_by_ms, part)
SELECT stream_no, ms, seq, quantity, bucket, home, at_ms, kind, order_id, user_id, request_id, pay_by_ms, 0
FROM order_records;
DROP TABLE order_records;
ALTER TABLE order_records_v3 RENAME TO order_records;
CREATE INDEX order_records_order ON order_records (order_id);

CREATE VIEW orders AS
SELECT r.order_id,
       s.event_id,
       r.user_id,
       r.quantity,
       CASE WHEN r.kind IN ('c', 'e') THEN -1 ELSE r.bucket END AS bucket,
       r.request_id,
       CASE
           WHEN r.kind = 'o' AND EXISTS (
               SELECT 1 FROM order_records v
               WHERE v.order_id = r.order_id AND v.kind = 'v' AND v.bucket = r.bucket
           ) THEN 'voided'
           WHEN r.kind = 'c' OR EXISTS (
               SELECT 1 FROM order_records c WHERE c.order_id = r.order_id AND c.kind = 'c'
           ) THEN 'cancelled'
           WHEN r.kind = 'e' OR EXISTS (
               SELECT 1 FROM order_records x WHERE x.order_id = r.order_id AND x.kind = 'e'
           ) THEN 'expired'
           WHEN (r.pay_by_ms IS NOT NULL OR EXISTS (
               SELECT 1 FROM order_records h WHERE h.order_id = r.order_id AND h.kind = 'h'
           )) AND NOT EXISTS (
               SELECT 1 FROM order_records k WHERE k.order_id = r.order_id AND k.kind = 'k'
           ) THEN 'held'
           ELSE 'confirmed'
       END AS status,
       r.at_ms AS created_ms,
       r.at_ms AS updated_ms,
       COALESCE(r.pay_by_ms, (
           SELECT MIN(h.at_ms) FROM order_records h WHERE h.order_id = r.order_id AND h.kind = 'h'
       )) AS pay_by_ms
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
    r.kind IN ('c', 'e') AND NOT EXISTS (
        SELECT 1 FROM order_records o WHERE o.order_id = r.order_id AND o.kind = 'o'
    ) AND NOT EXISTS (
        SELECT 1 FROM order_records f
        WHERE f.order_id = r.order_id AND f.kind IN ('c', 'e')
          AND (f.stream_no, f.ms, f.seq) < (r.stream_no, r.ms, r.seq)
    )
);
