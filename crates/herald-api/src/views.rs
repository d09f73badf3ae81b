//! Store rows mapped into the API's wire types (`herald_client::wire`): the one place where
//! a table's shape meets the API's, so a change of a table is not a change of the API by
//! accident.

use herald_client::wire::{DeadOutboxRow, HistoryEvent, MessageHistory, ParkedItem, PartitionInfo};

pub fn message_history(view: herald_store::messages::MessageView) -> MessageHistory {
    MessageHistory {
        id: view.id,
        partition: view.partition,
        recipient: view.recipient,
        body: view.body,
        idempotency_key: view.idempotency_key,
        created_by: view.created_by,
        created_at: view.created_at,
        state: view.state,
        events: view
            .events
            .into_iter()
            .map(|event| HistoryEvent {
                seq: event.seq,
                state: event.state,
                at: event.at,
                detail: event.detail,
            })
            .collect(),
    }
}

pub fn partition_info(view: herald_store::outbox::PartitionView) -> PartitionInfo {
    PartitionInfo {
        partition: view.partition,
        owner: view.owner,
        epoch: view.epoch,
        acquired_at: view.acquired_at,
        pending: view.pending,
        oldest_pending_age_seconds: view.oldest_pending_age_seconds,
    }
}

pub fn dead_row(row: herald_store::outbox::DeadRow) -> DeadOutboxRow {
    DeadOutboxRow {
        id: row.id,
        partition: row.partition,
        job_type: row.job_type,
        message_id: row.message_id,
        attempts: row.attempts,
        last_error: row.last_error,
        created_at: row.created_at,
    }
}

pub fn parked_item(row: herald_store::receipts::Parked) -> ParkedItem {
    ParkedItem {
        id: row.id,
        job_type: row.job_type,
        receipt_id: row.receipt_id,
        gateway: row.gateway,
        raw: row.raw,
        reason: row.reason,
        parked_at: row.parked_at,
    }
}
