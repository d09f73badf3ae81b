//! The worker's statements against a real PostgreSQL: confirm, record, retry, leases and
//! receipts. Longer than 400 lines: one test per statement and its failure, sharing the
//! helpers of `main.rs`.

use std::time::Duration;

use herald_core::send_effect_key;
use herald_store::accept::accept_messages;
use herald_store::effects::{
    confirm_ownership, record_accepted, record_failed, renew_leases, schedule_retry, AttemptEnd,
    ProviderReceipt, RetryOf, RetryOutcome,
};
use herald_store::leases::take_over;
use herald_store::messages::message_with_history;
use herald_store::outbox::claim_pending;

use crate::{count, message, migrated};

const LEASE: Duration = Duration::from_secs(30);

fn retry_of(job: &herald_core::job::Job, lease: uuid::Uuid, end: AttemptEnd) -> RetryOf<'static> {
    RetryOf {
        partition: job.partition,
        outbox_id: job.outbox_id,
        lease,
        reason: "503",
        end,
    }
}

fn states(view: &herald_store::messages::MessageView) -> Vec<&str> {
    view.events.iter().map(|e| e.state.as_str()).collect()
}

#[tokio::test]
async fn confirm_then_accept_writes_one_effect_however_often_it_is_repeated() {
    let (_pg, pool) = migrated(4).await;
    let sent = message(2, None, "hello");
    accept_messages(&pool, std::slice::from_ref(&sent))
        .await
        .unwrap();
    let fence = take_over(&pool, 2, "p").await.unwrap();
    let job = claim_pending(&pool, fence, 1).await.unwrap().remove(0);

    let owned = confirm_ownership(&pool, 2, job.outbox_id, "w1", LEASE)
        .await
        .unwrap()
        .unwrap();
    assert_eq!(owned.message_id, sent.id);
    assert_eq!(owned.recipient, sent.recipient);
    assert!(!owned.already_accepted);
    // A second copy of the job finds the row DONE and gets nothing.
    assert!(confirm_ownership(&pool, 2, job.outbox_id, "w2", LEASE)
        .await
        .unwrap()
        .is_none());

    let key = send_effect_key(sent.id);
    let receipt = ProviderReceipt {
        gateway: "gw-a".to_owned(),
        provider_id: "17".to_owned(),
    };
    assert!(record_accepted(&pool, sent.id, &key, &receipt)
        .await
        .unwrap());
    assert!(!record_accepted(&pool, sent.id, &key, &receipt)
        .await
        .unwrap());
    assert_eq!(count(&pool, "SELECT count(*) FROM ledger").await, 1);

    let view = message_with_history(&pool, sent.id).await.unwrap().unwrap();
    assert_eq!(states(&view), vec!["QUEUED", "CLAIMED", "ACCEPTED"]);
    assert_eq!(view.state, "ACCEPTED");
}

#[tokio::test]
async fn a_failed_call_is_retried_then_dead_and_an_accepted_message_is_not_claimed_again() {
    let (_pg, pool) = migrated(4).await;
    let sent = message(1, None, "flaky");
    accept_messages(&pool, std::slice::from_ref(&sent))
        .await
        .unwrap();
    let fence = take_over(&pool, 1, "p").await.unwrap();

    let job = claim_pending(&pool, fence, 1).await.unwrap().remove(0);
    assert_eq!(job.attempt, 0, "a claim charges no attempt");
    let owned = confirm_ownership(&pool, 1, job.outbox_id, "w", LEASE)
        .await
        .unwrap()
        .unwrap();
    assert_eq!(owned.attempt, 1, "the confirm charges it");
    let lease = owned.lease.unwrap();
    let no_effect = retry_of(&job, lease, AttemptEnd::NoEffect);
    let outcome = schedule_retry(&pool, &no_effect, Duration::ZERO, 2)
        .await
        .unwrap();
    assert_eq!(outcome, RetryOutcome::Scheduled);
    // Only a DONE row under its lease can be scheduled again.
    let again = schedule_retry(&pool, &no_effect, Duration::ZERO, 2)
        .await
        .unwrap();
    assert_eq!(again, RetryOutcome::NotOwned);

    let job = claim_pending(&pool, fence, 1).await.unwrap().remove(0);
    assert_eq!(job.attempt, 1);
    let owned = confirm_ownership(&pool, 1, job.outbox_id, "w", LEASE)
        .await
        .unwrap()
        .unwrap();
    assert_eq!(owned.attempt, 2);
    let last = retry_of(&job, owned.lease.unwrap(), AttemptEnd::NoEffect);
    let outcome = schedule_retry(&pool, &last, Duration::ZERO, 2)
        .await
        .unwrap();
    assert_eq!(outcome, RetryOutcome::Dead);
    let view = message_with_history(&pool, sent.id).await.unwrap().unwrap();
    assert_eq!(
        states(&view),
        vec!["QUEUED", "CLAIMED", "RETRYING", "CLAIMED", "DEAD"]
    );

    // A message whose effect is in the ledger is confirmed without a new CLAIMED.
    let other = message(1, None, "done before");
    accept_messages(&pool, std::slice::from_ref(&other))
        .await
        .unwrap();
    record_accepted(
        &pool,
        other.id,
        &send_effect_key(other.id),
        &ProviderReceipt {
            gateway: "gw-b".to_owned(),
            provider_id: "1".to_owned(),
        },
    )
    .await
    .unwrap();
    let job = claim_pending(&pool, fence, 1).await.unwrap().remove(0);
    let owned = confirm_ownership(&pool, 1, job.outbox_id, "w", LEASE)
        .await
        .unwrap()
        .unwrap();
    assert!(owned.already_accepted);
    assert_eq!(owned.lease, None, "nothing is in flight for it");
    let view = message_with_history(&pool, other.id)
        .await
        .unwrap()
        .unwrap();
    assert_eq!(states(&view), vec!["QUEUED", "ACCEPTED"]);

    record_failed(&pool, other.id, "blocked").await.unwrap();
    let view = message_with_history(&pool, other.id)
        .await
        .unwrap()
        .unwrap();
    assert_eq!(view.events.last().unwrap().detail["reason"], "blocked");
}

/// A provider that posts the same receipt twice writes the history once; two final receipts
/// that arrive out of order leave the message in the state of the later one by the
/// provider's clock.
#[tokio::test]
async fn duplicate_receipts_add_nothing_and_final_receipts_are_ordered_by_provider_time() {
    use herald_core::state::MessageState;
    use herald_core::JobType;
    use herald_store::receipts::{accept_receipt, apply_receipts, ReceiptToApply};

    let (_pg, pool) = migrated(4).await;
    let sent = message(1, None, "receipted twice");
    accept_messages(&pool, std::slice::from_ref(&sent))
        .await
        .unwrap();
    let fence = take_over(&pool, 1, "p").await.unwrap();
    let job = claim_pending(&pool, fence, 1).await.unwrap().remove(0);
    confirm_ownership(&pool, 1, job.outbox_id, "w", LEASE)
        .await
        .unwrap();
    let provider = ProviderReceipt {
        gateway: "gw".to_owned(),
        provider_id: "9".to_owned(),
    };
    record_accepted(&pool, sent.id, &send_effect_key(sent.id), &provider)
        .await
        .unwrap();

    // Four receipts posted: DELIVERED at 10:05, the same again, a stray UNDELIVERED stamped
    // 10:01 arriving after both, and ENROUTE at 10:00.
    for _ in 0..4 {
        accept_receipt(&pool, "gw", b"{}", None, 1).await.unwrap();
    }
    let jobs = claim_pending(&pool, fence, 10).await.unwrap();
    assert!(jobs.iter().all(|j| j.job_type == JobType::Status));
    assert_eq!(jobs.len(), 4);
    let receipt = |job: &herald_core::job::Job, state, status: &str, time: &str| ReceiptToApply {
        partition: 1,
        outbox_id: job.outbox_id,
        message_id: sent.id,
        state,
        detail: serde_json::json!({
            "gateway": "gw", "provider_id": "9", "provider_status": status,
            "provider_time": time, "receipt_id": job.outbox_id,
        }),
    };
    let delivered = |job| {
        receipt(
            job,
            MessageState::Delivered,
            "DELIVRD",
            "2026-12-03T10:05:00Z",
        )
    };
    // The first two in one group, the same receipt twice.
    let applied = apply_receipts(&pool, &[delivered(&jobs[0]), delivered(&jobs[1])])
        .await
        .unwrap();
    assert_eq!(applied.len(), 2, "both jobs are finished");
    // Then out of order: an earlier final state and an earlier progress state, and the
    // duplicate once more in a later group.
    let late = [
        receipt(
            &jobs[2],
            MessageState::Undelivered,
            "UNDELIV",
            "2026-12-03T10:01:00Z",
        ),
        receipt(
            &jobs[3],
            MessageState::Enroute,
            "ENROUTE",
            "2026-12-03T10:00:00Z",
        ),
    ];
    assert_eq!(apply_receipts(&pool, &late).await.unwrap().len(), 2);
    let view = message_with_history(&pool, sent.id).await.unwrap().unwrap();
    assert_eq!(
        states(&view),
        vec![
            "QUEUED",
            "CLAIMED",
            "ACCEPTED",
            "DELIVERED",
            "UNDELIVERED",
            "ENROUTE"
        ],
        "one DELIVERED however often it was posted"
    );
    assert_eq!(
        view.state, "DELIVERED",
        "the provider's latest final state wins"
    );
    assert_eq!(
        count(
            &pool,
            "SELECT count(*) FROM outbox WHERE job_type = 'status' AND status = 'DONE'"
        )
        .await,
        4
    );
}

/// The last attempt timed out: nobody knows whether the provider took the message, so it is
/// never DEAD for it; the row stays PENDING and says its next attempt asks by key.
#[tokio::test]
async fn an_unknown_outcome_on_the_last_attempt_is_never_dead() {
    let (_pg, pool) = migrated(4).await;
    let sent = message(1, None, "slow provider");
    accept_messages(&pool, std::slice::from_ref(&sent))
        .await
        .unwrap();
    let fence = take_over(&pool, 1, "p").await.unwrap();
    for attempt in 1..=3 {
        let job = claim_pending(&pool, fence, 1).await.unwrap().remove(0);
        let owned = confirm_ownership(&pool, 1, job.outbox_id, "w", LEASE)
            .await
            .unwrap()
            .unwrap();
        assert_eq!(owned.attempt, attempt);
        let unknown = retry_of(&job, owned.lease.unwrap(), AttemptEnd::Unknown);
        let outcome = schedule_retry(&pool, &unknown, Duration::ZERO, 1)
            .await
            .unwrap();
        assert_eq!(outcome, RetryOutcome::Scheduled, "attempt {attempt}");
    }
    let view = message_with_history(&pool, sent.id).await.unwrap().unwrap();
    assert!(!states(&view).contains(&"DEAD"), "{:?}", states(&view));
    let last = view.events.last().unwrap();
    assert_eq!(last.detail["outcome"], "unknown");
    assert_eq!(last.detail["next"], "ask the provider by key");
    // Asked, the provider has nothing under the key: now DEAD is the truth.
    let job = claim_pending(&pool, fence, 1).await.unwrap().remove(0);
    let owned = confirm_ownership(&pool, 1, job.outbox_id, "w", LEASE)
        .await
        .unwrap()
        .unwrap();
    let none = retry_of(&job, owned.lease.unwrap(), AttemptEnd::NoEffect);
    let outcome = schedule_retry(&pool, &none, Duration::ZERO, 1)
        .await
        .unwrap();
    assert_eq!(outcome, RetryOutcome::Dead);
}

/// A worker that froze past its claim's lease is re-driven; its later writes present a lease
/// that is gone and change nothing, while a live worker's renewals keep its claim.
#[tokio::test]
async fn a_claim_is_redriven_only_after_its_lease_ran_out_and_the_old_lease_writes_nothing() {
    use herald_store::outbox::redrive_stale_claims;

    let (_pg, pool) = migrated(4).await;
    let frozen = message(1, None, "frozen worker");
    let live = message(1, None, "live worker");
    accept_messages(&pool, &[frozen.clone(), live.clone()])
        .await
        .unwrap();
    let fence = take_over(&pool, 1, "p").await.unwrap();
    let jobs = claim_pending(&pool, fence, 2).await.unwrap();
    let short = Duration::from_millis(1500);
    let mut owned = Vec::new();
    for job in &jobs {
        owned.push(
            confirm_ownership(&pool, 1, job.outbox_id, "w", short)
                .await
                .unwrap()
                .unwrap(),
        );
    }
    let (frozen_job, frozen_owned) = jobs
        .iter()
        .zip(&owned)
        .find(|(_, o)| o.message_id == frozen.id)
        .unwrap();
    let live_owned = owned.iter().find(|o| o.message_id == live.id).unwrap();
    // Within the lease nothing is re-driven.
    assert_eq!(redrive_stale_claims(&pool, fence).await.unwrap().pending, 0);
    // Only the live worker renews.
    for _ in 0..4 {
        tokio::time::sleep(Duration::from_millis(500)).await;
        let renewed = renew_leases(&pool, &[(live.id, live_owned.lease.unwrap())], short)
            .await
            .unwrap();
        assert_eq!(renewed, 1);
    }
    // A fence that no longer holds re-drives nothing, though the lease ran out.
    let deposed = herald_store::outbox::Fence {
        partition: 1,
        epoch: fence.epoch - 1,
    };
    let moved = herald_store::outbox::redrive_stale_claims_many(&pool, &[deposed])
        .await
        .unwrap();
    assert_eq!(moved[0].pending, 0);
    assert_eq!(redrive_stale_claims(&pool, fence).await.unwrap().pending, 1);
    let view = message_with_history(&pool, frozen.id)
        .await
        .unwrap()
        .unwrap();
    assert_eq!(view.events.last().unwrap().state, "RETRYING");
    assert_eq!(view.events.last().unwrap().detail["outcome"], "unknown");
    // The re-driven claim is confirmed by another worker…
    let again = claim_pending(&pool, fence, 1).await.unwrap().remove(0);
    assert_eq!(again.outbox_id, frozen_job.outbox_id);
    let second = confirm_ownership(&pool, 1, again.outbox_id, "w2", LEASE)
        .await
        .unwrap()
        .unwrap();
    assert_eq!(second.attempt, 2);
    // …and the thawed worker's retry, under its old lease, moves nothing.
    let stale = retry_of(frozen_job, frozen_owned.lease.unwrap(), AttemptEnd::Unknown);
    let outcome = schedule_retry(&pool, &stale, Duration::ZERO, 10)
        .await
        .unwrap();
    assert_eq!(outcome, RetryOutcome::NotOwned);
    assert_eq!(
        renew_leases(&pool, &[(frozen.id, frozen_owned.lease.unwrap())], LEASE)
            .await
            .unwrap(),
        0,
        "the old lease cannot be renewed either"
    );
    let status: String = sqlx::query_scalar("SELECT status FROM outbox WHERE id = $1")
        .bind(again.outbox_id)
        .fetch_one(&pool)
        .await
        .unwrap();
    assert_eq!(status, "DONE", "the second worker still owns it");
}

/// Provider ids wrap: two sends through one gateway got the same id minutes apart. A receipt
/// the provider wrote between the two belongs to the first, however late it arrives.
#[tokio::test]
async fn a_late_receipt_finds_its_own_message_after_the_provider_id_wrapped() {
    use herald_store::receipts::messages_for_receipts;

    let (_pg, pool) = migrated(4).await;
    let first = message(1, None, "first with id 7");
    let second = message(1, None, "second with id 7");
    accept_messages(&pool, &[first.clone(), second.clone()])
        .await
        .unwrap();
    send_all_as(&pool, 2, "7").await;
    // The first was submitted five minutes ago (its first CLAIMED), the second just now.
    sqlx::query(
        "UPDATE ledger SET submitted_at = now() - interval '5 minutes' WHERE message_id = $1",
    )
    .bind(first.id)
    .execute(&pool)
    .await
    .unwrap();
    let submitted: chrono::DateTime<chrono::Utc> =
        sqlx::query_scalar("SELECT submitted_at FROM ledger WHERE message_id = $1")
            .bind(second.id)
            .fetch_one(&pool)
            .await
            .unwrap();
    let claimed: chrono::DateTime<chrono::Utc> = sqlx::query_scalar(
        "SELECT min(at) FROM message_events WHERE message_id = $1 AND state = 'CLAIMED'",
    )
    .bind(second.id)
    .fetch_one(&pool)
    .await
    .unwrap();
    assert_eq!(submitted, claimed, "a ledger row records its first CLAIMED");
    let now = chrono::Utc::now();
    let lookups = [
        // Written four minutes ago, delivered to Herald only now.
        (
            "gw".to_owned(),
            "7".to_owned(),
            now - chrono::Duration::minutes(4),
        ),
        ("gw".to_owned(), "7".to_owned(), now),
        // Before either was submitted: neither.
        (
            "gw".to_owned(),
            "7".to_owned(),
            now - chrono::Duration::minutes(30),
        ),
        ("other".to_owned(), "7".to_owned(), now),
    ];
    let lookups: Vec<_> = lookups
        .into_iter()
        .map(|(gateway, provider_id, at)| final_receipt(&gateway, &provider_id, at))
        .collect();
    let found: Vec<_> = messages_for_receipts(&pool, &lookups)
        .await
        .unwrap()
        .into_iter()
        .map(|m| m.message_id)
        .collect();
    assert_eq!(found, vec![Some(first.id), Some(second.id), None, None]);
}

/// A receipt that comes before its send is recorded is held, charged nothing, and queued again
/// once the ledger row is written; one whose send never comes is parked after the window.
#[tokio::test]
async fn a_receipt_before_its_send_is_held_until_the_send_is_recorded() {
    use herald_store::receipts::{
        accept_receipt, hold_receipts, park_expired_held, release_held_receipts, ReceiptToHold,
    };

    let (_pg, pool) = migrated(4).await;
    let sent = message(1, None, "receipt first");
    accept_messages(&pool, std::slice::from_ref(&sent))
        .await
        .unwrap();
    let fence = take_over(&pool, 1, "p").await.unwrap();
    let send_job = claim_pending(&pool, fence, 1).await.unwrap().remove(0);
    let owned = confirm_ownership(&pool, 1, send_job.outbox_id, "w", LEASE)
        .await
        .unwrap()
        .unwrap();
    // Two receipts arrive: one for this send (id 3), one for an id nobody sent (id 99).
    let ours = accept_receipt(&pool, "gw", b"{\"id\":3}", None, 1)
        .await
        .unwrap();
    let stray = accept_receipt(&pool, "gw", b"{\"id\":99}", None, 1)
        .await
        .unwrap();
    let jobs = claim_pending(&pool, fence, 10).await.unwrap();
    assert_eq!(jobs.len(), 2);
    let now = chrono::Utc::now();
    let hold: Vec<ReceiptToHold> = jobs
        .iter()
        .zip([(ours, "3"), (stray, "99")])
        .map(|(job, (receipt_id, provider_id))| ReceiptToHold {
            partition: 1,
            outbox_id: job.outbox_id,
            receipt_id,
            gateway: "gw".to_owned(),
            provider_id: provider_id.to_owned(),
            provider_time: now,
            superseding: None,
        })
        .collect();
    assert_eq!(hold_receipts(&pool, &hold).await.unwrap().len(), 2);
    assert!(
        hold_receipts(&pool, &hold).await.unwrap().is_empty(),
        "a second copy holds nothing"
    );
    assert!(release_held_receipts(&pool, 100).await.unwrap().is_empty());
    // The send is recorded: the receipt for id 3 is queued again, the other keeps waiting.
    let key = send_effect_key(owned.message_id);
    let provider = ProviderReceipt {
        gateway: "gw".to_owned(),
        provider_id: "3".to_owned(),
    };
    record_accepted(&pool, sent.id, &key, &provider)
        .await
        .unwrap();
    assert_eq!(release_held_receipts(&pool, 100).await.unwrap(), vec![1]);
    let requeued = claim_pending(&pool, fence, 10).await.unwrap();
    assert_eq!(requeued.len(), 1);
    assert_eq!(requeued[0].payload["receipt_id"], ours);
    assert_eq!(requeued[0].attempt, 0, "holding charged nothing");
    // The stray one is parked with its raw body once the window is over, not before.
    assert_eq!(
        park_expired_held(&pool, Duration::from_secs(3600), 100)
            .await
            .unwrap(),
        0
    );
    assert_eq!(
        park_expired_held(&pool, Duration::ZERO, 100).await.unwrap(),
        1
    );
    let (raw, reason): (Vec<u8>, String) =
        sqlx::query_as("SELECT raw, reason FROM parking WHERE receipt_id = $1")
            .bind(stray)
            .fetch_one(&pool)
            .await
            .unwrap();
    assert_eq!(raw, b"{\"id\":99}");
    assert!(reason.contains("provider id 99"), "{reason}");
    assert_eq!(count(&pool, "SELECT count(*) FROM held_receipts").await, 0);
}

/// Provider ids wrap: a receipt for a send that is not recorded yet must not land on an older
/// message with the same id whose final receipt already settled it. Such a receipt is held
/// against the settled send and released when the newer send is recorded; a copy of the
/// settled send's own final receipt is applied at once; and one held with no newer send
/// coming is released after the window, to be applied to the settled send as a duplicate.
#[tokio::test]
async fn a_receipt_for_a_reused_id_waits_for_its_own_send_not_the_settled_one() {
    use herald_store::receipts::{
        accept_receipt, hold_receipts, messages_for_receipts, release_held_receipts, settled_sends,
        ReceiptToHold, SettledCheck,
    };

    let (_pg, pool) = migrated(4).await;
    let older = message(1, None, "older with id 7");
    let newer = message(1, None, "newer with id 7");
    let unsettled = message(1, None, "no final receipt yet");
    accept_messages(&pool, &[older.clone(), newer.clone(), unsettled.clone()])
        .await
        .unwrap();
    let fence = take_over(&pool, 1, "p").await.unwrap();
    let provider = |id: &str| ProviderReceipt {
        gateway: "gw".to_owned(),
        provider_id: id.to_owned(),
    };
    let mut owned = Vec::new();
    for job in claim_pending(&pool, fence, 3).await.unwrap() {
        owned.push(
            confirm_ownership(&pool, 1, job.outbox_id, "w", LEASE)
                .await
                .unwrap()
                .unwrap()
                .message_id,
        );
    }
    assert_eq!(owned, vec![older.id, newer.id, unsettled.id]);
    record_accepted(&pool, older.id, &send_effect_key(older.id), &provider("7"))
        .await
        .unwrap();
    record_accepted(
        &pool,
        unsettled.id,
        &send_effect_key(unsettled.id),
        &provider("8"),
    )
    .await
    .unwrap();
    // The older send was settled by its final receipt a minute ago.
    let settled_at = chrono::Utc::now() - chrono::Duration::minutes(1);
    sqlx::query(
        "INSERT INTO message_events (message_id, state, detail)
         VALUES ($1, 'DELIVERED', jsonb_build_object('receipt_id', 1, 'provider_status', 'DELIVRD',
                                                     'provider_time', $2::timestamptz))",
    )
    .bind(older.id)
    .bind(settled_at)
    .execute(&pool)
    .await
    .unwrap();
    let submitted_at = |id: uuid::Uuid| {
        let pool = pool.clone();
        async move {
            sqlx::query_scalar::<_, chrono::DateTime<chrono::Utc>>(
                "SELECT submitted_at FROM ledger WHERE message_id = $1",
            )
            .bind(id)
            .fetch_one(&pool)
            .await
            .unwrap()
        }
    };
    let older_submitted = submitted_at(older.id).await;

    let now = chrono::Utc::now();
    // Receipts for id 7, held against the send submitted at `superseding`.
    let to_hold = |jobs: &[herald_core::job::Job],
                   receipts: &[i64],
                   superseding: chrono::DateTime<chrono::Utc>| {
        jobs.iter()
            .zip(receipts)
            .map(|(job, receipt_id)| ReceiptToHold {
                partition: 1,
                outbox_id: job.outbox_id,
                receipt_id: *receipt_id,
                gateway: "gw".to_owned(),
                provider_id: "7".to_owned(),
                provider_time: now,
                superseding: Some(superseding),
            })
            .collect::<Vec<_>>()
    };
    // The receipt for the newer send matches only the older one so far...
    assert_eq!(
        messages_for_receipts(&pool, &[final_receipt("gw", "7", now)])
            .await
            .unwrap()[0]
            .message_id,
        Some(older.id)
    );
    // ...which is settled by an earlier final receipt. A copy of that receipt, or an
    // intermediate one stamped before it (arriving out of order), is the settled send's own;
    // a send without a final receipt takes its receipts as they come. A receipt stamped to
    // the minute in which the final one was stamped may be a newer send's from that minute:
    // held too; one whose minute ended before the final is the settled send's own.
    let check = |message_id, provider_time, resolution_secs| SettledCheck {
        message_id,
        provider_time,
        written_by: provider_time + chrono::Duration::seconds(resolution_secs),
    };
    let settled_minute = {
        use chrono::DurationRound;
        settled_at
            .duration_trunc(chrono::Duration::minutes(1))
            .unwrap()
    };
    assert_eq!(
        settled_sends(
            &pool,
            &[
                check(older.id, now, 1),
                check(older.id, settled_at, 1),
                check(older.id, settled_at - chrono::Duration::seconds(5), 1),
                check(unsettled.id, now, 1),
                check(older.id, settled_minute, 60),
                check(older.id, settled_minute - chrono::Duration::minutes(1), 60),
            ]
        )
        .await
        .unwrap(),
        vec![
            Some(older_submitted),
            None,
            None,
            None,
            Some(older_submitted),
            None
        ]
    );

    // Held against the older send: nothing releases it while the newer send is unrecorded.
    let body = b"{\"provider_id\":\"7\",\"status\":\"DELIVRD\",\"timestamp\":1}";
    let waits = accept_receipt(&pool, "gw", body, None, 1).await.unwrap();
    let lingers = accept_receipt(&pool, "gw", body, None, 1).await.unwrap();
    let jobs = claim_pending(&pool, fence, 10).await.unwrap();
    assert_eq!(jobs.len(), 2);
    let hold = to_hold(&jobs, &[waits, lingers], older_submitted);
    assert_eq!(hold_receipts(&pool, &hold).await.unwrap().len(), 2);
    assert!(release_held_receipts(&pool, 100).await.unwrap().is_empty());

    // The newer send is recorded: both are queued again and now find it.
    record_accepted(&pool, newer.id, &send_effect_key(newer.id), &provider("7"))
        .await
        .unwrap();
    assert_eq!(release_held_receipts(&pool, 100).await.unwrap(), vec![1, 1]);
    let requeued = claim_pending(&pool, fence, 10).await.unwrap();
    assert_eq!(requeued.len(), 2);
    assert!(requeued
        .iter()
        .all(|job| job.payload.get("as_duplicate").is_none()));
    assert_eq!(
        messages_for_receipts(&pool, &[final_receipt("gw", "7", now)])
            .await
            .unwrap()[0]
            .message_id,
        Some(newer.id)
    );

    // Held against the newest send, with no newer one coming: after the window it is
    // released to be applied to that send as a duplicate, not parked and not held forever.
    let again = to_hold(&requeued[..1], &[waits], submitted_at(newer.id).await);
    assert_eq!(hold_receipts(&pool, &again).await.unwrap().len(), 1);
    assert!(release_held_receipts(&pool, 100).await.unwrap().is_empty());
    sqlx::query("UPDATE held_receipts SET held_at = now() - interval '10 minutes'")
        .execute(&pool)
        .await
        .unwrap();
    assert_eq!(release_held_receipts(&pool, 100).await.unwrap(), vec![1]);
    let last = claim_pending(&pool, fence, 10).await.unwrap();
    assert_eq!(last.len(), 1);
    assert_eq!(last[0].payload["as_duplicate"], true);
    assert_eq!(last[0].payload["receipt_id"], waits);
}

/// A gateway that reuses a provider id within a minute and stamps its receipts to the minute:
/// three sends with id 9 started in one minute, the first already settled. Each receipt goes
/// to the oldest of them no final receipt has settled — counting the final receipts before it
/// in the same batch — not to the newest; a receipt stamped to the second still names one.
#[tokio::test]
async fn receipts_for_an_id_reused_within_their_minute_go_to_the_oldest_unsettled_send() {
    use herald_store::receipts::{messages_for_receipts, ReceiptLookup};

    let (_pg, pool) = migrated(4).await;
    let sends: Vec<_> = ["first", "second", "third"]
        .iter()
        .map(|name| message(1, None, name))
        .collect();
    accept_messages(&pool, &sends).await.unwrap();
    send_all_as(&pool, 3, "9").await;
    // The minute before last: the sends started 5, 24 and 43 s into it.
    let minute: chrono::DateTime<chrono::Utc> =
        sqlx::query_scalar("SELECT date_trunc('minute', now()) - interval '2 minutes'")
            .fetch_one(&pool)
            .await
            .unwrap();
    for (send, second) in sends.iter().zip([5, 24, 43]) {
        sqlx::query("UPDATE ledger SET submitted_at = $2 WHERE message_id = $1")
            .bind(send.id)
            .bind(minute + chrono::Duration::seconds(second))
            .execute(&pool)
            .await
            .unwrap();
    }
    settle(&pool, sends[0].id, 1, minute).await;
    let stamped_to_the_minute = |is_final| ReceiptLookup {
        gateway: "gw".to_owned(),
        provider_id: "9".to_owned(),
        written_from: minute,
        written_by: minute + chrono::Duration::minutes(1),
        is_final,
    };
    // In the order the gateway wrote them: the second send's final receipt, then the third's
    // intermediate and final ones, then a copy of the second's.
    let batch = [
        stamped_to_the_minute(true),
        stamped_to_the_minute(false),
        stamped_to_the_minute(true),
    ];
    let found = messages_for_receipts(&pool, &batch).await.unwrap();
    let ids: Vec<_> = found.iter().map(|m| m.message_id).collect();
    assert_eq!(
        ids,
        vec![Some(sends[1].id), Some(sends[2].id), Some(sends[2].id)]
    );
    assert!(found.iter().all(|m| m.ambiguous), "{found:?}");

    // Once the second's final receipt is recorded, the third's final receipt in a later batch
    // still finds the third.
    settle(&pool, sends[1].id, 2, minute).await;
    let later = messages_for_receipts(&pool, &[stamped_to_the_minute(true)])
        .await
        .unwrap();
    assert_eq!(later[0].message_id, Some(sends[2].id));
    // All three settled: the newest, as without reuse (the caller then holds or applies it
    // as a copy by its time).
    settle(&pool, sends[2].id, 3, minute).await;
    let settled = messages_for_receipts(&pool, &[stamped_to_the_minute(true)])
        .await
        .unwrap();
    assert_eq!(settled[0].message_id, Some(sends[2].id));

    // Stamped to the second, 50 ms after the second send started: only that send started
    // within its interval (plus the skew), so it is the second's and not ambiguous.
    let to_the_second = ReceiptLookup {
        gateway: "gw".to_owned(),
        provider_id: "9".to_owned(),
        written_from: minute + chrono::Duration::milliseconds(24_050),
        written_by: minute + chrono::Duration::milliseconds(25_050),
        is_final: true,
    };
    let exact = messages_for_receipts(&pool, &[to_the_second])
        .await
        .unwrap();
    assert_eq!(exact[0].message_id, Some(sends[1].id));
    assert!(!exact[0].ambiguous);
}

/// A status job carrying several receipts is finished whole in one statement: one receipt
/// parked, one held, one applied, the job DONE; a second copy of the job writes nothing.
#[tokio::test]
async fn a_status_job_s_receipts_are_finished_together_and_a_copy_writes_nothing() {
    use herald_store::receipts::{
        accept_receipts, finish_status_jobs, NewReceipt, ReceiptToApply, ReceiptToHold,
        ReceiptToPark, StatusOutcomes,
    };
    let (_pg, pool) = migrated(4).await;
    let sent = message(1, None, "batched receipts");
    accept_messages(&pool, std::slice::from_ref(&sent))
        .await
        .unwrap();
    let receipts: Vec<NewReceipt> = ["bad", "early", "good"]
        .iter()
        .map(|raw| NewReceipt {
            gateway: "gw".to_owned(),
            raw: raw.as_bytes().to_vec(),
            content_type: None,
            partition: 3,
        })
        .collect();
    let ids = accept_receipts(&pool, &receipts).await.unwrap();
    let (partition, job): (i32, i64) =
        sqlx::query_as("SELECT partition, id FROM outbox WHERE job_type = 'status'")
            .fetch_one(&pool)
            .await
            .unwrap();
    assert_eq!(partition, 3, "one job, on its first receipt's partition");
    let outcomes = StatusOutcomes {
        parks: vec![ReceiptToPark {
            partition: 3,
            outbox_id: job,
            receipt_id: Some(ids[0]),
            raw: b"bad".to_vec(),
            reason: "undecodable".to_owned(),
        }],
        holds: vec![ReceiptToHold {
            partition: 3,
            outbox_id: job,
            receipt_id: ids[1],
            gateway: "gw".to_owned(),
            provider_id: "7".to_owned(),
            provider_time: chrono::Utc::now(),
            superseding: None,
        }],
        applies: vec![ReceiptToApply {
            partition: 3,
            outbox_id: job,
            message_id: sent.id,
            state: herald_core::MessageState::Enroute,
            detail: serde_json::json!({"provider_status": "ENROUTE", "receipt_id": ids[2]}),
        }],
    };
    let rows = |pool: sqlx::PgPool| async move {
        (
            count(&pool, "SELECT count(*) FROM parking").await,
            count(&pool, "SELECT count(*) FROM held_receipts").await,
            count(
                &pool,
                "SELECT count(*) FROM message_events WHERE state = 'ENROUTE'",
            )
            .await,
        )
    };
    // Not handed to a worker yet (PENDING): nothing is written.
    assert!(finish_status_jobs(&pool, &outcomes.jobs(), &outcomes)
        .await
        .unwrap()
        .is_empty());
    assert_eq!(rows(pool.clone()).await, (0, 0, 0));
    sqlx::query("UPDATE outbox SET status = 'PUBLISHED' WHERE id = $1")
        .bind(job)
        .execute(&pool)
        .await
        .unwrap();
    assert_eq!(
        finish_status_jobs(&pool, &outcomes.jobs(), &outcomes)
            .await
            .unwrap(),
        [(3, job)]
    );
    assert_eq!(rows(pool.clone()).await, (1, 1, 1));
    assert_eq!(
        count(&pool, "SELECT count(*) FROM outbox WHERE status = 'DONE'").await,
        1
    );
    // Another copy of the same job.
    assert!(finish_status_jobs(&pool, &outcomes.jobs(), &outcomes)
        .await
        .unwrap()
        .is_empty());
    assert_eq!(rows(pool.clone()).await, (1, 1, 1));
}

/// Rule R7 without a table of its own: the reconciliation reads the ledger rows created since
/// its last pass, marks those without a final receipt UNKNOWN once, and does not move past a
/// ledger write that is still open (its row would appear behind the watermark).
#[tokio::test]
async fn the_reconciliation_reads_the_ledger_once_and_waits_for_open_writes() {
    use herald_store::receipts::{ledger_committed_up_to, reconcile_ledger};
    let (_pg, pool) = migrated(4).await;
    let sent: Vec<_> = (0..3).map(|i| message(i, None, "silent?")).collect();
    accept_messages(&pool, &sent).await.unwrap();
    let receipt = ProviderReceipt {
        gateway: "gw".to_owned(),
        provider_id: "1".to_owned(),
    };
    for m in &sent[..2] {
        assert!(
            record_accepted(&pool, m.id, &send_effect_key(m.id), &receipt)
                .await
                .unwrap()
        );
    }
    // The first got its final receipt.
    sqlx::query(
        "INSERT INTO message_events (message_id, state, detail)
         VALUES ($1, 'DELIVERED', '{\"provider_status\": \"DELIVRD\"}')",
    )
    .bind(sent[0].id)
    .execute(&pool)
    .await
    .unwrap();
    // The third's ledger write is still open.
    let mut open = pool.begin().await.unwrap();
    sqlx::query(
        "INSERT INTO ledger (idempotency_key, message_id, gateway, provider_id, created_at)
         VALUES ($1, $2, 'gw', '2', clock_timestamp())",
    )
    .bind(send_effect_key(sent[2].id))
    .bind(sent[2].id)
    .execute(&mut *open)
    .await
    .unwrap();
    assert_eq!(
        ledger_committed_up_to(&pool, Duration::from_millis(200))
            .await
            .unwrap(),
        None,
        "an open ledger write holds the cutoff back"
    );
    open.commit().await.unwrap();
    let cutoff = ledger_committed_up_to(&pool, Duration::from_secs(5))
        .await
        .unwrap()
        .expect("no ledger write is open");
    assert_eq!(
        reconcile_ledger(&pool, cutoff, 1000).await.unwrap(),
        (2, false)
    );
    let unknown = |id| {
        let pool = pool.clone();
        async move {
            sqlx::query_scalar::<_, i64>(
                "SELECT count(*) FROM message_events WHERE message_id = $1 AND state = 'UNKNOWN'",
            )
            .bind(id)
            .fetch_one(&pool)
            .await
            .unwrap()
        }
    };
    assert_eq!(
        unknown(sent[0].id).await,
        0,
        "a delivered message is never UNKNOWN"
    );
    assert_eq!(unknown(sent[1].id).await, 1);
    assert_eq!(unknown(sent[2].id).await, 1);
    // The next pass reads nothing twice.
    assert_eq!(
        reconcile_ledger(&pool, cutoff, 1000).await.unwrap(),
        (0, false)
    );
    assert_eq!(unknown(sent[1].id).await, 1);
    // A pass in batches of one gets through every row, one at a time.
    let later: Vec<_> = (0..3).map(|i| message(i, None, "later")).collect();
    accept_messages(&pool, &later).await.unwrap();
    for m in &later {
        record_accepted(&pool, m.id, &send_effect_key(m.id), &receipt)
            .await
            .unwrap();
    }
    let cutoff = ledger_committed_up_to(&pool, Duration::from_secs(5))
        .await
        .unwrap()
        .unwrap();
    let mut marked = 0;
    loop {
        let (count, more) = reconcile_ledger(&pool, cutoff, 1).await.unwrap();
        marked += count;
        if !more {
            break;
        }
    }
    assert_eq!(marked, 3);
}

/// A final receipt stamped `at` to a second (as Unix seconds are), to look its send up by.
fn final_receipt(
    gateway: &str,
    provider_id: &str,
    at: chrono::DateTime<chrono::Utc>,
) -> herald_store::receipts::ReceiptLookup {
    herald_store::receipts::ReceiptLookup {
        gateway: gateway.to_owned(),
        provider_id: provider_id.to_owned(),
        written_from: at,
        written_by: at + chrono::Duration::seconds(1),
        is_final: true,
    }
}

/// Appends to `message`'s history the DELIVERED of final receipt `receipt_id`, stamped `at`.
async fn settle(
    pool: &sqlx::PgPool,
    message: uuid::Uuid,
    receipt_id: i64,
    at: chrono::DateTime<chrono::Utc>,
) {
    sqlx::query(
        "INSERT INTO message_events (message_id, state, detail)
         VALUES ($1, 'DELIVERED', jsonb_build_object('receipt_id', $2::bigint,
                                                     'provider_status', 'DELIVRD',
                                                     'provider_time', $3::timestamptz))",
    )
    .bind(message)
    .bind(receipt_id)
    .bind(at)
    .execute(pool)
    .await
    .unwrap();
}

/// Claims the `n` sends waiting in partition 1, confirms each and records it as accepted by
/// gateway `gw` under `provider_id` (a gateway that reused the id for all of them).
async fn send_all_as(pool: &sqlx::PgPool, n: u32, provider_id: &str) {
    let fence = take_over(pool, 1, "p").await.unwrap();
    let receipt = ProviderReceipt {
        gateway: "gw".to_owned(),
        provider_id: provider_id.to_owned(),
    };
    for job in claim_pending(pool, fence, n).await.unwrap() {
        let owned = confirm_ownership(pool, 1, job.outbox_id, "w", LEASE)
            .await
            .unwrap()
            .unwrap();
        let key = send_effect_key(owned.message_id);
        record_accepted(pool, owned.message_id, &key, &receipt)
            .await
            .unwrap();
    }
}
