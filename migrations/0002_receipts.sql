-- Delivery receipts (the `status` job type), the parking table, in-flight sends for the
-- re-drive of stale CLAIMED messages, and the reconciliation of silent gateways.

ALTER TABLE message_events DROP CONSTRAINT message_events_state_check;
ALTER TABLE message_events ADD CONSTRAINT message_events_state_check CHECK (state IN (
    'QUEUED', 'CLAIMED', 'RETRYING', 'ACCEPTED', 'FAILED', 'DEAD',
    'ENROUTE', 'UNKNOWN', 'DELIVERED', 'UNDELIVERED', 'EXPIRED'));

-- Mirrors herald_core::MessageState::rank.
CREATE OR REPLACE FUNCTION herald_state_rank(state text) RETURNS integer
    LANGUAGE sql IMMUTABLE PARALLEL SAFE AS $$
    SELECT CASE state
        WHEN 'QUEUED'      THEN 0
        WHEN 'CLAIMED'     THEN 1
        WHEN 'RETRYING'    THEN 1
        WHEN 'DEAD'        THEN 1
        WHEN 'ACCEPTED'    THEN 2
        WHEN 'FAILED'      THEN 2
        WHEN 'ENROUTE'     THEN 3
        WHEN 'UNKNOWN'     THEN 4
        WHEN 'DELIVERED'   THEN 5
        WHEN 'UNDELIVERED' THEN 5
        WHEN 'EXPIRED'     THEN 5
    END
$$;

-- Every receipt a provider posted, byte for byte. Immutable.
CREATE TABLE receipts (
    id           bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    gateway      text NOT NULL,
    raw          bytea NOT NULL,
    content_type text,
    received_at  timestamptz NOT NULL DEFAULT now()
);

CREATE TRIGGER receipts_immutable BEFORE UPDATE OR DELETE ON receipts
    FOR EACH ROW EXECUTE FUNCTION herald_forbid_change();

-- Input Herald could not apply, kept with its raw body and the reason (rule R6).
CREATE TABLE parking (
    id          bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    job_type    text NOT NULL,
    receipt_id  bigint REFERENCES receipts (id),
    raw         bytea NOT NULL,
    reason      text NOT NULL,
    parked_at   timestamptz NOT NULL DEFAULT now(),
    -- Set when an operator replays the item (a new job is queued for it).
    replayed_at timestamptz
);

CREATE INDEX parking_open ON parking (parked_at) WHERE replayed_at IS NULL;

-- Receipts find their message by (gateway, provider id): unique per gateway only, and wrapping,
-- so the newest effect accepted before the receipt arrived wins.
CREATE INDEX ledger_provider ON ledger (gateway, provider_id, created_at DESC);

-- Sends between CLAIMED and their outcome (ACCEPTED, FAILED, RETRYING). A row older than the
-- stale-claim timeout means the worker died: its outbox row is re-driven (rule R4).
CREATE TABLE in_flight_sends (
    message_id uuid PRIMARY KEY REFERENCES messages (id),
    partition  integer NOT NULL,
    outbox_id  bigint NOT NULL,
    claimed_at timestamptz NOT NULL DEFAULT now()
);

CREATE INDEX in_flight_sends_age ON in_flight_sends (partition, claimed_at);

-- Accepted messages still waiting for a final receipt; past the reconciliation window they
-- become UNKNOWN (rule R7).
CREATE TABLE awaiting_receipt (
    message_id  uuid PRIMARY KEY REFERENCES messages (id),
    accepted_at timestamptz NOT NULL DEFAULT now()
);

CREATE INDEX awaiting_receipt_age ON awaiting_receipt (accepted_at);

-- DEAD rows, listed and re-driven by id.
CREATE INDEX outbox_dead ON outbox (id) WHERE status = 'DEAD';
