-- no-transaction
-- Receipt retention (0016's herald_remove_receipts) looks up the parking rows that name each
-- receipt it would remove, and removing a receipt makes PostgreSQL check parking's foreign key:
-- without an index both read the whole parking table per receipt.
CREATE INDEX CONCURRENTLY IF NOT EXISTS parking_receipt ON parking (receipt_id);
