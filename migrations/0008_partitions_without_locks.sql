-- `herald migrate` calls this on every run. It used to issue CREATE TABLE / CREATE INDEX
-- IF NOT EXISTS for every child; CREATE INDEX takes a SHARE lock on the table before it looks
-- whether the index exists, so a run with nothing to do still locked every outbox child
-- against inserts until it committed, and waited behind any transaction writing one. Now it
-- looks first and touches only what is missing.
CREATE OR REPLACE FUNCTION herald_create_outbox_partitions(partition_count integer) RETURNS void
    LANGUAGE plpgsql AS $$
DECLARE
    p     integer;
    child text;
BEGIN
    FOR p IN 0 .. partition_count - 1 LOOP
        child := format('outbox_p%s', lpad(p::text, 4, '0'));
        IF to_regclass(format('%I', child)) IS NULL THEN
            EXECUTE format('CREATE TABLE %I PARTITION OF outbox FOR VALUES IN (%s)', child, p);
        END IF;
        IF to_regclass(format('%I', child || '_pending')) IS NULL THEN
            EXECUTE format('CREATE INDEX %I ON %I (id) WHERE status = ''PENDING''',
                           child || '_pending', child);
        END IF;
        IF to_regclass(format('%I', child || '_in_flight')) IS NULL THEN
            EXECUTE format('CREATE INDEX %I ON %I (claimed_at) WHERE status IN (''PROCESSING'', ''PUBLISHED'')',
                           child || '_in_flight', child);
        END IF;
    END LOOP;
END
$$;
