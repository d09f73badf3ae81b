//! The one place that derives the idempotency key of an effect (rule R5).
//!
//! Every writer of an effect — the send path, a re-drive after a crash, an operator's replay —
//! calls this function, so the same effect always carries the same key: the provider dedupes
//! its submits by it and the ledger's UNIQUE constraint rejects a second row for it.

use uuid::Uuid;

/// The key of "message `message_id` was submitted to the provider".
///
/// It depends on the message id only, never on the attempt, the worker or the time.
pub fn send_effect_key(message_id: Uuid) -> String {
    format!("herald-send-{}", message_id.simple())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn same_message_same_key_other_message_other_key() {
        let a = Uuid::now_v7();
        let b = Uuid::now_v7();
        assert_eq!(send_effect_key(a), send_effect_key(a));
        assert_ne!(send_effect_key(a), send_effect_key(b));
    }
}
