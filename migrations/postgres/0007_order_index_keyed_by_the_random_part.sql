-- SQLite's 0007 keys its order id index by the id's last 8 characters (a
-- random B-tree key of ~45 bytes rewrote most of the index into the WAL on
-- every flushed batch). PostgreSQL keeps its hash index on the whole id (a
-- hash index entry is a 4-byte hash whatever the key), so nothing changes
-- here; the migration keeps both folders numbered alike. The comment only
-- records which migration this database has seen.
COMMENT ON INDEX order_records_order IS 'hash index on the whole order id (0002); SQLite indexes the last 8 characters (0007)';
