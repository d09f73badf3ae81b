-- A send's claim lease lives on its outbox row (docs/DESIGN.md, "Claim leases"). The worker's
-- confirm wrote the row DONE and inserted an `in_flight_sends` row holding the lease, which
-- the outcome deleted again: three row writes, one of them a non-HOT update, for a fact the
-- outbox row can hold. The confirm now sets `lease` and `lease_until` on the row and leaves its
-- status (an update of unindexed columns only, so HOT), and the outcome writes it DONE,
-- PENDING or DEAD under that lease. `in_flight_sends` stays for claims a worker of an earlier
-- version made during a rolling upgrade; the poller still re-drives those.
--
-- Nullable columns without a default: a change of the catalog only, no rewrite.
ALTER TABLE outbox ADD COLUMN IF NOT EXISTS lease uuid;
ALTER TABLE outbox ADD COLUMN IF NOT EXISTS lease_until timestamptz;
