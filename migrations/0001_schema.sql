-- Herald's schema. The outbox's child partitions are created by herald_create_outbox_partitions,
-- which `herald migrate` calls with the partition count recorded in herald_settings.

CREATE TABLE herald_settings (
    name  text PRIMARY KEY,
    value text NOT NULL
);

-- Raised by the triggers that keep history tables append-only.
CREATE FUNCTION herald_forbid_change() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    RAISE EXCEPTION 'herald: % on % is not allowed: the table is append-only', TG_OP, TG_TABLE_NAME;
END
$$;

-- One row per accepted message, immutable after insert: its state lives in message_events.
CREATE TABLE messages (
    id                  uuid PRIMARY KEY,
    partition           integer NOT NULL CHECK (partition >= 0),
    recipient           text NOT NULL,
    body                jsonb NOT NULL,
    -- The client's Idempotency-Key, if it sent one.
    idempotency_key     text UNIQUE,
    -- xxh3-128 of the canonical request, to tell a retry (same body) from a conflict.
    request_fingerprint bytea NOT NULL,
    created_at          timestamptz NOT NULL DEFAULT now()
);

CREATE TRIGGER messages_immutable BEFORE UPDATE ON messages
    FOR EACH ROW EXECUTE FUNCTION herald_forbid_change();

-- The append-only history of every message. seq grows across the table, so within one
-- message it orders the events.
CREATE TABLE message_events (
    message_id uuid NOT NULL REFERENCES messages (id),
    seq        bigint GENERATED ALWAYS AS IDENTITY,
    state      text NOT NULL CHECK (state IN ('QUEUED', 'CLAIMED', 'RETRYING', 'ACCEPTED', 'FAILED', 'DEAD')),
    at         timestamptz NOT NULL DEFAULT clock_timestamp(),
    detail     jsonb NOT NULL DEFAULT '{}'::jsonb,
    PRIMARY KEY (message_id, seq)
);

CREATE TRIGGER message_events_append_only BEFORE UPDATE OR DELETE ON message_events
    FOR EACH ROW EXECUTE FUNCTION herald_forbid_change();

-- Mirrors herald_core::MessageState::rank (a store test keeps the two equal).
CREATE FUNCTION herald_state_rank(state text) RETURNS integer
    LANGUAGE sql IMMUTABLE PARALLEL SAFE AS $$
    SELECT CASE state
        WHEN 'QUEUED'   THEN 0
        WHEN 'CLAIMED'  THEN 1
        WHEN 'RETRYING' THEN 1
        WHEN 'DEAD'     THEN 1
        WHEN 'ACCEPTED' THEN 2
        WHEN 'FAILED'   THEN 2
    END
$$;

-- The current state of each message, derived from its history: the highest-ranked event,
-- the latest among equals. Never stored, never updated.
CREATE VIEW message_current_state AS
SELECT DISTINCT ON (message_id) message_id, state, at, seq
FROM message_events
ORDER BY message_id, herald_state_rank(state) DESC, seq DESC;

-- The outbox: the only proof that work is owed. Partitioned by the message's partition
-- number; each child carries a partial index on its PENDING rows for the claim.
CREATE SEQUENCE outbox_id_seq AS bigint;

CREATE TABLE outbox (
    partition    integer NOT NULL,
    id           bigint NOT NULL DEFAULT nextval('outbox_id_seq'),
    job_type     text NOT NULL,
    message_id   uuid,
    payload      jsonb NOT NULL DEFAULT '{}'::jsonb,
    status       text NOT NULL DEFAULT 'PENDING'
                 CHECK (status IN ('PENDING', 'PROCESSING', 'PUBLISHED', 'DONE', 'DEAD')),
    attempts     integer NOT NULL DEFAULT 0,
    -- A PENDING row is not claimed before this time (retry back-off).
    available_at timestamptz NOT NULL DEFAULT now(),
    claimed_at   timestamptz,
    -- The fencing epoch of the poller that made the last claim.
    claimed_epoch bigint,
    created_at   timestamptz NOT NULL DEFAULT now(),
    last_error   text,
    PRIMARY KEY (partition, id)
) PARTITION BY LIST (partition);

ALTER SEQUENCE outbox_id_seq OWNED BY outbox.id;

CREATE INDEX outbox_message ON outbox (message_id);

CREATE FUNCTION herald_create_outbox_partitions(partition_count integer) RETURNS void
    LANGUAGE plpgsql AS $$
DECLARE
    p     integer;
    child text;
BEGIN
    FOR p IN 0 .. partition_count - 1 LOOP
        child := format('outbox_p%s', lpad(p::text, 4, '0'));
        EXECUTE format('CREATE TABLE IF NOT EXISTS %I PARTITION OF outbox FOR VALUES IN (%s)', child, p);
        EXECUTE format('CREATE INDEX IF NOT EXISTS %I ON %I (id) WHERE status = ''PENDING''',
                       child || '_pending', child);
        EXECUTE format('CREATE INDEX IF NOT EXISTS %I ON %I (claimed_at) WHERE status IN (''PROCESSING'', ''PUBLISHED'')',
                       child || '_in_flight', child);
    END LOOP;
END
$$;

-- One row per real effect. The UNIQUE idempotency key is what stops a retry from becoming a
-- second effect (rule R5).
CREATE TABLE ledger (
    idempotency_key text PRIMARY KEY,
    message_id      uuid NOT NULL REFERENCES messages (id),
    gateway         text NOT NULL,
    provider_id     text NOT NULL,
    created_at      timestamptz NOT NULL DEFAULT now()
);

CREATE INDEX ledger_message ON ledger (message_id);

-- The fencing epoch of each partition's current owner. Every claim, mark and re-drive checks
-- the epoch in the same statement, so a deposed poller's writes change zero rows.
CREATE TABLE partition_leases (
    partition   integer PRIMARY KEY,
    owner       text NOT NULL,
    epoch       bigint NOT NULL,
    acquired_at timestamptz NOT NULL DEFAULT now()
);
