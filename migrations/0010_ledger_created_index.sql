-- no-transaction
-- The reconciliation's scan of the ledger by creation time (migration 0009).
CREATE INDEX CONCURRENTLY IF NOT EXISTS ledger_created ON ledger (created_at);
