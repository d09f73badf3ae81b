//! Herald's coordination through etcd. Each poller keeps a member key under its own lease;
//! a partition's ownership key is created in a transaction only if it is absent and is bound to
//! the owner's lease, so it vanishes when the owner stops renewing. The key's create revision
//! orders acquisitions (within one generation of etcd, revisions only grow); the poller records
//! it, with the generation, in PostgreSQL before it claims, and PostgreSQL answers the fencing
//! epoch (see `herald_store::leases`).
//!
//! Keys, under a configurable prefix (default `/herald`):
//! - `{prefix}/members/{poller id}` = poller id, on the member's lease;
//! - `{prefix}/owners/{partition:04}` = owner's poller id, on the owner's lease;
//! - `{prefix}/generation` = a random id written once by the first poller that finds it absent:
//!   it changes only when etcd lost its data, and tells revisions of two lives of etcd apart.

pub mod membership;

use std::collections::BTreeMap;
use std::time::Duration;

use etcd_client::{
    Certificate, Client, Compare, CompareOp, ConnectOptions, DeleteOptions, GetOptions, Identity,
    PutOptions, TlsOptions, Txn, TxnOp, WatchOptions, WatchStream,
};

pub use membership::{LeaseHealth, Membership};

#[derive(Debug, thiserror::Error)]
pub enum CoordError {
    #[error("etcd: {0}")]
    Etcd(#[from] etcd_client::Error),
    #[error("etcd holds an unreadable key {key:?}: {reason}")]
    BadKey { key: String, reason: String },
    #[error("the lease was lost")]
    LeaseLost,
    #[error("etcd configuration: {0}")]
    Config(String),
}

/// Refuses endpoints that cannot be connected to as configured, before any connection: a
/// mix of `http://` and `https://`, or TLS material for `http://` endpoints.
pub fn check_endpoints(endpoints: &[String], access: &EtcdAccess) -> Result<(), CoordError> {
    let https = endpoints
        .iter()
        .filter(|e| e.starts_with("https://"))
        .count();
    if https > 0 && https < endpoints.len() {
        return Err(CoordError::Config(
            "the etcd endpoints mix http:// and https://".into(),
        ));
    }
    if https == 0 && !endpoints.is_empty() && !access.tls.is_empty() {
        return Err(CoordError::Config(
            "an etcd CA or client certificate is set, but the endpoints are not https://".into(),
        ));
    }
    Ok(())
}

/// How to reach a secured etcd: TLS material and an optional user with its password.
#[derive(Clone, Default)]
pub struct EtcdAccess {
    pub tls: herald_core::ClientTls,
    pub user: Option<(String, String)>,
}

impl std::fmt::Debug for EtcdAccess {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("EtcdAccess")
            .field("tls", &self.tls)
            .field("user", &self.user.as_ref().map(|(user, _)| user))
            .finish()
    }
}

/// Who owns a partition, and since which revision.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Ownership {
    pub owner: String,
    /// The ownership key's create revision (PostgreSQL assigns the fencing epoch).
    pub revision: i64,
    pub lease: i64,
}

/// A connection to etcd scoped to one Herald cluster's key prefix.
#[derive(Clone)]
pub struct Coordinator {
    client: Client,
    prefix: String,
}

impl Coordinator {
    /// Connects to `endpoints`; every request times out after `timeout`.
    pub async fn connect(
        endpoints: &[String],
        prefix: &str,
        timeout: Duration,
    ) -> Result<Self, CoordError> {
        Self::connect_with(endpoints, prefix, timeout, &EtcdAccess::default()).await
    }

    /// Connects to `endpoints` with `access`: TLS for `https://` endpoints (trusting
    /// `access.tls.ca`, else the system's roots, presenting its client certificate when
    /// given) and etcd's user/password authentication when a user is given.
    pub async fn connect_with(
        endpoints: &[String],
        prefix: &str,
        timeout: Duration,
        access: &EtcdAccess,
    ) -> Result<Self, CoordError> {
        let mut options = ConnectOptions::new()
            .with_connect_timeout(timeout)
            .with_timeout(timeout)
            .with_keep_alive(Duration::from_secs(2), timeout);
        check_endpoints(endpoints, access)?;
        if endpoints.iter().any(|e| e.starts_with("https://")) {
            let mut tls = TlsOptions::new();
            tls = match &access.tls.ca {
                Some(ca) => tls.ca_certificate(Certificate::from_pem(ca)),
                None => tls.with_native_roots(),
            };
            if let Some(identity) = &access.tls.identity {
                tls = tls.identity(Identity::from_pem(&identity.cert, &identity.key));
            }
            options = options.with_tls(tls);
        }
        if let Some((user, password)) = &access.user {
            options = options.with_user(user.clone(), password.clone());
        }
        let client = Client::connect(endpoints, Some(options)).await?;
        Ok(Self {
            client,
            prefix: prefix.trim_end_matches('/').to_owned(),
        })
    }

    pub fn client(&self) -> Client {
        self.client.clone()
    }

    pub fn members_prefix(&self) -> String {
        format!("{}/members/", self.prefix)
    }

    pub fn owners_prefix(&self) -> String {
        format!("{}/owners/", self.prefix)
    }

    fn owner_key(&self, partition: u32) -> String {
        format!("{}{partition:04}", self.owners_prefix())
    }

    /// The live members' ids, sorted.
    pub async fn members(&self) -> Result<Vec<String>, CoordError> {
        let mut client = self.client.clone();
        let response = client
            .get(self.members_prefix(), Some(GetOptions::new().with_prefix()))
            .await?;
        let mut members = Vec::with_capacity(response.kvs().len());
        for kv in response.kvs() {
            let key = kv.key_str()?;
            members.push(key.trim_start_matches(&self.members_prefix()).to_owned());
        }
        members.sort();
        members.dedup();
        Ok(members)
    }

    /// Every partition that has an owner.
    pub async fn owners(&self) -> Result<BTreeMap<u32, Ownership>, CoordError> {
        let mut client = self.client.clone();
        let prefix = self.owners_prefix();
        let response = client
            .get(prefix.as_str(), Some(GetOptions::new().with_prefix()))
            .await?;
        let mut owners = BTreeMap::new();
        for kv in response.kvs() {
            let key = kv.key_str()?;
            let partition = key
                .trim_start_matches(&prefix)
                .parse::<u32>()
                .map_err(|err| CoordError::BadKey {
                    key: key.to_owned(),
                    reason: err.to_string(),
                })?;
            owners.insert(
                partition,
                Ownership {
                    owner: kv.value_str()?.to_owned(),
                    revision: kv.create_revision(),
                    lease: kv.lease(),
                },
            );
        }
        Ok(owners)
    }

    /// Registers `member` under `lease`.
    pub async fn put_member(&self, member: &str, lease: i64) -> Result<(), CoordError> {
        let mut client = self.client.clone();
        client
            .put(
                format!("{}{member}", self.members_prefix()),
                member,
                Some(PutOptions::new().with_lease(lease)),
            )
            .await?;
        Ok(())
    }

    /// Creates the partition's ownership key for `member` if nobody holds it. Returns the new
    /// epoch, or `None` when another owner holds the key.
    pub async fn try_acquire(
        &self,
        partition: u32,
        member: &str,
        lease: i64,
    ) -> Result<Option<i64>, CoordError> {
        let key = self.owner_key(partition);
        let txn = Txn::new()
            .when(vec![Compare::create_revision(
                key.as_str(),
                CompareOp::Equal,
                0,
            )])
            .and_then(vec![TxnOp::put(
                key.as_str(),
                member,
                Some(PutOptions::new().with_lease(lease)),
            )]);
        let mut client = self.client.clone();
        let response = client.txn(txn).await?;
        if !response.succeeded() {
            return Ok(None);
        }
        // The put created the key in this transaction: its create revision is the
        // transaction's revision.
        let revision = response.header().map(|h| h.revision()).unwrap_or_default();
        Ok(Some(revision))
    }

    /// This etcd's generation: the id under `{prefix}/generation`, created (one transaction,
    /// first writer wins) when absent. A new id means etcd lost its data since the last one was
    /// read, so its revisions started again.
    pub async fn generation(&self) -> Result<String, CoordError> {
        let key = format!("{}/generation", self.prefix);
        let fresh = uuid::Uuid::now_v7().to_string();
        let txn = Txn::new()
            .when(vec![Compare::create_revision(
                key.as_str(),
                CompareOp::Equal,
                0,
            )])
            .and_then(vec![TxnOp::put(key.as_str(), fresh.as_str(), None)])
            .or_else(vec![TxnOp::get(key.as_str(), None)]);
        let mut client = self.client.clone();
        let response = client.txn(txn).await?;
        if response.succeeded() {
            return Ok(fresh);
        }
        for op in response.op_responses() {
            if let etcd_client::TxnOpResponse::Get(get) = op {
                if let Some(kv) = get.kvs().first() {
                    return Ok(kv.value_str()?.to_owned());
                }
            }
        }
        Err(CoordError::BadKey {
            key,
            reason: "the generation key vanished while it was read".to_owned(),
        })
    }

    /// etcd's current revision. It only grows while etcd keeps its data; a revision recorded
    /// elsewhere that is higher than this one comes from an earlier life of a cluster whose data
    /// was lost.
    pub async fn current_revision(&self) -> Result<i64, CoordError> {
        let mut client = self.client.clone();
        let response = client
            .get(
                self.owners_prefix(),
                Some(GetOptions::new().with_prefix().with_count_only()),
            )
            .await?;
        Ok(response.header().map(|h| h.revision()).unwrap_or_default())
    }

    /// Deletes the partition's ownership key if it is still the one `member` created at
    /// `epoch`. Returns whether it deleted it.
    pub async fn release(
        &self,
        partition: u32,
        member: &str,
        epoch: i64,
    ) -> Result<bool, CoordError> {
        let key = self.owner_key(partition);
        let txn = Txn::new()
            .when(vec![
                Compare::create_revision(key.as_str(), CompareOp::Equal, epoch),
                Compare::value(key.as_str(), CompareOp::Equal, member),
            ])
            .and_then(vec![TxnOp::delete(key.as_str(), None::<DeleteOptions>)]);
        let mut client = self.client.clone();
        Ok(client.txn(txn).await?.succeeded())
    }

    /// Watches every member and ownership key; each event means "look again".
    pub async fn watch(&self) -> Result<WatchStream, CoordError> {
        let mut client = self.client.clone();
        Ok(client
            .watch(
                format!("{}/", self.prefix),
                Some(WatchOptions::new().with_prefix().with_prev_key()),
            )
            .await?)
    }

    /// The partition of an ownership key, if `key` is one.
    pub fn partition_of_key(&self, key: &[u8]) -> Option<u32> {
        std::str::from_utf8(key)
            .ok()?
            .strip_prefix(&self.owners_prefix())?
            .parse()
            .ok()
    }
}
