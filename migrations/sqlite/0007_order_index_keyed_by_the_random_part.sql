-- The order id index is keyed by the id's last 8 hex digits (random), not the
-- whole id (issue 12). Order ids are random, so a batch of flushed orders
-- lands all over that index, and a commit writes every page it touched to the
-- WAL again: with the whole id (~45 bytes an entry) that index was ~70% of
-- the ledger's CPU per order (`ledger_cost --sqlite`: 14 µs an order at
-- batches of 4,000, 4 without the index); 8-character keys make it a few
-- times smaller. A lookup by order id names the key and the id:
--   WHERE substr(order_id, -8) = substr(?1, -8) AND +order_id = ?1
-- (the `+` stops SQLite from substituting the id into the first term, which
-- would leave the index unused); two orders sharing a key only cost a second
-- row read. The view is 0006's with every join on the order id written so.
-- PostgreSQL keeps its index on the whole id.
DROP VIEW orders;
DROP INDEX order_records_order;
CREATE INDEX order_records_order_key ON order_records (substr(order_id, -8));

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
               WHERE substr(v.order_id, -8) = substr(r.order_id, -8) AND v.order_id = r.order_id AND v.kind = 'v' AND v.bucket = r.bucket
           ) THEN 'voided'
           WHEN r.kind = 'c' OR EXISTS (
               SELECT 1 FROM order_records c WHERE substr(c.order_id, -8) = substr(r.order_id, -8) AND c.order_id = r.order_id AND c.kind = 'c'
           ) THEN 'cancelled'
           WHEN r.kind = 'e' OR EXISTS (
               SELECT 1 FROM order_records x WHERE substr(x.order_id, -8) = substr(r.order_id, -8) AND x.order_id = r.order_id AND x.kind = 'e'
           ) THEN 'expired'
           WHEN (r.pay_by_ms IS NOT NULL OR EXISTS (
               SELECT 1 FROM order_records h WHERE substr(h.order_id, -8) = substr(r.order_id, -8) AND h.order_id = r.order_id AND h.kind = 'h'
           )) AND NOT EXISTS (
               SELECT 1 FROM order_records k WHERE substr(k.order_id, -8) = substr(r.order_id, -8) AND k.order_id = r.order_id AND k.kind = 'k'
           ) THEN 'held'
           ELSE 'confirmed'
       END AS status,
       r.at_ms AS created_ms,
       r.at_ms AS updated_ms,
       COALESCE(r.pay_by_ms, (
           SELECT MIN(h.at_ms) FROM order_records h WHERE substr(h.order_id, -8) = substr(r.order_id, -8) AND h.order_id = r.order_id AND h.kind = 'h'
       )) AS pay_by_ms
FROM order_records r
JOIN ledger_streams s ON s.stream_no = r.stream_no
WHERE (
    r.kind = 'o' AND NOT EXISTS (
        SELECT 1 FROM order_records o
        WHERE substr(o.order_id, -8) = substr(r.order_id, -8) AND o.order_id = r.order_id AND o.kind = 'o' AND (
            (CASE WHEN EXISTS (SELECT 1 FROM order_records v
                               WHERE substr(v.order_id, -8) = substr(o.order_id, -8) AND v.order_id = o.order_id AND v.kind = 'v' AND v.bucket = o.bucket)
                  THEN 1 ELSE 0 END,
             o.bucket, o.ms, o.seq, o.stream_no)
            <
            (CASE WHEN EXISTS (SELECT 1 FROM order_records v
                               WHERE substr(v.order_id, -8) = substr(r.order_id, -8) AND v.order_id = r.order_id AND v.kind = 'v' AND v.bucket = r.bucket)
                  THEN 1 ELSE 0 END,
             r.bucket, r.ms, r.seq, r.stream_no)
        )
    )
) OR (
    r.kind IN ('c', 'e') AND NOT EXISTS (
        SELECT 1 FROM order_records o WHERE substr(o.order_id, -8) = substr(r.order_id, -8) AND o.order_id = r.order_id AND o.kind = 'o'
    ) AND NOT EXISTS (
        SELECT 1 FROM order_records f
        WHERE substr(f.order_id, -8) = substr(r.order_id, -8) AND f.order_id = r.order_id AND f.kind IN ('c', 'e')
          AND (f.stream_no, f.ms, f.seq) < (r.stream_no, r.ms, r.seq)
    )
);
