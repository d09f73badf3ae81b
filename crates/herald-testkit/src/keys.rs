//! Credentials for a deployment the test kit (or `herald dev`) starts: one client key, one
//! operator key and a receipt secret per gateway, random for each deployment, and a runtime
//! database role. Roles get them through their environment, never on a command line, exactly
//! as a production deployment hands them over.

use rand::RngCore;

/// The gateways the provider simulator runs by default.
pub const GATEWAYS: [&str; 2] = ["gw-a", "gw-b"];

/// The names the keys are recorded under (`messages.created_by`).
pub const CLIENT: &str = "local-client";
pub const OPERATOR: &str = "local-operator";

/// The PostgreSQL role the deployment's roles connect as (`herald migrate --runtime-role`).
pub const RUNTIME_ROLE: &str = "herald_runtime";

#[derive(Clone)]
pub struct DeploymentKeys {
    pub client_key: String,
    pub operator_key: String,
    /// (gateway, secret) for each of [`GATEWAYS`].
    pub receipt_secrets: Vec<(String, String)>,
    pub runtime_password: String,
}

impl std::fmt::Debug for DeploymentKeys {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("DeploymentKeys(hidden)")
    }
}

impl DeploymentKeys {
    pub fn generate() -> Self {
        Self {
            client_key: random_secret(),
            operator_key: random_secret(),
            receipt_secrets: GATEWAYS
                .iter()
                .map(|gateway| ((*gateway).to_owned(), random_secret()))
                .collect(),
            runtime_password: random_secret(),
        }
    }

    /// `HERALD_RECEIPT_SECRETS` / `HERALD_SIM_RECEIPT_SECRETS`: GATEWAY=SECRET pairs.
    pub fn receipt_secrets_value(&self) -> String {
        self.receipt_secrets
            .iter()
            .map(|(gateway, secret)| format!("{gateway}={secret}"))
            .collect::<Vec<_>>()
            .join(",")
    }

    /// The secret of `gateway`.
    pub fn receipt_secret(&self, gateway: &str) -> Option<&str> {
        self.receipt_secrets
            .iter()
            .find(|(g, _)| g == gateway)
            .map(|(_, secret)| secret.as_str())
    }

    /// The environment of `herald api`: both keys and every gateway's secret.
    pub fn api_env(&self) -> Vec<(String, String)> {
        vec![
            (
                "HERALD_API_CLIENT_KEYS".to_owned(),
                format!("{CLIENT}={}", self.client_key),
            ),
            (
                "HERALD_API_OPERATOR_KEYS".to_owned(),
                format!("{OPERATOR}={}", self.operator_key),
            ),
            (
                "HERALD_RECEIPT_SECRETS".to_owned(),
                self.receipt_secrets_value(),
            ),
        ]
    }

    /// The environment of `herald provider-sim`: the same secrets, to sign with.
    pub fn sim_env(&self) -> Vec<(String, String)> {
        vec![(
            "HERALD_SIM_RECEIPT_SECRETS".to_owned(),
            self.receipt_secrets_value(),
        )]
    }

    /// The environment of `herald migrate` that creates the runtime role.
    pub fn migrate_env(&self) -> Vec<(String, String)> {
        vec![
            ("HERALD_RUNTIME_ROLE".to_owned(), RUNTIME_ROLE.to_owned()),
            (
                "HERALD_RUNTIME_ROLE_PASSWORD".to_owned(),
                self.runtime_password.clone(),
            ),
        ]
    }

    /// The environment `subcommand` gets (nothing for roles that hold no credential).
    pub fn env_for(&self, subcommand: &str) -> Vec<(String, String)> {
        match subcommand {
            "api" => self.api_env(),
            "provider-sim" => self.sim_env(),
            _ => Vec::new(),
        }
    }

    /// `database_url` (the owner's) with the runtime role and its password instead.
    pub fn runtime_url(&self, database_url: &str) -> anyhow::Result<String> {
        let (scheme, rest) = database_url
            .split_once("://")
            .ok_or_else(|| anyhow::anyhow!("not a URL: {database_url}"))?;
        let host = rest.rsplit_once('@').map_or(rest, |(_, host)| host);
        Ok(format!(
            "{scheme}://{RUNTIME_ROLE}:{}@{host}",
            self.runtime_password
        ))
    }

    /// An HTTP client that sends the operator key with every request (operators may call
    /// every bearer route).
    pub fn operator_client(&self) -> anyhow::Result<reqwest::Client> {
        bearer_client(&self.operator_key)
    }

    /// An HTTP client that sends the client key with every request.
    pub fn client_client(&self) -> anyhow::Result<reqwest::Client> {
        bearer_client(&self.client_key)
    }
}

/// A client whose every request carries `Authorization: Bearer <key>`.
pub fn bearer_client(key: &str) -> anyhow::Result<reqwest::Client> {
    Ok(bearer_client_builder(key)?.build()?)
}

/// A client builder whose every request carries `Authorization: Bearer <key>`.
pub fn bearer_client_builder(key: &str) -> anyhow::Result<reqwest::ClientBuilder> {
    Ok(herald_client::http_builder(Some(key))?)
}

/// 32 random bytes as hex: a key or secret nobody guesses.
pub fn random_secret() -> String {
    let mut bytes = [0u8; 32];
    rand::rng().fill_bytes(&mut bytes);
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_runtime_url_replaces_the_user() {
        let keys = DeploymentKeys::generate();
        let url = keys
            .runtime_url("postgres://postgres@127.0.0.1:5432/herald")
            .unwrap();
        assert_eq!(
            url,
            format!(
                "postgres://{RUNTIME_ROLE}:{}@127.0.0.1:5432/herald",
                keys.runtime_password
            )
        );
        let url = keys.runtime_url("postgres://127.0.0.1:5432/x").unwrap();
        assert!(url.ends_with("@127.0.0.1:5432/x"));
        assert_eq!(keys.client_key.len(), 64);
        assert_ne!(keys.client_key, keys.operator_key);
    }
}
