-- Holds on the hot path (issue 14): a purchase taken as a hold writes one
-- order record carrying its deadline, not an order and a hold record, so a
-- take may carry pay_by_ms (NULL on every other record; a saga's hold is
-- still a record 'h' of its own, its at_ms the deadline). The `orders` view
-- learns holds: statuses held and expired, and the deadline.
ALTER TABLE order_records ADD COLUMN pay_by_ms BIGINT;

DROP VIEW orders;

-- An order as clients see it, from all its records in whatever order they
-- came (the rule src/ledger/derive.rs applies): its row is its best take —
-- one no void gave back, then the lowest bucket (then the earliest record) —
-- or, while none of its takes is here yet, its first cancel or expiry
-- (bucket -1). Status: voided when that take was given back (the saga never
-- made it this order), cancelled once a cancel exists, expired once an
-- expiry exists, held while it has a deadline (its take's pay_by_ms, or a
-- saga's hold record 'h') and no confirm ('k'), else confirmed. pay_by_ms is
-- the deadline of an order taken as a hold, NULL for the others.
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
