-- no-transaction
-- Receipts find their send by (gateway, provider id), newest first by when its first attempt
-- started. `ledger_provider` (0002) orders by `created_at`, so every lookup read all rows a
-- provider id ever had and sorted them: with ids wrapping at 65,535 that is one more row per
-- wrap, for as long as the ledger is kept.
CREATE INDEX CONCURRENTLY IF NOT EXISTS ledger_provider_submitted
    ON ledger (gateway, provider_id, (coalesce(submitted_at, created_at)) DESC);
