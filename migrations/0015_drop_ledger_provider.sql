-- `ledger_provider` (0002) is superseded by `ledger_provider_submitted` (0014), which orders
-- the rows the way every receipt lookup reads them; every ledger write updated both. Dropping
-- an index is a catalog change: the lock is held for an instant, under `herald migrate`'s
-- lock_timeout.
DROP INDEX IF EXISTS ledger_provider;
