-- The foreign keys from the message's history to `messages` go. Each insert into
-- message_events, ledger and in_flight_sends checked its key with a `FOR KEY SHARE` lock on
-- the message's row: a trigger query and a WAL record per check, about 4.5 per delivered
-- message, for a guarantee the writers already give. Every writer takes the message id from
-- the outbox or the ledger, which the accept wrote in the message's own transaction, and no
-- role Herald runs as may update or delete a message. The proof checks it instead: `herald
-- verify` fails a run with any history row whose message is gone
-- (`history_without_message`). awaiting_receipt is no longer written (0009); its key goes too,
-- so the removal of old data never has to order its deletes around it.
ALTER TABLE message_events DROP CONSTRAINT IF EXISTS message_events_message_id_fkey;
ALTER TABLE ledger DROP CONSTRAINT IF EXISTS ledger_message_id_fkey;
ALTER TABLE in_flight_sends DROP CONSTRAINT IF EXISTS in_flight_sends_message_id_fkey;
ALTER TABLE awaiting_receipt DROP CONSTRAINT IF EXISTS awaiting_receipt_message_id_fkey;
