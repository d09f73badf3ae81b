//! The coordinator on etcd: what `herald poller` runs (see the crate's documentation for the
//! keys).
//!
//! Longer than 400 lines: the etcd client's setup (endpoints, TLS, credentials) and the one
//! implementation of the `Coordination` trait, each call beside why it is made so.

use std::collections::BTreeMap;
use std::future::Future;
use std::time::Duration;

use etcd_client::{
    Certificate, Client, Compare, CompareOp, ConnectOptions, DeleteOptions, GetOptions, Identity,
    LeaseKeepAliveStream, LeaseKeeper, PutOptions, TlsOptions, Txn, TxnOp, WatchOptions,
    WatchStream,
};

use crate::coordination::{Change, Changes, Coordination, KeepAlive};
use crate::{CoordError, Ownership};

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
        partition_in(&self.owners_prefix(), key)
    }
}

/// The renewal of an etcd lease: one keep-alive stream, a request and its answer per renewal.
pub struct EtcdKeepAlive {
    keeper: LeaseKeeper,
    stream: LeaseKeepAliveStream,
}

impl KeepAlive for EtcdKeepAlive {
    async fn renew(&mut self) -> Result<bool, CoordError> {
        self.keeper.keep_alive().await?;
        match self.stream.message().await? {
            Some(answer) => Ok(answer.ttl() > 0),
            None => Err(CoordError::Closed),
        }
    }
}

impl Coordination for Coordinator {
    type KeepAlive = EtcdKeepAlive;

    async fn grant(&self, ttl: Duration) -> Result<(i64, Duration), CoordError> {
        // etcd's minimum TTL is its election timeout's order; below 2 s a lease could end
        // between two renewals.
        let ttl_secs = ttl.as_secs().max(2) as i64;
        let mut client = self.client.clone();
        let lease = client.lease_grant(ttl_secs, None).await?.id();
        Ok((lease, Duration::from_secs(ttl_secs as u64)))
    }

    async fn keep_alive(&self, lease: i64) -> Result<EtcdKeepAlive, CoordError> {
        let mut client = self.client.clone();
        let (keeper, stream) = client.lease_keep_alive(lease).await?;
        Ok(EtcdKeepAlive { keeper, stream })
    }

    async fn revoke(&self, lease: i64) -> Result<(), CoordError> {
        let mut client = self.client.clone();
        client.lease_revoke(lease).await?;
        Ok(())
    }

    fn put_member(
        &self,
        member: &str,
        lease: i64,
    ) -> impl Future<Output = Result<(), CoordError>> + Send {
        Coordinator::put_member(self, member, lease)
    }

    fn members(&self) -> impl Future<Output = Result<Vec<String>, CoordError>> + Send {
        Coordinator::members(self)
    }

    fn owners(&self) -> impl Future<Output = Result<BTreeMap<u32, Ownership>, CoordError>> + Send {
        Coordinator::owners(self)
    }

    fn try_acquire(
        &self,
        partition: u32,
        member: &str,
        lease: i64,
    ) -> impl Future<Output = Result<Option<i64>, CoordError>> + Send {
        Coordinator::try_acquire(self, partition, member, lease)
    }

    fn release(
        &self,
        partition: u32,
        member: &str,
        revision: i64,
    ) -> impl Future<Output = Result<bool, CoordError>> + Send {
        Coordinator::release(self, partition, member, revision)
    }

    fn generation(&self) -> impl Future<Output = Result<String, CoordError>> + Send {
        Coordinator::generation(self)
    }

    fn current_revision(&self) -> impl Future<Output = Result<i64, CoordError>> + Send {
        Coordinator::current_revision(self)
    }

    async fn watch(&self) -> Result<Changes, CoordError> {
        let stream = Coordinator::watch(self).await?;
        let owners = self.owners_prefix();
        let changes = futures::stream::unfold(Some((stream, owners)), |state| async move {
            let (mut stream, owners) = state?;
            match stream.message().await {
                Ok(Some(response)) => {
                    let released = response
                        .events()
                        .iter()
                        .filter(|e| e.event_type() == etcd_client::EventType::Delete)
                        .filter_map(|e| partition_in(&owners, e.kv()?.key()))
                        .collect();
                    Some((Ok(Change { released }), Some((stream, owners))))
                }
                Ok(None) => None,
                // The error ends the stream: the caller watches again.
                Err(err) => Some((Err(err.into()), None)),
            }
        });
        Ok(Box::pin(changes))
    }
}

/// The partition of an ownership key under `owners` (the owners' prefix), if `key` is one.
fn partition_in(owners: &str, key: &[u8]) -> Option<u32> {
    std::str::from_utf8(key)
        .ok()?
        .strip_prefix(owners)?
        .parse()
        .ok()
}
