-- Retention (docs/DESIGN.md, "Retention"): DONE outbox rows are removed once they are older
-- than their retention, a closed message's history is folded into one event, and later the
-- closed message goes whole, as do old receipts. Each runs as a function owned by the schema's
-- owner (SECURITY DEFINER): the runtime role may call them but still holds no DELETE on the
-- outbox or the history, so the rules of what may go (only DONE rows, only closed messages,
-- only under the maintenance fence) live here and nowhere else.

-- How far each retention pass has got: 'compaction' and 'messages' (a message id),
-- 'outbox:<partition>' (an outbox id) and 'receipts' (a receipt id). Everything at or before a
-- cursor has been looked at once. `passed_at` (outbox cursors): the newest created_at of the
-- rows passed, so a message accepted well before it has had its send row looked at.
CREATE TABLE retention_cursors (
    name      text PRIMARY KEY,
    after     text NOT NULL,
    passed_at timestamptz,
    moved_at  timestamptz NOT NULL DEFAULT now()
);

-- The history stays append-only, except for the retention functions, which say so for their
-- own transaction (a setting alone gives nobody a DELETE privilege the table does not grant).
CREATE FUNCTION herald_guard_history() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    IF TG_OP = 'DELETE' AND current_setting('herald.retention', true) = 'on' THEN
        RETURN OLD;
    END IF;
    RAISE EXCEPTION 'herald: % on % is not allowed: the table is append-only', TG_OP, TG_TABLE_NAME;
END
$$;

DROP TRIGGER message_events_append_only ON message_events;
CREATE TRIGGER message_events_append_only BEFORE UPDATE OR DELETE ON message_events
    FOR EACH ROW EXECUTE FUNCTION herald_guard_history();
DROP TRIGGER receipts_immutable ON receipts;
CREATE TRIGGER receipts_immutable BEFORE UPDATE OR DELETE ON receipts
    FOR EACH ROW EXECUTE FUNCTION herald_guard_history();

-- Folds the histories of up to `batch` messages after the compaction cursor and before
-- `before_id` (message ids are UUIDv7: ordered by their accept time) into one event each: the
-- message's final state at its time, whose detail lists every transition ({seq, state, at},
-- and the detail of ACCEPTED and of the outcomes: gateway, provider id, reasons). Only closed
-- messages (DELIVERED, UNDELIVERED, EXPIRED, FAILED) are folded; an open one (QUEUED, in
-- flight, ACCEPTED awaiting its receipt, UNKNOWN, DEAD) keeps every event. The cursor passes
-- both. Fenced by the maintenance fence (the owner of partition 0): a deposed loop changes
-- nothing and is told so.
CREATE FUNCTION herald_compact_histories(fence_partition integer, fence_epoch bigint,
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
        SELECT n.id, f.state, f.at
        FROM batch_ids n CROSS JOIN LATERAL (
            SELECT e.state, e.at FROM message_events e
            WHERE e.message_id = n.id
            ORDER BY herald_state_rank(e.state) DESC, e.seq DESC
            LIMIT 1) f
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

-- Removes DONE outbox rows (sends and status jobs) created before `cutoff`, in id order per
-- partition, at most `batch` rows looked at per partition. A partition's cursor stops at its first row that is
-- younger than the cutoff or whose work is still open (PENDING, claimed, published, or a send
-- whose claim has no outcome yet): nothing after it is removed until it is done. DEAD rows are
-- passed and kept. Answers how many rows went, how many DEAD rows were passed, how many
-- partitions wait on an open row older than the cutoff, and whether any partition looked at a
-- full batch (more may be due). Every partition's cursor records `passed_at`: every row
-- created before it has been looked at (the cutoff once nothing older is left). Fenced like
-- the compaction.
CREATE FUNCTION herald_remove_done_jobs(fence_partition integer, fence_epoch bigint,
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
           (SELECT count(*) FROM removed),
           (SELECT count(*) FROM passed p WHERE p.status = 'DEAD'),
           (SELECT count(*) FROM blocking b JOIN scanned s
                ON s.partition = b.partition AND s.id = b.id
            WHERE s.created_at < cutoff),
           EXISTS (SELECT 1 FROM passed p GROUP BY p.partition HAVING count(*) >= batch);
END
$$;

-- Removes closed messages accepted before `before_id` (a UUIDv7 bound, as for compaction)
-- whole: the message, its events and its ledger rows, up to `batch` messages after the
-- 'messages' cursor, up to the first one a held receipt may still be for; with `archive`, answers every removed row too (`archived`, one element
-- per message), for the caller to write out before it commits. Only closed messages go (DELIVERED, UNDELIVERED, EXPIRED, FAILED); open
-- ones are passed and kept. The cursor stops at the first message whose send row the outbox
-- retention has not looked at yet (its partition's cursor passed rows created at least a
-- minute after the message), so no outbox row is left owing work to a removed message.
CREATE FUNCTION herald_remove_messages(fence_partition integer, fence_epoch bigint,
                                       before_id uuid, batch integer, archive boolean)
    RETURNS TABLE (fenced boolean, examined bigint, removed bigint, rows_removed bigint,
                   left_open bigint, more boolean, archived jsonb)
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
        RETURN QUERY SELECT true, 0::bigint, 0::bigint, 0::bigint, 0::bigint, false,
                            NULL::jsonb;
        RETURN;
    END IF;
    SELECT c.after::uuid INTO after_id FROM retention_cursors c WHERE c.name = 'messages'
    FOR UPDATE;
    after_id := coalesce(after_id, '00000000-0000-0000-0000-000000000000'::uuid);
    PERFORM set_config('herald.retention', 'on', true);
    RETURN QUERY
    WITH batch_ids AS (
        SELECT m.id, m.partition, m.created_at FROM messages m
        WHERE m.id > after_id AND m.id < before_id
        ORDER BY m.id
        LIMIT batch
    ), blocking AS (
        -- Its send row not looked at yet, or a receipt for its send held (released or parked
        -- within --hold-receipts-for: it must find its send).
        SELECT b.id FROM batch_ids b
        WHERE NOT EXISTS (SELECT 1 FROM retention_cursors c
                          WHERE c.name = 'outbox:' || b.partition
                            AND c.passed_at > b.created_at + interval '1 minute')
           OR EXISTS (SELECT 1 FROM ledger l JOIN held_receipts h
                          ON h.gateway = l.gateway AND h.provider_id = l.provider_id
                      WHERE l.message_id = b.id)
        ORDER BY b.id
        LIMIT 1
    ), passed AS (
        SELECT b.* FROM batch_ids b
        WHERE NOT EXISTS (SELECT 1 FROM blocking k WHERE k.id <= b.id)
    ), current_states AS (
        SELECT p.id, f.state
        FROM passed p CROSS JOIN LATERAL (
            SELECT e.state FROM message_events e
            WHERE e.message_id = p.id
            ORDER BY herald_state_rank(e.state) DESC, e.seq DESC
            LIMIT 1) f
    ), closed AS (
        SELECT * FROM current_states
        WHERE state IN ('DELIVERED', 'UNDELIVERED', 'EXPIRED', 'FAILED')
    ), events AS (
        DELETE FROM message_events e USING closed c WHERE e.message_id = c.id
        RETURNING e.*
    ), effects AS (
        DELETE FROM ledger l USING closed c WHERE l.message_id = c.id
        RETURNING l.*
    ), gone AS (
        DELETE FROM messages m USING closed c WHERE m.id = c.id
        RETURNING m.*
    ), moved AS (
        INSERT INTO retention_cursors (name, after)
        SELECT 'messages', p.id::text FROM passed p ORDER BY p.id DESC LIMIT 1
        ON CONFLICT (name) DO UPDATE SET after = EXCLUDED.after, moved_at = now()
    )
    SELECT false,
           (SELECT count(*) FROM passed),
           (SELECT count(*) FROM gone),
           (SELECT count(*) FROM gone) + (SELECT count(*) FROM events)
               + (SELECT count(*) FROM effects),
           (SELECT count(*) FROM passed) - (SELECT count(*) FROM closed),
           (SELECT count(*) FROM passed) >= batch,
           -- Every removed row, one element per message, for the archive (the caller
           -- writes it out before it commits).
           CASE WHEN archive THEN coalesce((
               SELECT jsonb_agg(jsonb_build_object(
                          'message', to_jsonb(g),
                          'events', coalesce((SELECT jsonb_agg(to_jsonb(v) ORDER BY v.seq)
                                              FROM events v WHERE v.message_id = g.id),
                                             '[]'::jsonb),
                          'ledger', coalesce((SELECT jsonb_agg(to_jsonb(l))
                                              FROM effects l WHERE l.message_id = g.id),
                                             '[]'::jsonb))
                      ORDER BY g.id)
               FROM gone g), '[]'::jsonb) END;
END
$$;

-- Removes receipts received before `cutoff`, up to `batch` after the 'receipts' cursor, with
-- the replayed parking rows that name them. The cursor stops at the first receipt that is
-- younger, held for its send (released or parked within --hold-receipts-for), or not yet
-- behind every partition's outbox retention (its status row may still be owed). A receipt
-- named by a parking row not replayed is passed and kept: unresolved input is never removed,
-- and it must not hold up the receipts after it for good. With `archive`, answers every removed row too, as the message removal does.
CREATE FUNCTION herald_remove_receipts(fence_partition integer, fence_epoch bigint,
                                       cutoff timestamptz, batch integer, archive boolean)
    RETURNS TABLE (fenced boolean, removed bigint, parked_removed bigint, more boolean,
                   archived jsonb)
    LANGUAGE plpgsql SECURITY DEFINER
    SET search_path FROM CURRENT
    SET enable_hashjoin = off SET enable_mergejoin = off
AS $$
DECLARE
    after_id bigint;
BEGIN
    PERFORM 1 FROM partition_leases l
    WHERE l.partition = fence_partition AND l.epoch = fence_epoch FOR SHARE;
    IF NOT FOUND THEN
        RETURN QUERY SELECT true, 0::bigint, 0::bigint, false, NULL::jsonb;
        RETURN;
    END IF;
    SELECT c.after::bigint INTO after_id FROM retention_cursors c WHERE c.name = 'receipts'
    FOR UPDATE;
    after_id := coalesce(after_id, 0);
    PERFORM set_config('herald.retention', 'on', true);
    RETURN QUERY
    WITH batch_ids AS (
        SELECT r.id, r.received_at FROM receipts r
        WHERE r.id > after_id
        ORDER BY r.id
        LIMIT batch
    ), outbox_passed AS (
        -- Up to when every partition's outbox rows were looked at: a receipt's status row
        -- is in one of them, and it must be gone (DONE and removed) before its receipt.
        SELECT CASE WHEN count(*) = (SELECT s.value::integer FROM herald_settings s
                                     WHERE s.name = 'partitions')
                    THEN min(c.passed_at) END AS at
        FROM retention_cursors c WHERE c.name LIKE 'outbox:%'
    ), blocking AS (
        -- A held receipt is released or parked within --hold-receipts-for: the pass waits.
        SELECT min(b.id) AS id FROM batch_ids b
        WHERE b.received_at >= cutoff
           OR NOT (b.received_at + interval '1 minute'
                   < coalesce((SELECT o.at FROM outbox_passed o), '-infinity'))
           OR EXISTS (SELECT 1 FROM held_receipts h WHERE h.receipt_id = b.id)
    ), passed AS (
        SELECT b.* FROM batch_ids b, blocking k WHERE k.id IS NULL OR b.id < k.id
    ), removable AS (
        -- Named by a parking row not replayed: unresolved for good, passed and kept.
        SELECT p.* FROM passed p
        WHERE NOT EXISTS (SELECT 1 FROM parking k
                          WHERE k.receipt_id = p.id AND k.replayed_at IS NULL)
    ), parked AS (
        DELETE FROM parking k USING removable p WHERE k.receipt_id = p.id
        RETURNING k.*
    ), gone AS (
        DELETE FROM receipts r USING removable p WHERE r.id = p.id
        RETURNING r.*
    ), moved AS (
        INSERT INTO retention_cursors (name, after)
        SELECT 'receipts', max(p.id)::text FROM passed p HAVING count(*) > 0
        ON CONFLICT (name) DO UPDATE SET after = EXCLUDED.after, moved_at = now()
    )
    SELECT false, (SELECT count(*) FROM gone), (SELECT count(*) FROM parked),
           (SELECT count(*) FROM passed) >= batch,
           CASE WHEN archive THEN coalesce((
               SELECT jsonb_agg(jsonb_build_object(
                          'receipt', to_jsonb(g),
                          'parking', coalesce((SELECT jsonb_agg(to_jsonb(k))
                                               FROM parked k WHERE k.receipt_id = g.id),
                                              '[]'::jsonb))
                      ORDER BY g.id)
               FROM gone g), '[]'::jsonb) END;
END
$$;

-- Called by the runtime role (which `herald migrate --runtime-role` grants EXECUTE on every
-- function), not by anyone who can connect.
REVOKE EXECUTE ON FUNCTION herald_compact_histories(integer, bigint, uuid, integer) FROM PUBLIC;
REVOKE EXECUTE ON FUNCTION herald_remove_done_jobs(integer, bigint, timestamptz, integer) FROM PUBLIC;
REVOKE EXECUTE ON FUNCTION herald_remove_messages(integer, bigint, uuid, integer, boolean)
    FROM PUBLIC;
REVOKE EXECUTE ON FUNCTION herald_remove_receipts(integer, bigint, timestamptz, integer, boolean)
    FROM PUBLIC;

-- Retention deletes from these tables all the time: vacuum them after 5 % of their rows are
-- dead instead of 20 %, so the space is reused while the tables stay the same size (the soak
-- benchmark in loadtest/README.md). Setting a storage parameter does not block reads or writes.
ALTER TABLE messages SET (autovacuum_vacuum_scale_factor = 0.05);
ALTER TABLE message_events SET (autovacuum_vacuum_scale_factor = 0.05);
ALTER TABLE ledger SET (autovacuum_vacuum_scale_factor = 0.05);
ALTER TABLE receipts SET (autovacuum_vacuum_scale_factor = 0.05);
