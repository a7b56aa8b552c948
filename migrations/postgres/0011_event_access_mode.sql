-- An event's access mode (docs/API.md, "Access tokens"): `open` or `token`.
-- Its keys are not kept here (a secret the ledger has no use for), so an
-- event the store lost cannot be rebuilt from the ledger alone: recovery
-- refuses a `token` event (rebuilt as `open`, it would sell to anyone) and
-- says to create it again with its keys. Every event before this one was
-- `open`.
ALTER TABLE events ADD COLUMN access TEXT NOT NULL DEFAULT 'open';
