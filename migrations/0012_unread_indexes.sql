-- Two indexes that every delivered message wrote to and no statement on the delivery path
-- reads. `outbox_message` took a new entry at the accept and at each of the two status
-- updates of a send row (neither can be HOT): three index inserts per message, for the proof
-- alone, which now finds DEAD rows through `outbox_dead` and joins the rest by hash.
-- `in_flight_sends_age` took one per claim; the table holds only the sends between CLAIMED
-- and their outcome (a few hundred rows), which the stale-claim pass reads whole every 15 s.
-- Dropping an index is a catalog change: the lock is held for an instant, under `herald
-- migrate`'s lock_timeout.
DROP INDEX IF EXISTS outbox_message;
DROP INDEX IF EXISTS in_flight_sends_age;
