use std::time::Duration;

use herald_core::send_effect_key;
use herald_store::accept::accept_messages;
use herald_store::effects::{
    confirm_ownership, record_accepted, record_failed, schedule_retry, ProviderReceipt,
    RetryOutcome,
};
use herald_store::leases::take_over;
use herald_store::messages::message_with_history;
use herald_store::outbox::claim_pending;

use crate::{count, message, migrated};

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

    let owned = confirm_ownership(&pool, 2, job.outbox_id, "w1")
        .await
        .unwrap()
        .unwrap();
    assert_eq!(owned.message_id, sent.id);
    assert_eq!(owned.recipient, sent.recipient);
    assert!(!owned.already_accepted);
    // A second copy of the job finds the row DONE and gets nothing.
    assert!(confirm_ownership(&pool, 2, job.outbox_id, "w2")
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
    confirm_ownership(&pool, 1, job.outbox_id, "w")
        .await
        .unwrap()
        .unwrap();
    let outcome = schedule_retry(&pool, 1, job.outbox_id, "503", Duration::ZERO, 2)
        .await
        .unwrap();
    assert_eq!(outcome, RetryOutcome::Scheduled);
    // Only a DONE row can be scheduled again.
    let again = schedule_retry(&pool, 1, job.outbox_id, "503", Duration::ZERO, 2)
        .await
        .unwrap();
    assert_eq!(again, RetryOutcome::NotOwned);

    let job = claim_pending(&pool, fence, 1).await.unwrap().remove(0);
    assert_eq!(job.attempt, 2);
    confirm_ownership(&pool, 1, job.outbox_id, "w")
        .await
        .unwrap()
        .unwrap();
    let outcome = schedule_retry(&pool, 1, job.outbox_id, "503", Duration::ZERO, 2)
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
    let owned = confirm_ownership(&pool, 1, job.outbox_id, "w")
        .await
        .unwrap()
        .unwrap();
    assert!(owned.already_accepted);
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
    confirm_ownership(&pool, 1, job.outbox_id, "w")
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
