-- DEAD rows are counted every few seconds for the dead-row gauge and alert; a partial index
-- keeps that count off the DONE rows, which only grow until they are archived.
CREATE INDEX IF NOT EXISTS outbox_dead ON outbox (id) WHERE status = 'DEAD';
