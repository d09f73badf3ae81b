//! The verdict of a proof: what became of every accepted message, and whether that is an end a
//! user would accept. `herald verify` (the whole database) and the load tester (the ids it was
//! answered 2xx for) gather the facts; this module alone decides.
//!
//! A message is *delivered* when its one effect is in the ledger and at the provider and its
//! final receipt state is the one the provider sent; *rejected* when the caller caused it (an
//! internal check or the provider refusing its content) and nothing reached the provider.
//! Every other end is wrong unless the run said it expects it (`--expect dead=5`): DEAD,
//! FAILED for a provider-side or configuration reason, UNKNOWN, a receipt still parked, a
//! message still on its way. Some ends are wrong whatever is expected: a message the database
//! does not have, an effect doubled, an effect without its provider submit, a DEAD or UNKNOWN
//! message the provider took and receipted, a final state the provider never sent.
//!
//! Longer than 400 lines with its unit tests (the code is under 500): every end a message can have
//! is decided here, in one place, on purpose.

use std::collections::BTreeMap;
use std::fmt;
use std::str::FromStr;

use serde::{Deserialize, Serialize};
use uuid::Uuid;

use crate::idempotency::send_effect_key;
use crate::receipt::is_final;
use crate::MessageState;

/// Why a FAILED message failed, as its FAILED event records it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum FailureCause {
    /// The message's own content: an internal check or the provider refusing it (400, 422).
    Content,
    /// Anything else: a provider-side or configuration failure.
    Other,
}

/// What the provider says it did with one message's effect key.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum ProviderFinal {
    /// The provider sends no receipts (or the proof cannot ask): ACCEPTED is an end.
    #[default]
    NoReceipts,
    /// The provider posted this final state.
    Final(MessageState),
    /// The provider posted a final receipt Herald cannot map (a status outside the vocabulary
    /// or a malformed timestamp): it must be parked until an operator maps it.
    Unmappable,
    /// The provider never posted a final receipt.
    Silent,
}

/// What the provider recorded for one effect key: its submits and the receipts it sent.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct ProviderView {
    pub submits: u64,
    pub final_receipt: ProviderFinal,
}

impl ProviderFinal {
    /// The final receipt among `receipts` (status, malformed timestamp), in the order they
    /// were sent; `None` when the provider sends no receipts.
    pub fn from_receipts<'a>(
        receipts: Option<impl IntoIterator<Item = (&'a str, bool)>>,
    ) -> ProviderFinal {
        let Some(receipts) = receipts else {
            return ProviderFinal::NoReceipts;
        };
        let no_aliases = std::collections::HashMap::new();
        let mut last = ProviderFinal::Silent;
        for (status, malformed) in receipts {
            last = match crate::receipt::map_status(status, &no_aliases) {
                Ok(state) if !is_final(state) => continue,
                Ok(_) if malformed => ProviderFinal::Unmappable,
                Ok(state) => ProviderFinal::Final(state),
                Err(_) => ProviderFinal::Unmappable,
            };
        }
        last
    }
}

/// What PostgreSQL and the provider know of one accepted message.
#[derive(Debug, Clone, Default)]
pub struct Evidence {
    /// The database has the message.
    pub in_database: bool,
    /// Idempotency keys of its ledger rows.
    pub ledger_keys: Vec<String>,
    /// Its current state (the highest-ranked event); `None` while it has no event: QUEUED.
    pub state: Option<MessageState>,
    /// Its send outbox row is DEAD.
    pub dead: bool,
    /// It has a FAILED event, with this cause.
    pub failure: Option<FailureCause>,
    /// Submits the provider recorded under the message's effect key.
    pub provider_submits: u64,
    pub provider_final: ProviderFinal,
}

/// The classes of ends. Only `Delivered` and `Rejected` are right by themselves.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Fate {
    Delivered,
    Rejected,
    /// DEAD and the provider never took it (expectable: a provider outage).
    Dead,
    /// FAILED for a reason the caller did not cause (a 401, a 404, a 5xx treated as final).
    FailedWrongly,
    /// UNKNOWN, or waiting for a final receipt the provider never sent (expectable: a silent
    /// gateway).
    Unknown,
    /// The provider sent a final receipt Herald could not map; it waits in the parking table
    /// (expectable: a provider speaking an unknown vocabulary).
    ReceiptParked,
    /// No outcome yet: not sent, or sent and not recorded, or the final receipt not applied.
    Unsettled,
    /// Answered 2xx, but the database does not have it.
    Missing,
    /// A ledger row whose submit the provider never saw.
    MissingAtProvider,
    /// More than one ledger row, or a ledger row under a key not derived from the message.
    Doubled,
    /// DEAD although the provider took the effect.
    DeadWithEffect,
    /// UNKNOWN or FAILED although the provider took it and sent a final receipt.
    UnknownDespiteReceipt,
    /// A final state other than the one the provider sent (or one it never sent).
    WrongFinalState,
}

impl Fate {
    pub const ALL: [Fate; 13] = [
        Fate::Delivered,
        Fate::Rejected,
        Fate::Dead,
        Fate::FailedWrongly,
        Fate::Unknown,
        Fate::ReceiptParked,
        Fate::Unsettled,
        Fate::Missing,
        Fate::MissingAtProvider,
        Fate::Doubled,
        Fate::DeadWithEffect,
        Fate::UnknownDespiteReceipt,
        Fate::WrongFinalState,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            Fate::Delivered => "delivered",
            Fate::Rejected => "rejected",
            Fate::Dead => "dead",
            Fate::FailedWrongly => "failed_wrongly",
            Fate::Unknown => "unknown",
            Fate::ReceiptParked => "receipt_parked",
            Fate::Unsettled => "unsettled",
            Fate::Missing => "missing",
            Fate::MissingAtProvider => "missing_at_provider",
            Fate::Doubled => "doubled",
            Fate::DeadWithEffect => "dead_with_effect",
            Fate::UnknownDespiteReceipt => "unknown_despite_receipt",
            Fate::WrongFinalState => "wrong_final_state",
        }
    }

    /// Right by itself: no expectation needed.
    pub fn is_right(self) -> bool {
        matches!(self, Fate::Delivered | Fate::Rejected)
    }

    /// A run may declare how many of these it expects (a provider outage expects DEAD).
    /// The others are wrong whatever the run expects.
    pub fn is_expectable(self) -> bool {
        matches!(
            self,
            Fate::Dead | Fate::FailedWrongly | Fate::Unknown | Fate::ReceiptParked
        )
    }

    /// The message is still moving: a proof that waits for the pipeline waits for these.
    pub fn in_progress(self) -> bool {
        matches!(self, Fate::Unsettled)
    }
}

impl fmt::Display for Fate {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// Decides one message's fate from its evidence.
pub fn classify(id: Uuid, evidence: &Evidence) -> Fate {
    if !evidence.in_database {
        return Fate::Missing;
    }
    let key = send_effect_key(id);
    let effects = evidence.ledger_keys.len();
    if effects > 1 || evidence.ledger_keys.iter().any(|k| *k != key) {
        return Fate::Doubled;
    }
    let at_provider = evidence.provider_submits > 0;
    if effects == 1 && !at_provider {
        return Fate::MissingAtProvider;
    }
    let receipted = matches!(evidence.provider_final, ProviderFinal::Final(_));
    if let Some(cause) = evidence.failure {
        return match (cause, at_provider, receipted) {
            (_, true, true) => Fate::UnknownDespiteReceipt,
            (FailureCause::Content, false, _) if effects == 0 => Fate::Rejected,
            _ => Fate::FailedWrongly,
        };
    }
    if evidence.dead {
        return if at_provider {
            Fate::DeadWithEffect
        } else {
            Fate::Dead
        };
    }
    if effects == 0 {
        return Fate::Unsettled;
    }
    let state = evidence.state.unwrap_or(MessageState::Queued);
    match (state, evidence.provider_final) {
        (s, ProviderFinal::Final(sent)) if is_final(s) => {
            if s == sent {
                Fate::Delivered
            } else {
                Fate::WrongFinalState
            }
        }
        // An operator mapped the unknown status (an alias) and replayed it.
        (s, ProviderFinal::Unmappable) if is_final(s) => Fate::Delivered,
        (s, ProviderFinal::Silent | ProviderFinal::NoReceipts) if is_final(s) => {
            Fate::WrongFinalState
        }
        (MessageState::Unknown, ProviderFinal::Final(_)) => Fate::UnknownDespiteReceipt,
        (MessageState::Unknown, _) => Fate::Unknown,
        (_, ProviderFinal::NoReceipts) => Fate::Delivered,
        (_, ProviderFinal::Silent) => Fate::Unknown,
        (_, ProviderFinal::Unmappable) => Fate::ReceiptParked,
        (_, ProviderFinal::Final(_)) => Fate::Unsettled,
    }
}

/// Problems the proof finds outside any one message.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Finding {
    /// Effects the provider took under a key that belongs to no message.
    OrphanEffects,
    /// Parked input nobody replayed yet (expectable: `parked=N`).
    Parked,
    /// Status jobs (receipts) whose outbox row is not DONE.
    ReceiptsUnfinished,
    /// Messages without their send outbox row, or receipts no status outbox row names:
    /// something deleted the proof (rule R3).
    OutboxRowsMissing,
    /// Events, ledger rows or in-flight claims naming a message the database does not have:
    /// the history lost its message (no foreign key stops it; this check does).
    HistoryWithoutMessage,
}

impl Finding {
    pub const ALL: [Finding; 5] = [
        Finding::OrphanEffects,
        Finding::Parked,
        Finding::ReceiptsUnfinished,
        Finding::OutboxRowsMissing,
        Finding::HistoryWithoutMessage,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            Finding::OrphanEffects => "orphan_effects",
            Finding::Parked => "parked",
            Finding::ReceiptsUnfinished => "receipts_unfinished",
            Finding::OutboxRowsMissing => "outbox_rows_missing",
            Finding::HistoryWithoutMessage => "history_without_message",
        }
    }

    pub fn is_expectable(self) -> bool {
        self == Finding::Parked
    }
}

/// What a run declares it expects: `dead=5,unknown=10,parked=5`. A declared class must come
/// out exactly so; an undeclared wrong class must be 0.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Expectations(pub BTreeMap<String, u64>);

#[derive(Debug, thiserror::Error, PartialEq, Eq)]
#[error("{0}")]
pub struct BadExpectation(String);

impl FromStr for Expectations {
    type Err = BadExpectation;

    fn from_str(text: &str) -> Result<Self, Self::Err> {
        let mut expected = BTreeMap::new();
        for item in text.split(',').map(str::trim).filter(|s| !s.is_empty()) {
            let (name, count) = item
                .split_once('=')
                .ok_or_else(|| BadExpectation(format!("expected CLASS=COUNT, got {item:?}")))?;
            let name = name.trim();
            let expectable = Fate::ALL
                .iter()
                .any(|f| f.as_str() == name && f.is_expectable())
                || Finding::ALL
                    .iter()
                    .any(|f| f.as_str() == name && f.is_expectable());
            if !expectable {
                return Err(BadExpectation(format!(
                    "{name:?} cannot be expected; expectable: dead, failed_wrongly, unknown, receipt_parked, parked"
                )));
            }
            let count = count
                .trim()
                .parse()
                .map_err(|_| BadExpectation(format!("{item:?}: the count is not a number")))?;
            expected.insert(name.to_owned(), count);
        }
        Ok(Self(expected))
    }
}

/// One class that came out other than expected.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Violation {
    pub class: String,
    pub found: u64,
    pub expected: u64,
    /// Up to five example ids of messages in the class.
    pub examples: Vec<Uuid>,
}

/// The tally of a proof: every message's fate, the findings, and the expectations.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Verdict {
    pub messages: u64,
    /// Messages per fate (every fate listed, zeros included).
    pub fates: BTreeMap<String, u64>,
    /// Final states of delivered messages (DELIVERED, UNDELIVERED, EXPIRED, ACCEPTED when the
    /// provider sends no receipts).
    pub delivered_states: BTreeMap<String, u64>,
    pub findings: BTreeMap<String, u64>,
    pub expected: Expectations,
    /// Up to five example ids per fate that is not right by itself.
    pub examples: BTreeMap<String, Vec<Uuid>>,
}

impl Verdict {
    pub fn new(expected: Expectations) -> Self {
        Self {
            fates: Fate::ALL
                .iter()
                .map(|f| (f.as_str().to_owned(), 0))
                .collect(),
            findings: Finding::ALL
                .iter()
                .map(|f| (f.as_str().to_owned(), 0))
                .collect(),
            expected,
            ..Self::default()
        }
    }

    /// Counts one message.
    pub fn add(&mut self, id: Uuid, fate: Fate, state: Option<MessageState>) {
        self.messages += 1;
        *self.fates.entry(fate.as_str().to_owned()).or_default() += 1;
        if fate == Fate::Delivered {
            let state = state.map(|s| s.as_str()).unwrap_or("?");
            *self.delivered_states.entry(state.to_owned()).or_default() += 1;
        }
        if !fate.is_right() {
            let examples = self.examples.entry(fate.as_str().to_owned()).or_default();
            if examples.len() < 5 {
                examples.push(id);
            }
        }
    }

    pub fn set_finding(&mut self, finding: Finding, count: u64) {
        self.findings.insert(finding.as_str().to_owned(), count);
    }

    pub fn count(&self, fate: Fate) -> u64 {
        self.fates.get(fate.as_str()).copied().unwrap_or(0)
    }

    pub fn finding(&self, finding: Finding) -> u64 {
        self.findings.get(finding.as_str()).copied().unwrap_or(0)
    }

    /// Every class that is not as expected: a wrong class that is not 0, or an expected one
    /// whose count differs.
    pub fn violations(&self) -> Vec<Violation> {
        let mut out = Vec::new();
        let wrong_fates = Fate::ALL.iter().filter(|f| !f.is_right());
        let classes = wrong_fates
            .map(|f| (f.as_str(), self.count(*f)))
            .chain(Finding::ALL.iter().map(|f| (f.as_str(), self.finding(*f))));
        for (class, found) in classes {
            let expected = self.expected.0.get(class).copied().unwrap_or(0);
            if found != expected {
                out.push(Violation {
                    class: class.to_owned(),
                    found,
                    expected,
                    examples: self.examples.get(class).cloned().unwrap_or_default(),
                });
            }
        }
        out
    }

    pub fn ok(&self) -> bool {
        self.violations().is_empty()
    }

    /// Messages that had their effect twice.
    pub fn doubled(&self) -> u64 {
        self.count(Fate::Doubled)
    }

    /// Messages accepted and not delivered, rejected or in an expected class.
    pub fn lost(&self) -> u64 {
        self.count(Fate::Missing)
            + self.count(Fate::MissingAtProvider)
            + self.count(Fate::Unsettled)
    }

    /// Human-readable lines: the fates, the findings and what is wrong.
    pub fn lines(&self) -> Vec<String> {
        let mut lines = vec![format!("messages: {}", self.messages)];
        for fate in Fate::ALL {
            let n = self.count(fate);
            if n > 0 || fate.is_right() {
                let expected = self
                    .expected
                    .0
                    .get(fate.as_str())
                    .map(|e| format!(" (expected {e})"))
                    .unwrap_or_default();
                lines.push(format!("  {:<24} {n}{expected}", fate.as_str()));
            }
        }
        if !self.delivered_states.is_empty() {
            let states: Vec<String> = self
                .delivered_states
                .iter()
                .map(|(s, n)| format!("{s} {n}"))
                .collect();
            lines.push(format!("  delivered by final state: {}", states.join(", ")));
        }
        for finding in Finding::ALL {
            lines.push(format!(
                "  {:<24} {}",
                finding.as_str(),
                self.finding(finding)
            ));
        }
        for v in self.violations() {
            let examples: Vec<String> = v.examples.iter().map(Uuid::to_string).collect();
            lines.push(format!(
                "WRONG {}: {} (expected {}){}",
                v.class,
                v.found,
                v.expected,
                if examples.is_empty() {
                    String::new()
                } else {
                    format!(", e.g. {}", examples.join(" "))
                }
            ));
        }
        lines.push(format!(
            "verdict: {}",
            if self.ok() { "OK" } else { "FAILED" }
        ));
        lines
    }
}

/// The message id an effect key names, if it is a send effect key.
pub fn message_of_effect_key(key: &str) -> Option<Uuid> {
    let simple = key.strip_prefix("herald-send-")?;
    let id = Uuid::try_parse(simple).ok()?;
    (send_effect_key(id) == key).then_some(id)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn delivered(id: Uuid) -> Evidence {
        Evidence {
            in_database: true,
            ledger_keys: vec![send_effect_key(id)],
            state: Some(MessageState::Delivered),
            provider_submits: 1,
            provider_final: ProviderFinal::Final(MessageState::Delivered),
            ..Evidence::default()
        }
    }

    fn fate(f: impl FnOnce(&mut Evidence)) -> Fate {
        let id = Uuid::now_v7();
        let mut evidence = delivered(id);
        f(&mut evidence);
        classify(id, &evidence)
    }

    #[test]
    fn a_receipted_effect_with_the_receipt_s_state_is_delivered() {
        assert_eq!(fate(|_| {}), Fate::Delivered);
        assert_eq!(
            fate(|e| {
                e.state = Some(MessageState::Undelivered);
                e.provider_final = ProviderFinal::Final(MessageState::Undelivered);
            }),
            Fate::Delivered
        );
        // Without receipts, ACCEPTED is the end.
        assert_eq!(
            fate(|e| {
                e.state = Some(MessageState::Accepted);
                e.provider_final = ProviderFinal::NoReceipts;
            }),
            Fate::Delivered
        );
    }

    #[test]
    fn dead_without_any_provider_call_is_wrong_and_only_expectable() {
        let f = fate(|e| {
            e.ledger_keys.clear();
            e.state = Some(MessageState::Dead);
            e.dead = true;
            e.provider_submits = 0;
            e.provider_final = ProviderFinal::NoReceipts;
        });
        assert_eq!(f, Fate::Dead);
        assert!(!f.is_right() && f.is_expectable());
    }

    #[test]
    fn dead_or_unknown_with_a_provider_effect_is_wrong_whatever_is_expected() {
        let dead = fate(|e| {
            e.ledger_keys.clear();
            e.dead = true;
            e.state = Some(MessageState::Dead);
        });
        assert_eq!(dead, Fate::DeadWithEffect);
        assert!(!dead.is_expectable());
        let unknown = fate(|e| e.state = Some(MessageState::Unknown));
        assert_eq!(unknown, Fate::UnknownDespiteReceipt);
        assert!(!unknown.is_expectable());
    }

    #[test]
    fn failed_is_right_only_for_the_caller_s_content_with_nothing_sent() {
        let content = |e: &mut Evidence| {
            e.ledger_keys.clear();
            e.provider_submits = 0;
            e.provider_final = ProviderFinal::NoReceipts;
            e.state = Some(MessageState::Failed);
            e.failure = Some(FailureCause::Content);
        };
        assert_eq!(fate(content), Fate::Rejected);
        assert_eq!(
            fate(|e| {
                content(e);
                e.failure = Some(FailureCause::Other);
            }),
            Fate::FailedWrongly
        );
    }

    #[test]
    fn a_final_state_the_provider_did_not_send_is_wrong() {
        assert_eq!(
            fate(|e| e.provider_final = ProviderFinal::Final(MessageState::Expired)),
            Fate::WrongFinalState
        );
        assert_eq!(
            fate(|e| e.provider_final = ProviderFinal::Silent),
            Fate::WrongFinalState
        );
    }

    #[test]
    fn waiting_ends_are_classified_by_what_the_provider_sent() {
        let accepted = |e: &mut Evidence| e.state = Some(MessageState::Enroute);
        assert_eq!(fate(accepted), Fate::Unsettled);
        assert_eq!(
            fate(|e| {
                accepted(e);
                e.provider_final = ProviderFinal::Silent;
            }),
            Fate::Unknown
        );
        assert_eq!(
            fate(|e| {
                accepted(e);
                e.provider_final = ProviderFinal::Unmappable;
            }),
            Fate::ReceiptParked
        );
        assert_eq!(
            fate(|e| {
                e.state = Some(MessageState::Unknown);
                e.provider_final = ProviderFinal::Silent;
            }),
            Fate::Unknown
        );
    }

    #[test]
    fn missing_doubled_and_unsubmitted_effects() {
        assert_eq!(fate(|e| e.in_database = false), Fate::Missing);
        assert_eq!(
            fate(|e| e.ledger_keys.push("other".to_owned())),
            Fate::Doubled
        );
        assert_eq!(
            fate(|e| e.ledger_keys = vec!["herald-send-elsewhere".to_owned()]),
            Fate::Doubled
        );
        assert_eq!(fate(|e| e.provider_submits = 0), Fate::MissingAtProvider);
        assert_eq!(
            fate(|e| {
                e.ledger_keys.clear();
                e.state = Some(MessageState::Retrying);
            }),
            Fate::Unsettled
        );
    }

    #[test]
    fn the_verdict_fails_on_any_unexpected_class_and_on_a_wrong_expectation() {
        let mut verdict = Verdict::new(Expectations::default());
        verdict.add(
            Uuid::now_v7(),
            Fate::Delivered,
            Some(MessageState::Delivered),
        );
        assert!(verdict.ok());
        let dead = Uuid::now_v7();
        verdict.add(dead, Fate::Dead, Some(MessageState::Dead));
        let violations = verdict.violations();
        assert_eq!(violations.len(), 1);
        assert_eq!(violations[0].class, "dead");
        assert_eq!(violations[0].examples, vec![dead]);

        verdict.expected = "dead=1".parse().unwrap();
        assert!(verdict.ok());
        verdict.expected = "dead=2".parse().unwrap();
        assert!(!verdict.ok(), "an expectation is exact");
        verdict.expected = "dead=1".parse().unwrap();
        verdict.set_finding(Finding::OrphanEffects, 1);
        assert!(!verdict.ok());
        assert!(verdict
            .lines()
            .iter()
            .any(|l| l.starts_with("WRONG orphan_effects")));
    }

    #[test]
    fn only_expectable_classes_can_be_expected() {
        assert!("dead=3, unknown=2,parked=1".parse::<Expectations>().is_ok());
        assert!("doubled=1".parse::<Expectations>().is_err());
        assert!("missing=1".parse::<Expectations>().is_err());
        assert!("dead".parse::<Expectations>().is_err());
        assert!("dead=x".parse::<Expectations>().is_err());
    }

    #[test]
    fn the_provider_s_final_receipt_is_the_last_final_one_it_sent() {
        let of = |r: &[(&str, bool)]| ProviderFinal::from_receipts(Some(r.iter().copied()));
        assert_eq!(
            of(&[("ENROUTE", false), ("DELIVRD", false)]),
            ProviderFinal::Final(MessageState::Delivered)
        );
        assert_eq!(of(&[("ENROUTE", false)]), ProviderFinal::Silent);
        assert_eq!(of(&[]), ProviderFinal::Silent);
        assert_eq!(of(&[("ACKD", false)]), ProviderFinal::Unmappable);
        assert_eq!(of(&[("UNDELIV", true)]), ProviderFinal::Unmappable);
        assert_eq!(
            ProviderFinal::from_receipts(None::<Vec<(&str, bool)>>),
            ProviderFinal::NoReceipts
        );
    }

    #[test]
    fn effect_keys_name_their_message() {
        let id = Uuid::now_v7();
        assert_eq!(message_of_effect_key(&send_effect_key(id)), Some(id));
        assert_eq!(message_of_effect_key("herald-send-nope"), None);
        assert_eq!(message_of_effect_key("other"), None);
        // The hyphenated form is not the derived key.
        assert_eq!(message_of_effect_key(&format!("herald-send-{id}")), None);
    }
}
