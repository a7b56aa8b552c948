-- Holds (issue 14): an event's pay-by window, so a rebuild from the ledger
-- keeps selling holds. Order records gain three kinds (no schema change):
-- h hold (at_ms = the pay-by deadline), k confirm, e expire (units released,
-- counted in event_totals.released like a cancel's).
ALTER TABLE events ADD COLUMN hold_seconds BIGINT;
