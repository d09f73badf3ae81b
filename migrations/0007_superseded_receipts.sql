-- A receipt whose provider id matches a recorded send that a final receipt already settled,
-- and that is not a copy of that final receipt, is most likely for a newer send that reused
-- the id (ids wrap) and is not recorded yet. It is held with the older send's submit time
-- here, released when a newer send with that id is recorded, and applied to the older send
-- (a duplicate or a correction) only once the hold window has passed. NULL: held because no
-- recorded send matched at all. A nullable column without a default: instant.
ALTER TABLE held_receipts ADD COLUMN superseding timestamptz;
