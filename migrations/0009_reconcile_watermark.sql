-- Reconciliation of silent gateways (rule R7) reads the ledger instead of a table of its
-- own: every accepted effect used to insert an `awaiting_receipt` row and its final receipt
-- deleted it (two row writes per message). Now a status worker looks at the ledger rows
-- written since the last pass, oldest first, and appends UNKNOWN to those whose message has
-- neither a final receipt nor UNKNOWN by then. This row says how far it got: ledger rows
-- created up to `reconciled_to` were looked at. It starts now: older rows were written by a
-- release that also wrote `awaiting_receipt`, whose rows are still reconciled from there.
CREATE TABLE reconcile_watermark (
    singleton     boolean PRIMARY KEY DEFAULT true CHECK (singleton),
    reconciled_to timestamptz NOT NULL
);
INSERT INTO reconcile_watermark (reconciled_to) VALUES (now());
