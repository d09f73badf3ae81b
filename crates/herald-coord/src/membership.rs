//! A member's lease: granted, kept alive, and watched so the poller stops claiming before the
//! lease can expire.

use std::sync::Arc;
use std::time::Duration;

use tokio::sync::watch;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use crate::coordination::{Coordination, KeepAlive};
use crate::CoordError;

/// Renewals that did not get through (etcd unreachable or slow).
pub const RENEW_FAILURES: &str = "herald_lease_renew_failures_total";

/// Whether the lease can still be trusted.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LeaseHealth {
    /// Renewed recently enough that it cannot have expired.
    Held,
    /// Not renewed for longer than the safety margin: it may expire before we hear from etcd
    /// again, so the owner must stop writing now.
    AtRisk,
    /// etcd says the lease is gone.
    Lost,
}

/// A member of the fleet: its lease and the task renewing it.
pub struct Membership {
    pub lease: i64,
    pub ttl: Duration,
    health: watch::Receiver<LeaseHealth>,
    stop: CancellationToken,
}

impl Membership {
    /// Grants a lease of `ttl`, registers `member` under it, and keeps it alive. The lease is
    /// reported [`LeaseHealth::AtRisk`] once half its TTL passed without a successful renewal.
    pub async fn join<C: Coordination>(
        coord: &C,
        member: &str,
        ttl: Duration,
    ) -> Result<Self, CoordError> {
        let (lease, ttl) = coord.grant(ttl).await?;
        coord.put_member(member, lease).await?;
        let (tx, health) = watch::channel(LeaseHealth::Held);
        let stop = CancellationToken::new();
        tokio::spawn(keep_alive(
            coord.clone(),
            lease,
            ttl,
            Arc::new(tx),
            stop.clone(),
        ));
        Ok(Self {
            lease,
            ttl,
            health,
            stop,
        })
    }

    pub fn health(&self) -> LeaseHealth {
        *self.health.borrow()
    }

    /// Resolves when the lease is no longer [`LeaseHealth::Held`].
    pub async fn at_risk(&mut self) -> LeaseHealth {
        loop {
            let now = *self.health.borrow_and_update();
            if now != LeaseHealth::Held {
                return now;
            }
            if self.health.changed().await.is_err() {
                return LeaseHealth::Lost;
            }
        }
    }

    /// Stops renewing and revokes the lease: every key on it (the member key, any ownership
    /// key still held) is deleted at once.
    pub async fn leave<C: Coordination>(self, coord: &C) {
        self.stop.cancel();
        if let Err(err) = coord.revoke(self.lease).await {
            tracing::warn!(error = %err, "revoking the lease failed; its keys expire with the TTL");
        }
    }
}

impl Drop for Membership {
    fn drop(&mut self) {
        self.stop.cancel();
    }
}

async fn keep_alive<C: Coordination>(
    coord: C,
    lease: i64,
    ttl: Duration,
    health: Arc<watch::Sender<LeaseHealth>>,
    stop: CancellationToken,
) {
    let interval = ttl / 4;
    let margin = ttl / 2;
    let mut last_renewed = Instant::now();
    let mut keeper: Option<C::KeepAlive> = None;
    loop {
        if keeper.is_none() {
            match tokio::time::timeout(interval, coord.keep_alive(lease)).await {
                Ok(Ok(opened)) => keeper = Some(opened),
                Ok(Err(err)) => {
                    tracing::warn!(error = %err, "cannot open the lease keep-alive stream")
                }
                Err(_) => tracing::warn!("opening the lease keep-alive stream timed out"),
            }
        }
        // Err(true): the coordinator says the lease is gone; Err(false): no answer.
        let renewed = match keeper.as_mut() {
            Some(keeper) => match tokio::time::timeout(interval, keeper.renew()).await {
                Ok(Ok(true)) => Ok(()),
                Ok(Ok(false)) => Err(true),
                Ok(Err(_)) | Err(_) => Err(false),
            },
            None => Err(false),
        };
        match renewed {
            Ok(()) => {
                last_renewed = Instant::now();
                health.send_if_modified(|h| {
                    let changed = *h == LeaseHealth::AtRisk;
                    if changed {
                        *h = LeaseHealth::Held;
                    }
                    changed
                });
            }
            Err(expired) => {
                metrics::counter!(RENEW_FAILURES).increment(1);
                keeper = None;
                if expired {
                    tracing::error!(lease, "etcd says the lease expired");
                    let _ = health.send(LeaseHealth::Lost);
                    return;
                }
                if last_renewed.elapsed() >= margin {
                    tracing::warn!(lease, since = ?last_renewed.elapsed(), "lease not renewed within the safety margin; stop writing");
                    health.send_if_modified(|h| {
                        let changed = *h == LeaseHealth::Held;
                        if changed {
                            *h = LeaseHealth::AtRisk;
                        }
                        changed
                    });
                }
                if last_renewed.elapsed() >= ttl {
                    let _ = health.send(LeaseHealth::Lost);
                    return;
                }
            }
        }
        tokio::select! {
            _ = stop.cancelled() => return,
            _ = tokio::time::sleep(if renewed.is_ok() { interval } else { Duration::from_millis(200) }) => {}
        }
    }
}
