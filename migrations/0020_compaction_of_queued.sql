-- Compaction after the derived QUEUED (0019). 0016's herald_compact_histories found each
-- message's state with an inner lateral join to its events, so a message with none (QUEUED
-- since 0019) dropped out of the batch's states: never folded (right), but not counted as
-- left open either. And a closed history of one event (a FAILED without a claim) was deleted
-- and written again as one compacted event, two row writes for nothing. The same function,
-- with a left lateral join (no event: QUEUED) and only histories of two or more events folded.
-- CREATE OR REPLACE keeps the owner and the EXECUTE grants.
CREATE OR REPLACE FUNCTION herald_compact_histories(fence_partition integer, fence_epoch bigint,
                                         before_id uuid, batch integer)
    RETURNS TABLE (fenced boolean, examined bigint, compacted bigint, folded bigint,
                   left_open bigint)
    LANGUAGE plpgsql SECURITY DEFINER
    SET search_path FROM CURRENT
    SET enable_hashjoin = off SET enable_mergejoin = off
AS $$
DECLARE
    after_id uuid;
BEGIN
    PERFORM 1 FROM partition_leases l
    WHERE l.partition = fence_partition AND l.epoch = fence_epoch FOR SHARE;
    IF NOT FOUND THEN
        RETURN QUERY SELECT true, 0::bigint, 0::bigint, 0::bigint, 0::bigint;
        RETURN;
    END IF;
    SELECT c.after::uuid INTO after_id FROM retention_cursors c WHERE c.name = 'compaction'
    FOR UPDATE;
    after_id := coalesce(after_id, '00000000-0000-0000-0000-000000000000'::uuid);
    PERFORM set_config('herald.retention', 'on', true);
    RETURN QUERY
    WITH batch_ids AS (
        SELECT m.id FROM messages m
        WHERE m.id > after_id AND m.id < before_id
        ORDER BY m.id
        LIMIT batch
    ), current_states AS (
        -- A message without events is QUEUED (0019): open, and counted as left open.
        SELECT n.id, coalesce(f.state, 'QUEUED') AS state, f.at
        FROM batch_ids n LEFT JOIN LATERAL (
            SELECT e.state, e.at FROM message_events e
            WHERE e.message_id = n.id
            ORDER BY herald_state_rank(e.state) DESC, e.seq DESC
            LIMIT 1) f ON true
    ), closed AS (
        SELECT * FROM current_states
        WHERE state IN ('DELIVERED', 'UNDELIVERED', 'EXPIRED', 'FAILED')
    ), summary AS (
        SELECT c.id, c.state, c.at,
               jsonb_agg(jsonb_build_object('seq', e.seq, 'state', e.state, 'at', e.at)
                         || CASE WHEN e.state IN ('ACCEPTED', 'FAILED', 'DEAD', 'DELIVERED',
                                                  'UNDELIVERED', 'EXPIRED', 'UNKNOWN')
                                      AND e.detail <> '{}'::jsonb
                                 THEN jsonb_build_object('detail', e.detail)
                                 ELSE '{}'::jsonb END
                         ORDER BY e.seq) AS transitions,
               count(*) AS events
        FROM closed c JOIN message_events e ON e.message_id = c.id
        GROUP BY c.id, c.state, c.at
        -- One event is already one row: folding it would delete and insert it for nothing.
        HAVING count(*) > 1
    ), removed AS (
        DELETE FROM message_events d
        USING summary s
        WHERE d.message_id = s.id
        RETURNING d.message_id
    ), inserted AS (
        INSERT INTO message_events (message_id, state, at, detail)
        SELECT s.id, s.state, s.at, jsonb_build_object('compacted', s.transitions)
        FROM summary s
        RETURNING message_id
    ), moved AS (
        INSERT INTO retention_cursors (name, after)
        -- (PostgreSQL 15 has no max(uuid).)
        SELECT 'compaction', n.id::text FROM batch_ids n ORDER BY n.id DESC LIMIT 1
        ON CONFLICT (name) DO UPDATE SET after = EXCLUDED.after, moved_at = now()
    )
    SELECT false,
           (SELECT count(*) FROM batch_ids),
           (SELECT count(*) FROM inserted),
           (SELECT count(*) FROM removed),
           (SELECT count(*) FROM current_states) - (SELECT count(*) FROM closed);
END
$$;
