-- The name of the API key that accepted each message. A client key reads only the messages it
-- created, and its retries are answered only from them; an operator key reads every message.
-- NULL: accepted by an API that ran without keys (a development run), or before this migration.
ALTER TABLE messages ADD COLUMN created_by text;
