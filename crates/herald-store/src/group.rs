//! Group commit: many callers' small writes share one transaction.
//!
//! Each caller hands its request to a [`GroupCommit`] and waits. A dispatcher takes everything
//! that is waiting (up to `max_group`) as one group and runs the writer on it; at most
//! `parallel` groups are written at once, so while they run the next group gathers. A busy
//! system commits in large groups without waiting. A group that starts from an empty queue
//! waits `linger` for more (zero: it takes only the callers already running): at low rates a
//! statement's fixed cost (on the partitioned outbox, mostly starting its plan over 64
//! children) is then paid once per linger, not once per request.
//! Every caller is answered only after the commit that holds its request (or with the error
//! that prevented it).
//!
//! One bad request must not fail its neighbours: when a group's write fails with an error the
//! database raised about the data (not a lost connection), each request of the group is written
//! again on its own, so only the one the database refuses gets the error.
//!
//! Longer than 400 lines with its unit tests (the code is about 260).

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use tokio::sync::{mpsc, oneshot, Semaphore};

use crate::StoreError;

/// Counter of groups written, by writer.
pub const GROUPS: &str = "herald_store_commit_groups_total";
/// Counter of requests written through a group, by writer.
pub const GROUPED: &str = "herald_store_commit_grouped_total";
/// Counter of groups split into single writes after the database refused the group.
pub const SPLITS: &str = "herald_store_commit_group_splits_total";

/// Describes the group-commit metrics and registers `writer`'s at zero.
pub fn register_metrics(writer: &'static str) {
    metrics::describe_counter!(GROUPS, "Group-commit transactions written, by writer.");
    metrics::describe_counter!(
        GROUPED,
        "Requests written through group commit, by writer (divided by the groups: the mean group)."
    );
    metrics::describe_counter!(
        SPLITS,
        "Groups the database refused, written again one request at a time, by writer."
    );
    for name in [GROUPS, GROUPED, SPLITS] {
        metrics::counter!(name, "writer" => writer).increment(0);
    }
}

type Waiting<R, A> = (R, oneshot::Sender<Result<A, StoreError>>);

/// How a group committer behaves.
#[derive(Debug, Clone, Copy)]
pub struct GroupSettings {
    /// Most requests in one transaction.
    pub max_group: usize,
    /// Most group transactions running at once.
    pub parallel: usize,
    /// How long a group that starts from an empty queue waits for more requests (up to
    /// `max_group`) before it is written. Zero: no timer.
    pub linger: Duration,
}

/// The handle callers write through; cloning is cheap. The dispatcher ends when every handle
/// is dropped, after answering what it took.
pub struct GroupCommit<R, A> {
    tx: mpsc::Sender<Waiting<R, A>>,
}

impl<R, A> Clone for GroupCommit<R, A> {
    fn clone(&self) -> Self {
        Self {
            tx: self.tx.clone(),
        }
    }
}

impl<R, A> GroupCommit<R, A>
where
    R: Clone + Send + Sync + 'static,
    A: Send + 'static,
{
    /// Starts the dispatcher. `write` commits a group in one transaction and answers one `A`
    /// per request, in order; `name` labels the metrics.
    pub fn spawn<F, Fut>(name: &'static str, settings: GroupSettings, write: F) -> Self
    where
        F: Fn(Arc<Vec<R>>) -> Fut + Send + Sync + 'static,
        Fut: Future<Output = Result<Vec<A>, StoreError>> + Send + 'static,
    {
        Self::spawn_weighed(name, settings, (usize::MAX, |_: &R| 1), write)
    }

    /// [`spawn`](Self::spawn) with a second bound: a group stops taking requests once their
    /// weights (`weigh`, e.g. the rows a request writes) reach `max_weight`. The request that
    /// crosses the bound is still in the group, so a group weighs at most `max_weight` plus
    /// one request.
    pub fn spawn_weighed<F, Fut>(
        name: &'static str,
        settings: GroupSettings,
        (max_weight, weigh): (usize, fn(&R) -> usize),
        write: F,
    ) -> Self
    where
        F: Fn(Arc<Vec<R>>) -> Fut + Send + Sync + 'static,
        Fut: Future<Output = Result<Vec<A>, StoreError>> + Send + 'static,
    {
        let max_group = settings.max_group.max(1);
        let (tx, rx) = mpsc::channel(max_group * settings.parallel.max(1) * 2);
        let bounds = Bounds {
            max_group,
            max_weight,
            weigh,
            linger: settings.linger,
        };
        tokio::spawn(dispatch(name, rx, bounds, settings.parallel.max(1), write));
        Self { tx }
    }

    /// Writes one request with whatever else is waiting; answers after its commit.
    pub async fn write(&self, request: R) -> Result<A, StoreError> {
        let stopped = || StoreError::GroupWrite("the group writer stopped".to_owned());
        let (answer, answered) = oneshot::channel();
        self.tx
            .send((request, answer))
            .await
            .map_err(|_| stopped())?;
        answered.await.map_err(|_| stopped())?
    }
}

/// How large one group may grow.
struct Bounds<R> {
    max_group: usize,
    max_weight: usize,
    weigh: fn(&R) -> usize,
    linger: Duration,
}

async fn dispatch<R, A, F, Fut>(
    name: &'static str,
    mut rx: mpsc::Receiver<Waiting<R, A>>,
    bounds: Bounds<R>,
    parallel: usize,
    write: F,
) where
    R: Clone + Send + Sync + 'static,
    A: Send + 'static,
    F: Fn(Arc<Vec<R>>) -> Fut + Send + Sync + 'static,
    Fut: Future<Output = Result<Vec<A>, StoreError>> + Send + 'static,
{
    let write = Arc::new(write);
    let slots = Arc::new(Semaphore::new(parallel));
    loop {
        // Wait for a free slot first: while every slot is busy, requests gather in the channel
        // and the next group takes them all.
        let Ok(slot) = slots.clone().acquire_owned().await else {
            return;
        };
        let Some(first) = rx.recv().await else {
            return;
        };
        let mut weight = (bounds.weigh)(&first.0);
        let mut group = vec![first];
        // A lone request at a low rate waits for company, up to the linger.
        let linger_until = (rx.is_empty() && !bounds.linger.is_zero())
            .then(|| tokio::time::Instant::now() + bounds.linger);
        if rx.is_empty() && linger_until.is_none() {
            // Callers woken together (one timer tick, one NOTIFY) run one after another; the
            // first one's send wakes this task before the others had their turn. One yield
            // lets those already runnable send too, so they share this group instead of
            // making the next one. Not a timer: nothing waits for callers that are not
            // already running.
            tokio::task::yield_now().await;
        }
        while group.len() < bounds.max_group && weight < bounds.max_weight {
            let next = match linger_until {
                // Ends at the linger, or when every handle is gone (answer what was taken).
                Some(until) => match tokio::time::timeout_at(until, rx.recv()).await {
                    Ok(Some(next)) => next,
                    Ok(None) | Err(_) => break,
                },
                None => match rx.try_recv() {
                    Ok(next) => next,
                    Err(_) => break,
                },
            };
            weight = weight.saturating_add((bounds.weigh)(&next.0));
            group.push(next);
        }
        let write = write.clone();
        tokio::spawn(async move {
            write_group(name, &*write, group).await;
            drop(slot);
        });
    }
}

async fn write_group<R, A, F, Fut>(name: &'static str, write: &F, group: Vec<Waiting<R, A>>)
where
    R: Clone + Send + Sync + 'static,
    F: Fn(Arc<Vec<R>>) -> Fut,
    Fut: Future<Output = Result<Vec<A>, StoreError>>,
{
    metrics::counter!(GROUPS, "writer" => name).increment(1);
    metrics::counter!(GROUPED, "writer" => name).increment(group.len() as u64);
    let (requests, answers): (Vec<R>, Vec<_>) = group.into_iter().unzip();
    let requests = Arc::new(requests);
    match write(requests.clone()).await {
        Ok(results) if results.len() == answers.len() => {
            for (answer, result) in answers.into_iter().zip(results) {
                let _ = answer.send(Ok(result));
            }
        }
        // The write committed, but which request it wrote is not known: each may be stored,
        // so none may be told that nothing was written.
        Ok(results) => {
            let text = format!(
                "the writer committed and answered {} of {} requests",
                results.len(),
                answers.len()
            );
            tracing::error!(writer = name, "{text}");
            for answer in answers {
                let _ = answer.send(Err(StoreError::OutcomeUnknown(text.clone())));
            }
        }
        Err(err) if answers.len() > 1 && refused_by_database(&err) => {
            metrics::counter!(SPLITS, "writer" => name).increment(1);
            tracing::warn!(writer = name, error = %err, requests = answers.len(),
                "the database refused a group; writing each request on its own");
            for (request, answer) in requests.iter().zip(answers) {
                let single = write(Arc::new(vec![request.clone()])).await;
                let _ = answer.send(single.and_then(|mut results| {
                    results.pop().ok_or_else(|| {
                        StoreError::OutcomeUnknown(
                            "the writer committed and answered nothing".into(),
                        )
                    })
                }));
            }
        }
        Err(err) => {
            let unknown = matches!(err, StoreError::OutcomeUnknown(_));
            let text = err.to_string();
            for answer in answers {
                let _ = answer.send(Err(if unknown {
                    StoreError::OutcomeUnknown(text.clone())
                } else {
                    StoreError::GroupWrite(text.clone())
                }));
            }
        }
    }
}

/// True when the database itself refused the statement (bad data, a constraint, a deadlock),
/// as opposed to a lost connection, where another try of the same group is no better.
fn refused_by_database(err: &StoreError) -> bool {
    matches!(err, StoreError::Database(sqlx::Error::Database(_)))
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::time::Duration;

    // Paused time: the clock only moves when every task waits, so all requests are queued
    // before the first write's commit ends.
    #[tokio::test(start_paused = true)]
    async fn waiting_requests_share_a_write_and_each_gets_its_own_answer() {
        let writes = Arc::new(AtomicUsize::new(0));
        let counted = writes.clone();
        let group = GroupCommit::spawn(
            "test",
            GroupSettings {
                max_group: 100,
                parallel: 1,
                linger: Duration::ZERO,
            },
            move |requests: Arc<Vec<u32>>| {
                let counted = counted.clone();
                async move {
                    counted.fetch_add(1, Ordering::SeqCst);
                    // A slow commit: the other requests gather meanwhile.
                    tokio::time::sleep(Duration::from_millis(20)).await;
                    Ok(requests.iter().map(|r| r * 10).collect::<Vec<u32>>())
                }
            },
        );
        let calls: Vec<_> = (0..50u32)
            .map(|i| {
                let group = group.clone();
                tokio::spawn(async move { (i, group.write(i).await.unwrap()) })
            })
            .collect();
        for call in calls {
            let (i, answer) = call.await.unwrap();
            assert_eq!(answer, i * 10);
        }
        // At most the first request is written alone; all that queued meanwhile share a write.
        let writes = writes.load(Ordering::SeqCst);
        assert!(writes <= 2, "50 queued requests took {writes} writes");
    }

    // Requests of weight 30 against a bound of 100: a group takes four (the fourth crosses
    // the bound) even though 50 are waiting and max_group allows 100.
    #[tokio::test(start_paused = true)]
    async fn a_group_stops_growing_once_its_weight_crosses_the_bound() {
        let sizes = Arc::new(std::sync::Mutex::new(Vec::new()));
        let seen = sizes.clone();
        let group = GroupCommit::spawn_weighed(
            "test",
            GroupSettings {
                max_group: 100,
                parallel: 1,
                linger: Duration::ZERO,
            },
            (100, |_: &u32| 30),
            move |requests: Arc<Vec<u32>>| {
                let seen = seen.clone();
                async move {
                    seen.lock().unwrap().push(requests.len());
                    tokio::time::sleep(Duration::from_millis(20)).await;
                    Ok(requests.to_vec())
                }
            },
        );
        let calls: Vec<_> = (0..50u32)
            .map(|i| {
                let group = group.clone();
                tokio::spawn(async move { group.write(i).await.unwrap() })
            })
            .collect();
        for call in calls {
            call.await.unwrap();
        }
        let sizes = sizes.lock().unwrap().clone();
        assert_eq!(sizes.iter().sum::<usize>(), 50);
        assert!(sizes.iter().all(|&n| n <= 4), "{sizes:?}");
        assert!(sizes.iter().filter(|&&n| n == 4).count() >= 10, "{sizes:?}");
    }

    #[tokio::test]
    async fn a_lost_connection_fails_the_whole_group() {
        let group = GroupCommit::spawn(
            "test",
            GroupSettings {
                max_group: 10,
                parallel: 1,
                linger: Duration::ZERO,
            },
            |_: Arc<Vec<u32>>| async {
                Err::<Vec<u32>, _>(StoreError::Database(sqlx::Error::PoolTimedOut))
            },
        );
        let err = group.write(1).await.unwrap_err();
        assert!(matches!(err, StoreError::GroupWrite(_)), "{err:?}");
    }

    // A write that committed but answered for fewer requests than it was given: every request
    // may be stored, so each is answered with an unknown outcome, never "nothing written".
    #[tokio::test]
    async fn a_committed_write_with_missing_answers_leaves_each_outcome_unknown() {
        let group = GroupCommit::spawn(
            "test",
            GroupSettings {
                max_group: 10,
                parallel: 1,
                linger: Duration::ZERO,
            },
            |_: Arc<Vec<u32>>| async { Ok::<Vec<u32>, StoreError>(Vec::new()) },
        );
        let err = group.write(1).await.unwrap_err();
        assert!(matches!(err, StoreError::OutcomeUnknown(_)), "{err:?}");
    }

    // Requests a millisecond apart, at a rate where each would otherwise be written alone:
    // with a linger they share one write, and the last is answered when the linger ends.
    #[tokio::test(start_paused = true)]
    async fn a_lone_request_waits_the_linger_for_company() {
        for (linger, expected_writes) in [(Duration::ZERO, 10), (Duration::from_millis(20), 1)] {
            let writes = Arc::new(AtomicUsize::new(0));
            let counted = writes.clone();
            let group = GroupCommit::spawn(
                "test",
                GroupSettings {
                    max_group: 100,
                    parallel: 1,
                    linger,
                },
                move |requests: Arc<Vec<u32>>| {
                    let counted = counted.clone();
                    async move {
                        counted.fetch_add(1, Ordering::SeqCst);
                        Ok(requests.to_vec())
                    }
                },
            );
            let started = tokio::time::Instant::now();
            let mut calls = Vec::new();
            for i in 0..10u32 {
                let group = group.clone();
                calls.push(tokio::spawn(async move { group.write(i).await.unwrap() }));
                tokio::time::sleep(Duration::from_millis(1)).await;
            }
            for (i, call) in calls.into_iter().enumerate() {
                assert_eq!(call.await.unwrap(), i as u32);
            }
            assert_eq!(
                writes.load(Ordering::SeqCst),
                expected_writes,
                "linger {linger:?}"
            );
            // Nothing waits past the linger: the group is written when it ends.
            assert!(
                started.elapsed() <= Duration::from_millis(21),
                "{:?}",
                started.elapsed()
            );
        }
    }

    // A full group does not wait out the linger.
    #[tokio::test(start_paused = true)]
    async fn a_full_group_is_written_without_waiting() {
        let group = GroupCommit::spawn(
            "test",
            GroupSettings {
                max_group: 4,
                parallel: 1,
                linger: Duration::from_secs(60),
            },
            |requests: Arc<Vec<u32>>| async move { Ok(requests.to_vec()) },
        );
        let started = tokio::time::Instant::now();
        let calls: Vec<_> = (0..4u32)
            .map(|i| {
                let group = group.clone();
                tokio::spawn(async move { group.write(i).await.unwrap() })
            })
            .collect();
        for call in calls {
            call.await.unwrap();
        }
        assert!(
            started.elapsed() < Duration::from_secs(1),
            "{:?}",
            started.elapsed()
        );
    }
}
