-- Adaptive bucket counts (issue 17): an event created with buckets = "auto"
-- or { min, max } keeps its bounds, so a Redis rebuilt from the ledger
-- still adapts; NULL for a fixed count. `buckets` is the current count
-- (set_buckets after each reshard).
ALTER TABLE events ADD COLUMN buckets_min BIGINT;
ALTER TABLE events ADD COLUMN buckets_max BIGINT;
