-- Two final receipts for one message (a provider that corrected itself, or receipts that
-- arrived out of order) are ordered by the provider's own time, not by arrival: among events of
-- the same rank, the one with the latest `provider_time` wins, and events without one (Herald's
-- own) fall back to their order in the history.
CREATE OR REPLACE VIEW message_current_state AS
SELECT DISTINCT ON (message_id) message_id, state, at, seq
FROM message_events
ORDER BY message_id, herald_state_rank(state) DESC,
         (detail->>'provider_time')::timestamptz DESC NULLS LAST, seq DESC;
