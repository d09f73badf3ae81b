//! The API's credentials: bearer keys with their scopes and each gateway's receipt secrets,
//! read once at start and refused when they would leave a route open by accident.

use std::collections::HashMap;
use std::time::Duration;

use subtle::ConstantTimeEq;

/// Shortest bearer key or receipt secret accepted: 16 characters of random text are 80 bits
/// and more, out of reach of guessing.
pub const MIN_SECRET_CHARS: usize = 16;

/// What a bearer key may do.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Scope {
    /// POST messages, GET the messages this key accepted.
    Client,
    /// Everything a client may do, for every message, and the operator routes.
    Operator,
}

impl Scope {
    pub fn as_str(self) -> &'static str {
        match self {
            Scope::Client => "client",
            Scope::Operator => "operator",
        }
    }

    pub(crate) fn allows(self, needed: Scope) -> bool {
        self == Scope::Operator || needed == Scope::Client
    }
}

/// One bearer key: its name (recorded with the messages it accepts, shown in logs) and scope.
#[derive(Clone)]
pub struct ApiKey {
    pub name: String,
    pub scope: Scope,
    pub key: String,
}

impl std::fmt::Debug for ApiKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ApiKey")
            .field("name", &self.name)
            .field("scope", &self.scope)
            .finish_non_exhaustive()
    }
}

/// Everything the API authenticates with. Built once at start by [`Credentials::new`], which
/// refuses a set that would leave a route open by accident.
#[derive(Clone)]
pub struct Credentials {
    keys: Vec<ApiKey>,
    /// Each gateway's receipt secrets; more than one while a secret is being rotated.
    receipt_secrets: HashMap<String, Vec<Vec<u8>>>,
    /// How far a signature's timestamp may be from this API's clock.
    pub signature_window: Duration,
    /// A development run: no key opens the bearer routes to anyone, no receipt secret lets
    /// unsigned receipts in. Configured credentials are still enforced.
    insecure_dev: bool,
}

impl std::fmt::Debug for Credentials {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Credentials")
            .field("keys", &self.keys)
            .field("gateways", &self.receipt_secrets.keys().collect::<Vec<_>>())
            .field("signature_window", &self.signature_window)
            .field("insecure_dev", &self.insecure_dev)
            .finish()
    }
}

/// Why a set of credentials is refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum CredentialError {
    #[error("no client or operator key is configured")]
    NoKeys,
    #[error("no receipt secret is configured")]
    NoReceiptSecrets,
    #[error("{what} {name:?}: a name has 1 to 64 letters, digits, '-' or '_'")]
    BadName { what: &'static str, name: String },
    #[error("{what} {name:?} is shorter than {MIN_SECRET_CHARS} characters")]
    TooShort { what: &'static str, name: String },
    #[error("{what} {name:?} contains whitespace or control characters")]
    NotPrintable { what: &'static str, name: String },
    #[error("the key name {0:?} is given twice: every key needs its own name")]
    DuplicateName(String),
    #[error("keys {0:?} and {1:?} are the same key")]
    DuplicateKey(String, String),
}

impl Credentials {
    /// `client` and `operator` are (name, key) pairs, `receipt` (gateway, secret) pairs (a
    /// gateway may appear more than once, to rotate its secret). Without `insecure_dev`, at
    /// least one bearer key and one receipt secret are required.
    pub fn new(
        client: Vec<(String, String)>,
        operator: Vec<(String, String)>,
        receipt: Vec<(String, String)>,
        signature_window: Duration,
        insecure_dev: bool,
    ) -> Result<Self, CredentialError> {
        let mut keys = Vec::new();
        for (scope, pairs) in [(Scope::Client, client), (Scope::Operator, operator)] {
            for (name, key) in pairs {
                check_secret("key", &name, &key)?;
                if keys.iter().any(|k: &ApiKey| k.name == name) {
                    return Err(CredentialError::DuplicateName(name));
                }
                if let Some(same) = keys.iter().find(|k: &&ApiKey| k.key == key) {
                    return Err(CredentialError::DuplicateKey(same.name.clone(), name));
                }
                keys.push(ApiKey { name, scope, key });
            }
        }
        let mut receipt_secrets: HashMap<String, Vec<Vec<u8>>> = HashMap::new();
        for (gateway, secret) in receipt {
            check_secret("gateway", &gateway, &secret)?;
            receipt_secrets
                .entry(gateway)
                .or_default()
                .push(secret.into_bytes());
        }
        if !insecure_dev && keys.is_empty() {
            return Err(CredentialError::NoKeys);
        }
        if !insecure_dev && receipt_secrets.is_empty() {
            return Err(CredentialError::NoReceiptSecrets);
        }
        Ok(Self {
            keys,
            receipt_secrets,
            signature_window,
            insecure_dev,
        })
    }

    /// A development run without any credential: every route open, receipts unsigned.
    pub fn open_for_development() -> Self {
        Self {
            keys: Vec::new(),
            receipt_secrets: HashMap::new(),
            signature_window: Duration::from_secs(herald_core::signature::DEFAULT_WINDOW_SECS),
            insecure_dev: true,
        }
    }

    /// The bearer routes need no key (a development run without keys).
    pub fn bearer_open(&self) -> bool {
        self.insecure_dev && self.keys.is_empty()
    }

    /// Receipts need no signature (a development run without receipt secrets).
    pub fn receipts_open(&self) -> bool {
        self.insecure_dev && self.receipt_secrets.is_empty()
    }

    /// The secrets of `gateway`, None when it has none.
    pub fn receipt_secrets(&self, gateway: &str) -> Option<&[Vec<u8>]> {
        self.receipt_secrets.get(gateway).map(Vec::as_slice)
    }

    /// The gateways that have a secret, sorted.
    pub fn gateways(&self) -> Vec<&str> {
        let mut gateways: Vec<&str> = self.receipt_secrets.keys().map(String::as_str).collect();
        gateways.sort_unstable();
        gateways
    }

    /// How many keys of `scope` are configured.
    pub fn key_count(&self, scope: Scope) -> usize {
        self.keys.iter().filter(|k| k.scope == scope).count()
    }

    /// The key `presented` is, compared with every configured key in constant time so that
    /// timing tells neither which key matched nor how much of one.
    pub(crate) fn find(&self, presented: &str) -> Option<&ApiKey> {
        let mut found = None;
        for key in &self.keys {
            if bool::from(key.key.as_bytes().ct_eq(presented.as_bytes())) {
                found = Some(key);
            }
        }
        found
    }
}

/// A name (key name or gateway) and its secret: the name as a gateway name is written, the
/// secret long enough and printable.
fn check_secret(what: &'static str, name: &str, secret: &str) -> Result<(), CredentialError> {
    let valid_name = !name.is_empty()
        && name.len() <= 64
        && name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_');
    if !valid_name {
        return Err(CredentialError::BadName {
            what,
            name: name.to_owned(),
        });
    }
    if secret.chars().count() < MIN_SECRET_CHARS {
        return Err(CredentialError::TooShort {
            what,
            name: name.to_owned(),
        });
    }
    if secret.chars().any(|c| c.is_whitespace() || c.is_control()) {
        return Err(CredentialError::NotPrintable {
            what,
            name: name.to_owned(),
        });
    }
    Ok(())
}

pub use herald_core::config::parse_pairs;

#[cfg(test)]
mod tests {
    use super::*;

    fn pairs(items: &[(&str, &str)]) -> Vec<(String, String)> {
        items
            .iter()
            .map(|(a, b)| ((*a).to_owned(), (*b).to_owned()))
            .collect()
    }

    const WINDOW: Duration = Duration::from_secs(300);

    fn credentials() -> Credentials {
        Credentials::new(
            pairs(&[
                ("shop", "client-key-0123456789"),
                ("billing", "client-key-abcdefghij"),
            ]),
            pairs(&[("ops", "operator-key-0123456789")]),
            pairs(&[
                ("gw-a", "receipt-secret-aaaaaaaa"),
                ("gw-a", "receipt-secret-rotated"),
            ]),
            WINDOW,
            false,
        )
        .unwrap()
    }

    #[test]
    fn finds_exactly_the_presented_key() {
        let credentials = credentials();
        let found = |k: &str| credentials.find(k).map(|k| (k.name.as_str(), k.scope));
        assert_eq!(
            found("client-key-abcdefghij"),
            Some(("billing", Scope::Client))
        );
        assert_eq!(
            found("operator-key-0123456789"),
            Some(("ops", Scope::Operator))
        );
        assert_eq!(found("client-key-abcdefghi"), None);
        assert_eq!(found(""), None);
        assert_eq!(credentials.receipt_secrets("gw-a").map(<[_]>::len), Some(2));
        assert!(credentials.receipt_secrets("gw-b").is_none());
        assert!(!credentials.bearer_open() && !credentials.receipts_open());
    }

    #[test]
    fn refuses_credentials_that_would_leave_a_door_open() {
        let none = Vec::new;
        let key = || pairs(&[("shop", "client-key-0123456789")]);
        let secret = || pairs(&[("gw-a", "receipt-secret-aaaaaaaa")]);
        let new = |c, o, r, dev| Credentials::new(c, o, r, WINDOW, dev).map(|_| ());
        assert_eq!(
            new(none(), none(), secret(), false),
            Err(CredentialError::NoKeys)
        );
        assert_eq!(
            new(key(), none(), none(), false),
            Err(CredentialError::NoReceiptSecrets)
        );
        assert!(new(none(), key(), secret(), false).is_ok());
        assert!(new(none(), none(), none(), true).is_ok());
        assert!(matches!(
            new(pairs(&[("shop", "short")]), none(), secret(), false),
            Err(CredentialError::TooShort { .. })
        ));
        assert!(matches!(
            new(
                pairs(&[("sh op", "client-key-0123456789")]),
                none(),
                secret(),
                false
            ),
            Err(CredentialError::BadName { .. })
        ));
        assert!(matches!(
            new(
                key(),
                none(),
                pairs(&[("gw-a", "receipt secret with spaces")]),
                false
            ),
            Err(CredentialError::NotPrintable { .. })
        ));
        assert_eq!(
            new(
                key(),
                pairs(&[("shop", "operator-key-0123456789")]),
                secret(),
                false
            ),
            Err(CredentialError::DuplicateName("shop".into()))
        );
        assert_eq!(
            new(
                key(),
                pairs(&[("ops", "client-key-0123456789")]),
                secret(),
                false
            ),
            Err(CredentialError::DuplicateKey("shop".into(), "ops".into()))
        );
        let dev = Credentials::new(key(), none(), none(), WINDOW, true).unwrap();
        assert!(!dev.bearer_open() && dev.receipts_open());
    }

    #[test]
    fn reads_pairs_from_a_variable_or_a_file() {
        assert_eq!(
            parse_pairs("a=one, b = two==\n# a comment\n\nc=three,"),
            Ok(pairs(&[("a", "one"), ("b", "two=="), ("c", "three")]))
        );
        assert_eq!(parse_pairs(""), Ok(Vec::new()));
        // A secret without its name is not repeated in the error.
        let err = parse_pairs("a=one,just-a-secret-value").unwrap_err();
        assert_eq!(err, "entry 2 is not NAME=SECRET");
        assert_eq!(
            parse_pairs("a= ").unwrap_err(),
            "\"a\" has nothing after '='"
        );
    }
}
