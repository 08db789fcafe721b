//! Replicas of one model behind one worker (`TEI_URL=http://a,http://b`): the worker's one
//! batcher spreads its calls over them, each call to the replica with the fewest calls in flight
//! (docs/design/replicas.md). A replica whose last call found it unreachable (connection refused
//! or broken) is skipped for [`COOL_DOWN`], unless every replica is cooling.

use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use super::UpstreamError;

/// How long a replica is skipped after a call found it unreachable, or a health probe failed:
/// 1 s (the worker's health probe runs every second, so a replica that came back is used again
/// within about a second).
pub const COOL_DOWN: Duration = Duration::from_secs(1);

/// The base URLs of a model's replicas, with what the picker counts for each.
#[derive(Debug)]
pub struct Replicas {
    replicas: Vec<Replica>,
    /// Where the next pick starts looking: ties in calls in flight go round-robin.
    next: AtomicUsize,
    /// The origin of the cool-down deadlines (ms).
    epoch: Instant,
}

#[derive(Debug)]
struct Replica {
    /// Base URL without a trailing `/`.
    base: String,
    /// Calls sent and not yet answered.
    in_flight: AtomicUsize,
    /// Skipped until this many ms after `epoch`; 0 when not cooling.
    cool_until_ms: AtomicU64,
    /// Calls it answered (any HTTP answer, even an error status), counted.
    answered: AtomicU64,
    /// [`Replica::answered`] at its last health probe.
    answered_at_probe: AtomicU64,
}

/// One replica picked for a call: counts as a call in flight on it until dropped.
#[derive(Debug)]
pub struct Pick<'a> {
    replicas: &'a Replicas,
    index: usize,
    fallback: bool,
}

impl Replicas {
    /// The replicas at `bases` (trailing `/` dropped), in order; `None` when there is none.
    pub fn new(bases: impl IntoIterator<Item = String>) -> Option<Replicas> {
        let replicas: Vec<Replica> = bases
            .into_iter()
            .map(|base| Replica {
                base: base.trim_end_matches('/').to_owned(),
                in_flight: AtomicUsize::new(0),
                cool_until_ms: AtomicU64::new(0),
                answered: AtomicU64::new(0),
                answered_at_probe: AtomicU64::new(0),
            })
            .collect();
        (!replicas.is_empty()).then(|| Replicas {
            replicas,
            next: AtomicUsize::new(0),
            epoch: Instant::now(),
        })
    }

    /// How many replicas (at least 1).
    pub fn len(&self) -> usize {
        self.replicas.len()
    }

    /// Never: there is at least one replica (for clippy's `len_without_is_empty`).
    pub fn is_empty(&self) -> bool {
        self.replicas.is_empty()
    }

    /// The base URLs, in configured order.
    pub fn bases(&self) -> impl Iterator<Item = &str> {
        self.replicas.iter().map(|r| r.base.as_str())
    }

    /// The replica for the next call: of those not cooling, the one with the fewest calls in
    /// flight, ties taken round-robin; when every replica is cooling, the one with the fewest
    /// calls in flight among all ([`Pick::fallback`]).
    pub fn pick(&self) -> Pick<'_> {
        let n = self.replicas.len();
        let start = self.next.fetch_add(1, Ordering::Relaxed);
        let now = self.now_ms();
        let fewest = |skip_cooling: bool| {
            let mut best: Option<(usize, usize)> = None;
            for k in 0..n {
                let index = (start + k) % n;
                let replica = &self.replicas[index];
                if skip_cooling && replica.cool_until_ms.load(Ordering::Relaxed) > now {
                    continue;
                }
                let load = replica.in_flight.load(Ordering::Relaxed);
                if best.is_none_or(|(_, least)| load < least) {
                    best = Some((index, load));
                }
            }
            best.map(|(index, _)| index)
        };
        match fewest(true) {
            Some(index) => self.pick_at(index, false),
            None => self.pick_at(fewest(false).unwrap_or(0), true),
        }
    }

    /// Probes every replica at once with `probe` (given its base URL), each counted as a call
    /// in flight meanwhile: healthy when one replica is. A replica is healthy when its probe
    /// passed, or failed while it answered calls since its last probe ([`Pick::probed`]: busy,
    /// not sick); one that is neither is cooled, one that is is used again.
    ///
    /// # Errors
    /// The first replica's failure, when none is healthy.
    pub async fn probe_all<F, Fut>(&self, probe: F) -> Result<(), UpstreamError>
    where
        F: Fn(String) -> Fut,
        Fut: Future<Output = Result<(), UpstreamError>>,
    {
        let probe = &probe;
        let probes = (0..self.len()).map(|index| async move {
            let replica = self.at(index);
            let probed = probe(replica.base().to_owned()).await;
            if replica.probed(probed.is_ok()) {
                return Ok(());
            }
            probed
        });
        let probed = futures::future::join_all(probes).await;
        if probed.iter().any(Result::is_ok) {
            return Ok(());
        }
        probed.into_iter().find_map(Result::err).map_or(Ok(()), Err)
    }

    /// Runs `call` with the base URL of the replica [`Replicas::pick`] chooses, counted in
    /// flight there while it runs. When the replica is unreachable (connection refused or
    /// broken: nothing the inputs did), the call goes once to each other replica not cooling
    /// before the failure is returned; other failures (a timeout, an error status) are returned
    /// at once.
    ///
    /// # Errors
    /// The call's own error, or the last replica's unreachable.
    pub async fn on_replica<T, F, Fut>(&self, call: F) -> Result<T, UpstreamError>
    where
        F: Fn(String) -> Fut,
        Fut: Future<Output = Result<T, UpstreamError>>,
    {
        let mut failed = None;
        for _ in 0..self.len() {
            let pick = self.pick();
            if failed.is_some() && pick.fallback() {
                break; // every replica cools: the failure stands
            }
            let result = call(pick.base().to_owned()).await;
            pick.observe(&result);
            match result {
                Err(err @ UpstreamError::Unreachable(_)) => {
                    tracing::debug!(replica = pick.base(), %err, "upstream replica unreachable");
                    failed = Some(err);
                }
                other => return other,
            }
        }
        Err(failed.unwrap_or_else(|| UpstreamError::Unreachable("no upstream replica".into())))
    }

    /// The replica at `index` (in configured order), counted as a call in flight: for what goes
    /// to every replica (`/info`, `/health`).
    pub fn at(&self, index: usize) -> Pick<'_> {
        self.pick_at(index.min(self.replicas.len() - 1), false)
    }

    fn pick_at(&self, index: usize, fallback: bool) -> Pick<'_> {
        self.replicas[index]
            .in_flight
            .fetch_add(1, Ordering::Relaxed);
        Pick {
            replicas: self,
            index,
            fallback,
        }
    }

    /// Ms since `epoch`, from 1 (0 is "not cooling").
    fn now_ms(&self) -> u64 {
        u64::try_from(self.epoch.elapsed().as_millis())
            .unwrap_or(u64::MAX)
            .saturating_add(1)
    }
}

impl Pick<'_> {
    fn replica(&self) -> &Replica {
        &self.replicas.replicas[self.index]
    }

    /// The replica's base URL, without a trailing `/`.
    pub fn base(&self) -> &str {
        &self.replica().base
    }

    /// `{base}/{route}` on the replica (`route` without a leading `/`, e.g. `embed`).
    pub fn url(&self, route: &str) -> String {
        format!("{}/{route}", self.base())
    }

    /// The replica's position in `TEI_URL`, from 0.
    pub fn index(&self) -> usize {
        self.index
    }

    /// Whether the replica was taken although it cools, because every replica does.
    pub fn fallback(&self) -> bool {
        self.fallback
    }

    /// Records the call's outcome: unreachable cools the replica for [`COOL_DOWN`]; any other
    /// outcome (an answer, even an error status, or a timeout) ends its cool-down. An answer
    /// counts for [`Pick::probed`].
    pub fn observe<T>(&self, result: &Result<T, UpstreamError>) {
        match result {
            Err(UpstreamError::Unreachable(_)) => self.cool(),
            _ => self.replica().cool_until_ms.store(0, Ordering::Relaxed),
        }
        if matches!(
            result,
            Ok(_) | Err(UpstreamError::Status { .. } | UpstreamError::Http { .. })
        ) {
            self.replica().answered.fetch_add(1, Ordering::Relaxed);
        }
    }

    /// Records a health probe of the replica (`passed`: it answered 200 in time) and tells
    /// whether the replica counts as healthy. A probe that failed while the replica answered
    /// calls since the last probe counts as passed: it is busy, not sick (TEI's `/health`
    /// queues behind the batches), as the worker's own membership rule has it. A passed probe
    /// ends a cool-down; a failed one of a replica that answered nothing cools it.
    pub fn probed(&self, passed: bool) -> bool {
        let replica = self.replica();
        let answered = replica.answered.load(Ordering::Relaxed);
        let before = replica.answered_at_probe.swap(answered, Ordering::Relaxed);
        let healthy = passed || answered != before;
        if healthy {
            replica.cool_until_ms.store(0, Ordering::Relaxed);
        } else {
            self.cool();
        }
        healthy
    }

    /// Skips the replica for [`COOL_DOWN`] from now (a failed health probe).
    pub fn cool(&self) {
        let until = self
            .replicas
            .now_ms()
            .saturating_add(u64::try_from(COOL_DOWN.as_millis()).unwrap_or(u64::MAX));
        self.replica().cool_until_ms.store(until, Ordering::Relaxed);
    }
}

impl Drop for Pick<'_> {
    fn drop(&mut self) {
        self.replica().in_flight.fetch_sub(1, Ordering::Relaxed);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn three() -> Replicas {
        Replicas::new(["http://a/", "http://b", "http://c"].map(String::from)).expect("three")
    }

    fn unreachable() -> Result<(), UpstreamError> {
        Err(UpstreamError::Unreachable("connection refused".into()))
    }

    #[test]
    fn none_is_refused_and_trailing_slashes_are_dropped() {
        assert!(Replicas::new(Vec::<String>::new()).is_none());
        let replicas = three();
        assert_eq!(
            replicas.bases().collect::<Vec<_>>(),
            ["http://a", "http://b", "http://c"]
        );
    }

    #[test]
    fn the_replica_with_the_fewest_calls_in_flight_is_picked() {
        let replicas = three();
        let first = replicas.pick();
        let second = replicas.pick();
        let third = replicas.pick();
        let first_index = first.index();
        let mut taken = [first_index, second.index(), third.index()];
        taken.sort_unstable();
        assert_eq!(taken, [0, 1, 2], "one call each before any gets a second");
        // Two more on b: a and c now hold one each, b three.
        let b = second.index();
        let extra = [replicas.at(b), replicas.at(b)];
        for _ in 0..10 {
            let next = replicas.pick();
            assert_ne!(next.index(), b, "b holds the most calls");
        }
        drop(extra);
        drop(first);
        let freed = replicas.pick();
        assert_eq!(
            freed.index(),
            first_index,
            "the one left with no call in flight"
        );
        drop((second, third, freed));
    }

    #[test]
    fn a_dropped_pick_releases_its_call() {
        let replicas = three();
        let held = replicas.at(0);
        assert_eq!(replicas.replicas[0].in_flight.load(Ordering::Relaxed), 1);
        drop(held);
        assert_eq!(replicas.replicas[0].in_flight.load(Ordering::Relaxed), 0);
        // Ties go round-robin: sequential calls visit every replica.
        let visited: Vec<usize> = (0..6).map(|_| replicas.pick().index()).collect();
        assert_eq!(visited, [0, 1, 2, 0, 1, 2]);
    }

    #[test]
    fn an_unreachable_replica_cools_and_every_one_cooling_still_serves() {
        let replicas = three();
        replicas.at(1).observe(&unreachable());
        for _ in 0..6 {
            let pick = replicas.pick();
            assert_ne!(pick.index(), 1, "b cools");
            assert!(!pick.fallback());
        }
        // An answer (even an error status) ends the cool-down.
        let answered: Result<(), UpstreamError> = Err(UpstreamError::Http {
            status: 500,
            body: String::new(),
        });
        replicas.at(1).observe(&answered);
        assert!((0..3).any(|_| replicas.pick().index() == 1));

        for index in 0..3 {
            replicas.at(index).observe(&unreachable());
        }
        let picks: Vec<Pick<'_>> = (0..3).map(|_| replicas.pick()).collect();
        assert!(picks.iter().all(Pick::fallback), "all cool: taken anyway");
        let mut taken: Vec<usize> = picks.iter().map(Pick::index).collect();
        taken.sort_unstable();
        assert_eq!(taken, [0, 1, 2], "still the fewest in flight among all");
    }

    #[test]
    fn a_failed_probe_of_a_replica_that_answered_calls_does_not_cool_it() {
        let replicas = three();
        let answered: Result<(), UpstreamError> = Ok(());
        replicas.at(1).observe(&answered);
        assert!(replicas.at(1).probed(false), "busy, not sick");
        assert_eq!(
            replicas.replicas[1].cool_until_ms.load(Ordering::Relaxed),
            0
        );
        assert!(!replicas.at(1).probed(false), "no call answered since");
        assert!(replicas.replicas[1].cool_until_ms.load(Ordering::Relaxed) > 0);
        replicas.at(1).observe(&unreachable());
        assert!(!replicas.at(1).probed(false), "a refused call is no answer");
        assert!(replicas.at(1).probed(true), "a passed probe");
        assert_eq!(
            replicas.replicas[1].cool_until_ms.load(Ordering::Relaxed),
            0
        );
    }

    #[test]
    fn a_cool_down_lasts_a_second() {
        let replicas = three();
        let until = {
            let pick = replicas.at(2);
            pick.cool();
            replicas.replicas[2].cool_until_ms.load(Ordering::Relaxed)
        };
        let span = until - replicas.now_ms();
        assert!(span <= 1_000 && span > 900, "{span} ms");
    }
}
