-- A message's first state is derived, not written: an accepted message is QUEUED from its
-- `created_at` until its history says more. The accept no longer appends a QUEUED event
-- (one row write and its index entries less per message, in the statement every accept
-- runs); the messages row it writes in the same transaction is that fact already (its
-- `created_at` is the transaction's start; the event took the clock a moment later).
--
-- Histories written before this migration keep their QUEUED events; readers take the event
-- when there is one (crate herald-store, messages.rs) and derive it otherwise.
CREATE OR REPLACE VIEW message_current_state AS
SELECT m.id AS message_id,
       coalesce(e.state, 'QUEUED') AS state,
       coalesce(e.at, m.created_at) AS at,
       e.seq
FROM messages m
LEFT JOIN LATERAL (
    SELECT e.state, e.at, e.seq FROM message_events e
    WHERE e.message_id = m.id
    ORDER BY herald_state_rank(e.state) DESC,
             (e.detail->>'provider_time')::timestamptz DESC NULLS LAST, e.seq DESC
    LIMIT 1
) e ON true;
