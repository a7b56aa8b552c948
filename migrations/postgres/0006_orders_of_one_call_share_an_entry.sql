-- The orders a purchase call buys at home share one stream entry (issue 12):
-- one XADD per call instead of one per order. Such an entry's orders are its
-- parts, numbered from 0 in field order, so a record is keyed by its stream,
-- its entry's id and its part (0 for every entry of one record, as before).
ALTER TABLE order_records ADD COLUMN part BIGINT NOT NULL DEFAULT 0;
ALTER TABLE order_records DROP CONSTRAINT order_records_key;
ALTER TABLE order_records ADD CONSTRAINT order_records_key PRIMARY KEY (stream_no, ms, seq, part);
