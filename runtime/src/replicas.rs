//! How many copies JetStream keeps of what embatch stores: the `--jetstream-replicas` setting
//! of the gateway and the worker ([`JetStreamArgs`]), resolved against the connected cluster
//! ([`Replicas::resolve`]), and applied to every stream, KV bucket and object store embatch
//! creates ([`ensure_stream`], [`ReplicaTarget::apply`]).
//!
//! Consumers follow their stream: embatch's durable consumers leave `num_replicas` at 0, which
//! JetStream reads as the stream's count (and a work-queue stream's consumers must match it);
//! when a stream's count changes, nats-server moves its consumers with it.

use std::fmt;
use std::str::FromStr;

use async_nats::jetstream::{self, stream};

/// The most replicas JetStream keeps of a stream (nats-server refuses more).
pub const MAX_REPLICAS: usize = 5;

/// The cluster size from which `auto` keeps 3 replicas: with 3 nodes a stream survives the loss
/// of any one (a RAFT group of 3 needs 2 for a quorum).
pub const AUTO_CLUSTER_NODES: usize = 3;

/// `--jetstream-replicas`: a count, or `auto`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Replicas {
    /// 3 when the connected server advertises at least [`AUTO_CLUSTER_NODES`] nodes in its
    /// cluster, 1 otherwise; never lowers what an existing stream has.
    #[default]
    Auto,
    /// Exactly this many (1 to [`MAX_REPLICAS`]); existing streams are changed to it.
    Count(usize),
}

/// Why a `--jetstream-replicas` value was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("expected `auto` or a replica count from 1 to {MAX_REPLICAS}, got {0:?}")]
pub struct ReplicasParseError(String);

impl FromStr for Replicas {
    type Err = ReplicasParseError;

    fn from_str(s: &str) -> Result<Replicas, ReplicasParseError> {
        let s = s.trim();
        if s.eq_ignore_ascii_case("auto") {
            return Ok(Replicas::Auto);
        }
        match s.parse::<usize>() {
            Ok(n) if (1..=MAX_REPLICAS).contains(&n) => Ok(Replicas::Count(n)),
            _ => Err(ReplicasParseError(s.to_owned())),
        }
    }
}

impl fmt::Display for Replicas {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Replicas::Auto => f.write_str("auto"),
            Replicas::Count(n) => write!(f, "{n}"),
        }
    }
}

/// The JetStream settings of the gateway and the worker (`#[command(flatten)]`).
#[derive(Debug, Clone, Copy, Default, clap::Args)]
pub struct JetStreamArgs {
    /// Replicas of every stream, KV bucket and object store embatch creates (bulk jobs, the
    /// cache, usage counts): `auto` (3 when the NATS server's cluster has at least 3 nodes, 1
    /// otherwise; never lowers an existing stream's count) or 1 to 5 (existing streams are
    /// changed to it).
    #[arg(long, env = "JETSTREAM_REPLICAS", default_value = "auto")]
    pub jetstream_replicas: Replicas,
}

/// The replica count to apply, as [`Replicas::resolve`] found it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ReplicaTarget {
    /// Replicas of what is created.
    pub count: usize,
    /// `true` when configured as a number: an existing stream is changed to `count` either
    /// way; `false` (`auto`): only raised to it.
    pub exact: bool,
}

impl Replicas {
    /// The count for the cluster `client` is connected to. `auto` counts the nodes the server
    /// advertises to clients (its `INFO`'s `connect_urls`, itself included; a server outside a
    /// cluster advertises none). A cluster with `no_advertise` advertises none either: give a
    /// count there.
    pub fn resolve(self, client: &async_nats::Client) -> ReplicaTarget {
        let info = client.server_info();
        self.resolve_for(info.cluster.is_some(), info.connect_urls.len())
    }

    fn resolve_for(self, clustered: bool, advertised: usize) -> ReplicaTarget {
        match self {
            Replicas::Count(count) => ReplicaTarget { count, exact: true },
            Replicas::Auto => {
                let nodes = if clustered { advertised.max(1) } else { 1 };
                let count = if nodes >= AUTO_CLUSTER_NODES {
                    AUTO_CLUSTER_NODES
                } else {
                    1
                };
                ReplicaTarget {
                    count,
                    exact: false,
                }
            }
        }
    }
}

impl ReplicaTarget {
    /// One replica, changing nothing that exists: what a single server has.
    pub const ONE: ReplicaTarget = ReplicaTarget {
        count: 1,
        exact: false,
    };

    /// The count `current` (an existing stream's) should become: `None` when it stays.
    pub fn change_from(&self, current: usize) -> Option<usize> {
        let wanted = if self.exact {
            self.count
        } else {
            self.count.max(current)
        };
        (wanted != current).then_some(wanted)
    }

    /// Brings the existing stream `name` (a KV bucket's `KV_<bucket>`, an object store's
    /// `OBJ_<bucket>`) to this count where it differs, logging the change. A change JetStream
    /// refuses (fewer nodes up than the count, say) is logged as a warning and the stream kept
    /// as it is: it still serves. Returns the stream's count afterwards.
    ///
    /// # Errors
    /// When the stream's info cannot be read.
    pub async fn apply(
        &self,
        js: &jetstream::Context,
        name: &str,
    ) -> Result<usize, jetstream::context::GetStreamError> {
        let stream = js.get_stream(name).await?;
        Ok(self.apply_to(js, stream.cached_info().config.clone()).await)
    }

    async fn apply_to(&self, js: &jetstream::Context, mut config: stream::Config) -> usize {
        let current = config.num_replicas.max(1);
        let Some(wanted) = self.change_from(current) else {
            return current;
        };
        config.num_replicas = wanted;
        let name = config.name.clone();
        match js.update_stream(config).await {
            Ok(_) => {
                tracing::info!(stream = %name, from = current, to = wanted, "JetStream stream replicas changed");
                wanted
            }
            Err(err) => {
                tracing::warn!(stream = %name, from = current, to = wanted, %err, "cannot change the JetStream stream's replicas; kept as it is");
                current
            }
        }
    }
}

/// `create`'s stream, bucket or store; when it fails, what `bind` finds instead: gateways and
/// workers start together and each creates what is missing, so another process may have
/// created it between this one's read and its create (nats-server then refuses the create if
/// the configs differ in the least, or for want of room for a second budget).
///
/// # Errors
/// `create`'s error, when `bind` finds nothing either.
pub async fn create_or_bind<T, E, B>(
    create: impl Future<Output = Result<T, E>>,
    bind: impl FnOnce() -> B,
) -> Result<T, E>
where
    B: Future<Output = Result<T, async_nats::Error>>,
{
    match create.await {
        Ok(made) => Ok(made),
        Err(err) => bind().await.map_err(|_| err),
    }
}

/// The stream `config` names, created with `target`'s count when missing, else brought to it
/// ([`ReplicaTarget::apply`]); `config.num_replicas` is ignored. The handle's cached info is
/// read after the change.
///
/// # Errors
/// When the stream can be neither read nor created.
pub async fn ensure_stream(
    js: &jetstream::Context,
    mut config: stream::Config,
    target: ReplicaTarget,
) -> Result<stream::Stream, jetstream::context::CreateStreamError> {
    config.num_replicas = target.count;
    let name = config.name.clone();
    let stream = create_or_bind(js.get_or_create_stream(config), || async {
        Ok(js.get_stream(&name).await?)
    })
    .await?;
    let existing = stream.cached_info().config.clone();
    if target.change_from(existing.num_replicas.max(1)).is_none() {
        return Ok(stream);
    }
    let name = existing.name.clone();
    target.apply_to(js, existing).await;
    // The handle again, so that its cached info shows the count now in force.
    Ok(js.get_stream(&name).await.unwrap_or(stream))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn values_parse_as_auto_or_a_count_within_jetstreams_limit() {
        assert_eq!("auto".parse(), Ok(Replicas::Auto));
        assert_eq!("AUTO".parse(), Ok(Replicas::Auto));
        assert_eq!("3".parse(), Ok(Replicas::Count(3)));
        assert_eq!("1".parse(), Ok(Replicas::Count(1)));
        for bad in ["0", "6", "-1", "three", ""] {
            assert!(bad.parse::<Replicas>().is_err(), "{bad:?}");
        }
        assert_eq!(Replicas::Count(3).to_string(), "3");
        assert_eq!(Replicas::Auto.to_string(), "auto");
    }

    #[test]
    fn auto_keeps_three_on_three_nodes_or_more_and_one_otherwise() {
        let auto = |clustered, advertised| Replicas::Auto.resolve_for(clustered, advertised).count;
        assert_eq!(auto(false, 0), 1, "a single server");
        assert_eq!(auto(true, 0), 1, "no_advertise: nothing known");
        assert_eq!(auto(true, 2), 1);
        assert_eq!(auto(true, 3), 3);
        assert_eq!(auto(true, 5), 3);
        assert_eq!(Replicas::Count(2).resolve_for(true, 5).count, 2);
    }

    #[test]
    fn auto_only_raises_and_a_count_sets() {
        let auto3 = ReplicaTarget {
            count: 3,
            exact: false,
        };
        assert_eq!(auto3.change_from(1), Some(3));
        assert_eq!(auto3.change_from(3), None);
        assert_eq!(auto3.change_from(5), None, "auto never lowers");
        assert_eq!(ReplicaTarget::ONE.change_from(3), None);
        let exact1 = ReplicaTarget {
            count: 1,
            exact: true,
        };
        assert_eq!(exact1.change_from(3), Some(1));
        assert_eq!(exact1.change_from(1), None);
    }
}
