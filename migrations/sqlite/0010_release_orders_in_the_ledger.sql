-- A release order's lines name it (docs/DESIGN.md, Releases: "The ledger's
-- row of a release order"). A line is an ordinary order of its pool's event
-- (`<release>.<pool>`), its id `<release>.<pool>.<hash>.<tail>` sharing the
-- release order's hash and tail. The ledger learns which events are pools
-- when a release registers them (`release_id`, NULL for a plain event), and
-- the `orders` view names each line's release order from it:
--   release_order = <release> || the line id after its pool's event id,
-- with its release (`release_id`) and pool. Nothing is added to `order_records`: a flushed
-- record costs what it did, and every line already flushed (or flushed
-- before its pool was registered) is named as soon as its pool is.
-- A plain event's rows keep NULL in all three.
ALTER TABLE events ADD COLUMN release_id TEXT;

DROP VIEW orders;

-- 0004's view (0007's on SQLite), with the release order, release and pool.
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
       )) AS pay_by_ms,
       CASE WHEN e.release_id IS NOT NULL
            THEN e.release_id || substr(r.order_id, length(s.event_id) + 1)
       END AS release_order,
       e.release_id,
       CASE WHEN e.release_id IS NOT NULL
            THEN substr(s.event_id, length(e.release_id) + 2)
       END AS pool
FROM order_records r
JOIN ledger_streams s ON s.stream_no = r.stream_no
LEFT JOIN events e ON e.event_id = s.event_id
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
