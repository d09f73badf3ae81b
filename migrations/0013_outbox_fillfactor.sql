-- Room on each outbox page for the new versions of its rows. A send row is updated twice
-- (claimed, then confirmed by a worker), and neither update can be HOT (the status is in the
-- partial indexes' predicates). On a full page the new version went to another page, and
-- PostgreSQL WAL-logs a lock of the old version before such an update: in a drain, 25,499 of
-- 45,578 outbox updates moved pages, each with its extra record and a second page dirtied.
-- Existing children take the setting for the rows they get from now on; new children
-- (herald_create_outbox_partitions) are created with it. Changing a storage parameter takes
-- a lock that does not block reads or writes.
CREATE OR REPLACE FUNCTION herald_create_outbox_partitions(partition_count integer) RETURNS void
    LANGUAGE plpgsql AS $$
DECLARE
    p     integer;
    child text;
BEGIN
    FOR p IN 0 .. partition_count - 1 LOOP
        child := format('outbox_p%s', lpad(p::text, 4, '0'));
        IF to_regclass(format('%I', child)) IS NULL THEN
            EXECUTE format('CREATE TABLE %I PARTITION OF outbox FOR VALUES IN (%s) WITH (fillfactor = 50)',
                           child, p);
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

DO $$
DECLARE
    child regclass;
BEGIN
    FOR child IN SELECT inhrelid::regclass FROM pg_inherits WHERE inhparent = 'outbox'::regclass
    LOOP
        EXECUTE format('ALTER TABLE %s SET (fillfactor = 50)', child);
    END LOOP;
END
$$;
