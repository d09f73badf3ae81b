//! SQL fragments that several statements share, as macros that expand to string literals: every
//! statement stays one `concat!` literal, prepared once like any other.

/// The CTE `locked`: the outbox rows named by the CTE `$keys` (columns `partition`, `id`) that
/// a worker may still finish (PROCESSING or PUBLISHED), locked by one probe per key in
/// `(partition, id)` order. See "Keyed statements" in `docs/DESIGN.md`.
///
/// The probe names only the key, and the status is checked on the row it locked (the newest
/// version, after the lock waited for any writer): with `status IN (…)` in the probe, the
/// partial index of in-flight rows matches it too, and a generic plan made while statistics
/// said that index was empty read every in-flight row of the child for each key. `OFFSET 0`
/// keeps the planner from moving the status check back into the probe.
macro_rules! lock_outbox_rows {
    ($keys:literal) => {
        concat!(
            "locked AS (
                 SELECT x.partition, x.id FROM (SELECT * FROM ",
            $keys,
            " ORDER BY partition, id) k
                 CROSS JOIN LATERAL (
                     SELECT o.partition, o.id, o.status FROM outbox o
                     WHERE o.partition = k.partition AND o.id = k.id
                     OFFSET 0
                     FOR UPDATE OF o) x
                 WHERE x.status IN ('PROCESSING', 'PUBLISHED')
             )"
        )
    };
}

/// The tail of an `UPDATE outbox o SET …` that changes exactly the rows of `locked`: a join by
/// key, which a session with [`crate::GENERIC_PLANS`] runs as a nested loop whose probe into
/// the outbox is pruned to the key's child at run time (one index probe per row; a hash join
/// or a `ctid = ANY(…)` condition read every one of the 64 children). No status condition:
/// `locked` checked it on the newest version of each row, which this statement holds locked;
/// a row changed between the statement's snapshot and that lock is found by its key and
/// updated in its newest version (PostgreSQL re-reads it), never skipped.
macro_rules! the_locked_rows {
    () => {
        "FROM locked l WHERE o.partition = l.partition AND o.id = l.id"
    };
}

/// An `INSERT` of UNKNOWN (rule R7) for every row of the CTE `$source` (columns `message_id`
/// and the acceptance time `$accepted_at`) whose message has neither a final receipt nor
/// UNKNOWN yet, returning a row for each. A count per message, not `NOT EXISTS`: the planner
/// turns that into an anti-join over every event.
macro_rules! mark_unknown {
    ($source:literal, $accepted_at:literal) => {
        concat!(
            "INSERT INTO message_events (message_id, state, detail)
                 SELECT s.message_id, 'UNKNOWN',
                        jsonb_build_object('reason', 'no final receipt within the reconciliation window',
                                           'accepted_at', s.",
            $accepted_at,
            ")
                 FROM ",
            $source,
            " s CROSS JOIN LATERAL (
                     SELECT count(*) AS settled FROM message_events e
                     WHERE e.message_id = s.message_id AND herald_state_rank(e.state) >= 4) f
                 WHERE f.settled = 0
                 RETURNING 1"
        )
    };
}
