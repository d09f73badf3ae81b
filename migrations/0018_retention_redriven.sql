-- A DEAD outbox row is passed by its partition's retention cursor and kept. An operator may
-- re-drive it later; it is then delivered and DONE behind the cursor, where the cursor never
-- looks again, and would be kept for ever (with its message removed after it). The cursor now
-- remembers every DEAD row it passes; each pass looks at all of them (one primary-key lookup
-- each), keeps the ones still DEAD (or re-driven and open), notes when one is first seen DONE,
-- and removes it once that is older than the cutoff (the same retention a DONE row gets from
-- its creation). A row that is gone is forgotten. Only rows that were DEAD are in this table.
CREATE TABLE retention_passed_dead (
    partition    integer NOT NULL,
    id           bigint NOT NULL,
    done_seen_at timestamptz,
    PRIMARY KEY (partition, id)
);

-- The rows the cursor already passed (before this migration) are found once, from the DEAD
-- index, so a re-drive of an old DEAD row is covered too.
INSERT INTO retention_passed_dead (partition, id)
SELECT o.partition, o.id
FROM outbox o JOIN retention_cursors c ON c.name = 'outbox:' || o.partition
WHERE o.status = 'DEAD' AND o.id <= c.after::bigint;

-- herald_remove_done_jobs of 0016 with those steps added (kept_dead, behind, behind_done,
-- seen_done, removed_behind, forgotten); its signature and answer are unchanged, `removed`
-- counting the re-driven rows removed too.
CREATE OR REPLACE FUNCTION herald_remove_done_jobs(fence_partition integer, fence_epoch bigint,
                                        cutoff timestamptz, batch integer)
    RETURNS TABLE (fenced boolean, removed bigint, dead_kept bigint, waiting bigint,
                   more boolean)
    LANGUAGE plpgsql SECURITY DEFINER
    SET search_path FROM CURRENT
    SET enable_hashjoin = off SET enable_mergejoin = off
AS $$
DECLARE
    partition_count integer;
BEGIN
    PERFORM 1 FROM partition_leases l
    WHERE l.partition = fence_partition AND l.epoch = fence_epoch FOR SHARE;
    IF NOT FOUND THEN
        RETURN QUERY SELECT true, 0::bigint, 0::bigint, 0::bigint, false;
        RETURN;
    END IF;
    SELECT s.value::integer INTO partition_count FROM herald_settings s
    WHERE s.name = 'partitions';
    RETURN QUERY
    WITH cursors AS (
        SELECT p AS partition, coalesce(c.after::bigint, 0) AS after
        FROM generate_series(0, partition_count - 1) p
        LEFT JOIN retention_cursors c ON c.name = 'outbox:' || p
    ), scanned AS (
        SELECT c.partition, o.id, o.status, o.attempts, o.created_at, o.message_id, o.job_type
        FROM cursors c CROSS JOIN LATERAL (
            SELECT o.id, o.status, o.attempts, o.created_at, o.message_id, o.job_type
            FROM outbox o
            WHERE o.partition = c.partition AND o.id > c.after
            ORDER BY o.id
            LIMIT batch) o
    ), blocking AS (
        SELECT s.partition, min(s.id) AS id
        FROM scanned s
        WHERE s.created_at >= cutoff
           OR s.status IN ('PENDING', 'PROCESSING', 'PUBLISHED')
           OR (s.status = 'DONE' AND s.job_type = 'send'
               AND EXISTS (SELECT 1 FROM in_flight_sends f WHERE f.message_id = s.message_id))
        GROUP BY s.partition
    ), passed AS (
        SELECT s.*
        FROM scanned s LEFT JOIN blocking b ON b.partition = s.partition
        WHERE b.id IS NULL OR s.id < b.id
    ), removed AS (
        -- The row's status and attempts are checked again on the version this locks: a row
        -- re-driven and confirmed again since this statement's snapshot is not removed.
        DELETE FROM outbox o
        USING passed p
        WHERE o.partition = p.partition AND o.id = p.id
          AND p.status = 'DONE' AND o.status = 'DONE' AND o.attempts = p.attempts
        RETURNING o.partition
    ), kept_dead AS (
        -- DEAD rows the cursor passes are remembered: a re-drive may finish them later.
        INSERT INTO retention_passed_dead (partition, id)
        SELECT p.partition, p.id FROM passed p WHERE p.status = 'DEAD'
        ON CONFLICT DO NOTHING
    ), behind AS (
        SELECT d.partition, d.id, d.done_seen_at, o.status, o.attempts, o.message_id,
               o.job_type, o.id IS NULL AS gone
        FROM retention_passed_dead d
        LEFT JOIN outbox o ON o.partition = d.partition AND o.id = d.id
    ), behind_done AS (
        SELECT b.* FROM behind b
        WHERE b.status = 'DONE'
          AND NOT (b.job_type = 'send'
                   AND EXISTS (SELECT 1 FROM in_flight_sends f
                               WHERE f.message_id = b.message_id))
    ), seen_done AS (
        -- A re-driven row's DONE is first seen now: it is kept for the retention from here,
        -- as a row the cursor finds DONE is kept from its creation.
        UPDATE retention_passed_dead d SET done_seen_at = now()
        FROM behind_done b
        WHERE d.partition = b.partition AND d.id = b.id AND b.done_seen_at IS NULL
    ), removed_behind AS (
        DELETE FROM outbox o
        USING behind_done b
        WHERE o.partition = b.partition AND o.id = b.id AND b.done_seen_at < cutoff
          AND o.status = 'DONE' AND o.attempts = b.attempts
        RETURNING o.partition, o.id
    ), forgotten AS (
        DELETE FROM retention_passed_dead d
        USING behind b
        WHERE d.partition = b.partition AND d.id = b.id
          AND (b.gone OR EXISTS (SELECT 1 FROM removed_behind r
                                 WHERE r.partition = b.partition AND r.id = b.id))
    ), progress AS (
        -- Per partition: the last id passed, and up to when every row was looked at: the
        -- cutoff when nothing older is left after the cursor, else the newest row passed.
        SELECT c.partition,
               coalesce((SELECT max(p.id) FROM passed p WHERE p.partition = c.partition),
                        c.after) AS after,
               CASE WHEN b.id IS NULL
                         AND (SELECT count(*) FROM scanned s WHERE s.partition = c.partition)
                             < batch
                    THEN cutoff
                    ELSE (SELECT max(p.created_at) FROM passed p
                          WHERE p.partition = c.partition) END AS passed_at
        FROM cursors c LEFT JOIN blocking b ON b.partition = c.partition
    ), moved AS (
        INSERT INTO retention_cursors (name, after, passed_at)
        SELECT 'outbox:' || g.partition, g.after::text, g.passed_at FROM progress g
        ON CONFLICT (name) DO UPDATE
            SET after = EXCLUDED.after, moved_at = now(),
                passed_at = greatest(retention_cursors.passed_at, EXCLUDED.passed_at)
    )
    SELECT false,
           (SELECT count(*) FROM removed) + (SELECT count(*) FROM removed_behind),
           (SELECT count(*) FROM passed p WHERE p.status = 'DEAD'),
           (SELECT count(*) FROM blocking b JOIN scanned s
                ON s.partition = b.partition AND s.id = b.id
            WHERE s.created_at < cutoff),
           EXISTS (SELECT 1 FROM passed p GROUP BY p.partition HAVING count(*) >= batch);
END
$$;

REVOKE EXECUTE ON FUNCTION herald_remove_done_jobs(integer, bigint, timestamptz, integer) FROM PUBLIC;
