-- Attempts, claim leases and receipts that wait for their send. Every statement here is
-- instant on a live database: nullable columns without defaults and a new, empty table.

-- A worker's claim is a lease: `lease` is the token its confirm handed out and every later
-- write of that attempt presents; `lease_until` is renewed while the provider call and its
-- writes run. The poller re-drives a claim only once its lease ran out.
ALTER TABLE in_flight_sends ADD COLUMN lease uuid;
ALTER TABLE in_flight_sends ADD COLUMN lease_until timestamptz;

-- When the first attempt of this effect started (its message's first CLAIMED): no receipt
-- the provider wrote before it can be about this effect. Provider ids wrap, so a receipt
-- belongs to the newest effect with its (gateway, provider id) that had started by the
-- receipt's own time. NULL on rows written before this column (created_at stands in).
ALTER TABLE ledger ADD COLUMN submitted_at timestamptz;

-- Receipts whose send is not recorded yet (the provider answered the callback before the
-- worker's ledger write, or the worker died after the call and the send is re-driven). The
-- status job is finished and the receipt waits here, uncharged, until a ledger row matches
-- it; then a new status job is queued for it. Past the hold window it is parked.
CREATE TABLE held_receipts (
    receipt_id    bigint PRIMARY KEY REFERENCES receipts (id),
    gateway       text NOT NULL,
    provider_id   text NOT NULL,
    provider_time timestamptz NOT NULL,
    partition     integer NOT NULL,
    held_at       timestamptz NOT NULL DEFAULT now()
);

CREATE INDEX held_receipts_age ON held_receipts (held_at);

-- A partition's fencing epoch is PostgreSQL's own counter, bumped by every new ownership; the
-- coordinator's generation and revision of that ownership are kept beside it, so a stale
-- acquisition (a lower revision of the same generation) is refused, and a coordinator that
-- lost its data (a new generation, revisions starting again from 1) cannot leave every
-- partition without an owner.
ALTER TABLE partition_leases ADD COLUMN coord_generation text;
ALTER TABLE partition_leases ADD COLUMN coord_revision bigint;
