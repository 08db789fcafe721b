//! The models served behind the gateway, from NATS discovery, and the route of a request to its
//! model (contract v1.1, see [`embatch_protocol::model`]).
//!
//! The table comes from NATS micro discovery (`$SRV.INFO.embatch`,
//! [`embatch_client::models::discover`]), asked on demand, never periodically: at start; when a
//! request names a model not in the table (at most once per [`REFRESH_EVERY`]); when
//! `GET /v1/models` finds the table older than [`LIST_TTL`] (it answers after that round); in
//! the background when a request for a known model finds it older than [`ROUTE_TTL`]. A worker missing from [`MISSES_TO_FORGET`]
//! rounds in a row (killed, partitioned) is forgotten; one answering `stopping` at once. Workers
//! also announce themselves once on `<subject>.members` when they start and once when they stop
//! ([`Announcement`]), which the gateway takes at once: a new model appears, and a stopped
//! worker leaves the table, without waiting for a round. An idle fleet costs the gateway nothing
//! (docs/design/control-plane.md).
//!
//! Routing ([`Models::route`]):
//! - no model (TEI's routes, or an OpenAI request without `model` or with `""`): the default
//!   model, `EMBATCH_DEFAULT_MODEL`'s model subject; unset, the plain subject (whatever model
//!   its workers serve, as before models were named);
//! - a model served, or the configured default model's name: its model subject
//!   (`<subject>.<token>`);
//! - any other name: [`EmbedError::ModelNotFound`] (404), listing the models served.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use embatch_client::EmbedClient;
use embatch_protocol::headers::{members_subject, membership};
use embatch_protocol::model::{Announcement, model_subject};
use embatch_protocol::{EmbedError, SERVICE_NAME};
use futures::StreamExt;
use tokio::time::Instant;
use tokio_util::sync::{CancellationToken, DropGuard};

use crate::telemetry::RequestMetrics;

/// Longest a discovery round (`$SRV.INFO`) collects answers: 100 ms.
pub const DISCOVERY_WAIT: Duration = Duration::from_millis(100);

/// A discovery round runs at most this often: 1 s (a request naming an unknown model meanwhile
/// is answered from the table).
pub const REFRESH_EVERY: Duration = Duration::from_secs(1);

/// `GET /v1/models` runs a round first when the table is older than this: 2 s (so it answers
/// at most [`DISCOVERY_WAIT`] later, at most once per 2 s; a killed worker leaves the table
/// within two rounds).
pub const LIST_TTL: Duration = Duration::from_secs(2);

/// A request for a known model starts a round in the background when the table is older than
/// this: 10 s (so a model whose workers were all killed stops being routed, with 404, within
/// about two of these while requests come; meanwhile its requests get 503, no worker). Costs one
/// round per gateway per 10 s under traffic, none while idle.
pub const ROUTE_TTL: Duration = Duration::from_secs(10);

/// Rounds in a row a worker may miss before it is forgotten: 2 (a loaded worker may answer a
/// round after [`DISCOVERY_WAIT`]).
pub const MISSES_TO_FORGET: u32 = 2;

/// A model served now, as `GET /v1/models` lists it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ServedModel {
    /// The model name (the OpenAI `model`).
    pub name: String,
    /// Its revision, when a worker announced one.
    pub revision: Option<String>,
    /// Unix seconds when the gateway first saw a worker of it (since it was last absent).
    pub created: u64,
    /// Whether its workers answer the plain subject (it is the default model).
    pub default: bool,
    /// How many of its workers were heard from.
    pub workers: usize,
    /// What it does, as its workers announced it (`None`: none announced it).
    pub capabilities: Option<Vec<String>>,
}

/// `GET /v1/models`'s body: OpenAI's list of models,
/// `{"object": "list", "data": [{"id", "object": "model", "created", "owned_by"}, ...]}`.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, utoipa::ToSchema)]
pub struct ModelList {
    /// Always `"list"`.
    pub object: String,
    /// One entry per model served, by name.
    pub data: Vec<ModelObject>,
}

/// One model of [`ModelList`]: OpenAI's model object and three fields of embatch's.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, utoipa::ToSchema)]
pub struct ModelObject {
    /// The model's name: what `model` (OpenAI) or `Embatch-Model` (TEI) takes.
    pub id: String,
    /// Always `"model"`.
    pub object: String,
    /// Unix seconds when the gateway first saw a worker of it (since it was last absent).
    pub created: u64,
    /// Always `"embatch"`.
    pub owned_by: String,
    /// The weights' revision (TEI's `model_sha`), when a worker announced one.
    pub revision: Option<String>,
    /// Whether requests that name no model go to it.
    pub default: bool,
    /// How many workers serve it now.
    pub workers: usize,
    /// What it does, from its upstream's `/info` `model_type`: `embed` (`/embed`,
    /// `/embed_all`, `/similarity`), `sparse` (`/embed_sparse`), `rerank` (`/rerank`),
    /// `classify` (`/predict`). Absent when its workers predate contract v1.4. A route the
    /// model does not serve is answered 424, as TEI.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub capabilities: Option<Vec<String>>,
}

impl Models {
    /// The body of `GET /v1/models`: the table, after a discovery round when it is older than
    /// [`LIST_TTL`].
    pub async fn list(&self) -> ModelList {
        if self.table().older_than(LIST_TTL, Instant::now()) {
            self.refresh().await;
        }
        let data = self
            .served()
            .into_iter()
            .map(|m| ModelObject {
                default: m.default || self.default_model() == Some(m.name.as_str()),
                id: m.name,
                object: "model".to_owned(),
                created: m.created,
                owned_by: "embatch".to_owned(),
                revision: m.revision,
                workers: m.workers,
                capabilities: m.capabilities,
            })
            .collect();
        ModelList {
            object: "list".to_owned(),
            data,
        }
    }
}

/// Where a request goes: the client of its subject and the metrics of its model.
pub struct Route {
    /// Sends on the model subject (or the plain subject for the default route without a
    /// configured default model).
    pub client: EmbedClient,
    /// The per-request metrics, labelled `model` (no label for the plain subject without a
    /// configured default model: the series of a single-model fleet stay as they were).
    pub metrics: RequestMetrics,
}

/// The live model table and the routes, shared by the routes (cheap to clone).
#[derive(Clone)]
pub struct Models {
    shared: Arc<Shared>,
}

struct Shared {
    nats: async_nats::Client,
    prefix: String,
    default_model: Option<String>,
    table: Arc<Mutex<Table>>,
    routes: Mutex<HashMap<String, Arc<Route>>>,
    plain: Arc<Route>,
    last_refresh: tokio::sync::Mutex<Option<Instant>>,
    /// Stops the announcement listener when the last clone is dropped.
    _listener: DropGuard,
}

/// The workers heard from, by service id, since when each model is served, and when the last
/// discovery round ended.
#[derive(Debug, Default)]
struct Table {
    workers: HashMap<String, Heard>,
    created: HashMap<String, u64>,
    refreshed: Option<Instant>,
}

#[derive(Debug, Clone)]
struct Heard {
    model: Option<String>,
    revision: Option<String>,
    plain: bool,
    capabilities: Option<Vec<String>>,
    /// Discovery rounds in a row it did not answer.
    missed: u32,
}

impl Table {
    /// Takes what a worker said; a stopping worker is forgotten.
    fn record(&mut self, id: String, stopping: bool, heard: Heard) {
        if stopping {
            self.workers.remove(&id);
            self.forget_empty_models();
            return;
        }
        if let Some(model) = &heard.model {
            self.created
                .entry(model.clone())
                .or_insert_with(embatch_protocol::bulk::unix_now);
        }
        self.workers.insert(id, heard);
    }

    /// Takes one discovery round's answers, ended at `now`: the workers that answered are
    /// recorded, the others missed one more round ([`MISSES_TO_FORGET`]).
    fn round(&mut self, answers: Vec<embatch_client::models::WorkerModel>, now: Instant) {
        let answered: std::collections::HashSet<String> =
            answers.iter().map(|w| w.id.clone()).collect();
        for (id, heard) in &mut self.workers {
            if !answered.contains(id) {
                heard.missed += 1;
            }
        }
        self.workers
            .retain(|_, heard| heard.missed < MISSES_TO_FORGET);
        for worker in answers {
            let stopping = worker.membership == membership::STOPPING;
            let heard = Heard {
                model: worker.model,
                revision: worker.revision,
                plain: worker.plain,
                capabilities: worker.capabilities,
                missed: 0,
            };
            self.record(worker.id, stopping, heard);
        }
        self.forget_empty_models();
        self.refreshed = Some(now);
    }

    /// Forgets the creation time of models left without a worker.
    fn forget_empty_models(&mut self) {
        let workers = &self.workers;
        self.created
            .retain(|model, _| workers.values().any(|h| h.model.as_ref() == Some(model)));
    }

    /// Whether the last round ended more than `ttl` before `now` (or none ran).
    fn older_than(&self, ttl: Duration, now: Instant) -> bool {
        self.refreshed
            .is_none_or(|at| now.saturating_duration_since(at) > ttl)
    }

    fn served(&self) -> Vec<ServedModel> {
        let mut models: HashMap<&str, ServedModel> = HashMap::new();
        for heard in self.workers.values() {
            let Some(name) = &heard.model else { continue };
            let entry = models.entry(name).or_insert_with(|| ServedModel {
                name: name.clone(),
                revision: None,
                created: self.created.get(name).copied().unwrap_or(0),
                default: false,
                workers: 0,
                capabilities: None,
            });
            entry.workers += 1;
            entry.default |= heard.plain;
            if entry.revision.is_none() {
                entry.revision.clone_from(&heard.revision);
            }
            if entry.capabilities.is_none() {
                entry.capabilities.clone_from(&heard.capabilities);
            }
        }
        let mut models: Vec<ServedModel> = models.into_values().collect();
        models.sort_by(|a, b| a.name.cmp(&b.name));
        models
    }
}

impl Models {
    /// The table for the workers under `prefix` (`EMBATCH_SUBJECT`) on `nats`, with the
    /// stack's `default_model` (`EMBATCH_DEFAULT_MODEL`; `""` counts as unset). Spawns the
    /// announcement listener (needs a tokio runtime); it stops when the last clone is dropped.
    pub fn start(nats: async_nats::Client, prefix: &str, default_model: Option<&str>) -> Models {
        let default_model = default_model.filter(|d| !d.is_empty()).map(str::to_owned);
        let table = Arc::new(Mutex::new(Table::default()));
        let stop = CancellationToken::new();
        tokio::spawn(listen(
            nats.clone(),
            prefix.to_owned(),
            Arc::clone(&table),
            stop.clone(),
        ));
        let plain = match &default_model {
            Some(name) => route(&nats, model_subject(prefix, name), name),
            None => route(&nats, prefix.to_owned(), ""),
        };
        Models {
            shared: Arc::new(Shared {
                nats,
                prefix: prefix.to_owned(),
                default_model,
                table,
                routes: Mutex::new(HashMap::new()),
                plain,
                last_refresh: tokio::sync::Mutex::new(None),
                _listener: stop.drop_guard(),
            }),
        }
    }

    /// `EMBATCH_DEFAULT_MODEL`, when set.
    pub fn default_model(&self) -> Option<&str> {
        self.shared.default_model.as_deref()
    }

    /// The route of requests that name no model.
    pub fn default_route(&self) -> &Arc<Route> {
        &self.shared.plain
    }

    /// The models served now, by name.
    pub fn served(&self) -> Vec<ServedModel> {
        self.table().served()
    }

    /// The route of a request for `model` (`None` or `""`: the default route).
    ///
    /// # Errors
    /// [`EmbedError::ModelNotFound`] (404) when no worker serves `model` (after a discovery
    /// round, at most one per [`REFRESH_EVERY`]) and it is not the configured default model.
    pub async fn route(&self, model: Option<&str>) -> Result<Arc<Route>, EmbedError> {
        let Some(name) = model.filter(|m| !m.is_empty()) else {
            return Ok(Arc::clone(&self.shared.plain));
        };
        if self.shared.default_model.as_deref() == Some(name) {
            return Ok(Arc::clone(&self.shared.plain));
        }
        if self.is_served(name) {
            self.refresh_if_older(ROUTE_TTL);
        } else {
            self.refresh().await;
            if !self.is_served(name) {
                let served: Vec<String> = self.served().into_iter().map(|m| m.name).collect();
                return Err(EmbedError::ModelNotFound {
                    model: name.to_owned(),
                    served: if served.is_empty() {
                        "none".to_owned()
                    } else {
                        served.join(", ")
                    },
                });
            }
        }
        let mut routes = self
            .shared
            .routes
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        let route = routes.entry(name.to_owned()).or_insert_with(|| {
            route(
                &self.shared.nats,
                model_subject(&self.shared.prefix, name),
                name,
            )
        });
        Ok(Arc::clone(route))
    }

    fn is_served(&self, name: &str) -> bool {
        self.table()
            .workers
            .values()
            .any(|heard| heard.model.as_deref() == Some(name))
    }

    /// Starts a discovery round in the background when the table is older than `ttl`.
    fn refresh_if_older(&self, ttl: Duration) {
        if self.table().older_than(ttl, Instant::now()) {
            let models = self.clone();
            tokio::spawn(async move { models.refresh().await });
        }
    }

    /// One discovery round, unless one ran within [`REFRESH_EVERY`] (concurrent callers wait
    /// for the round in progress).
    async fn refresh(&self) {
        let mut last = self.shared.last_refresh.lock().await;
        if last.is_some_and(|at| at.elapsed() < REFRESH_EVERY) {
            return;
        }
        discover_into(&self.shared.nats, &self.shared.prefix, &self.shared.table).await;
        *last = Some(Instant::now());
    }

    fn table(&self) -> std::sync::MutexGuard<'_, Table> {
        self.shared
            .table
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
    }
}

/// The route to `subject` for model label `model`.
fn route(nats: &async_nats::Client, subject: String, model: &str) -> Arc<Route> {
    Arc::new(Route {
        client: EmbedClient::new(nats.clone(), subject),
        metrics: RequestMetrics::register(model),
    })
}

/// Records the workers that answer one `$SRV.INFO` round.
async fn discover_into(nats: &async_nats::Client, prefix: &str, table: &Mutex<Table>) {
    match embatch_client::models::discover(nats, SERVICE_NAME, prefix, DISCOVERY_WAIT).await {
        Ok(workers) => table
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .round(workers, Instant::now()),
        Err(err) => tracing::debug!(%err, "model discovery failed"),
    }
}

/// Listens to the workers' start and stop announcements until `stop` is cancelled; one discovery
/// round first.
async fn listen(
    nats: async_nats::Client,
    prefix: String,
    table: Arc<Mutex<Table>>,
    stop: CancellationToken,
) {
    let mut announcements = match nats.subscribe(members_subject(&prefix)).await {
        Ok(subscriber) => subscriber,
        Err(err) => {
            tracing::warn!(%err, "cannot listen to the workers' announcements; /v1/models is empty");
            return;
        }
    };
    discover_into(&nats, &prefix, &table).await;
    loop {
        let message = tokio::select! {
            () = stop.cancelled() => return,
            message = announcements.next() => match message {
                Some(message) => message,
                None => return,
            },
        };
        let Ok(heard) = serde_json::from_slice::<Announcement>(&message.payload) else {
            continue;
        };
        let stopping = heard.membership == membership::STOPPING;
        let plain = heard.serves_plain();
        let mut table = table.lock().unwrap_or_else(PoisonError::into_inner);
        table.record(
            heard.id,
            stopping,
            Heard {
                model: heard.model,
                revision: heard.model_revision,
                plain,
                capabilities: heard.capabilities,
                missed: 0,
            },
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use embatch_client::models::WorkerModel;

    fn heard(model: &str, plain: bool) -> Heard {
        Heard {
            model: Some(model.into()),
            revision: None,
            plain,
            capabilities: None,
            missed: 0,
        }
    }

    fn answer(id: &str, model: &str, membership: &str) -> WorkerModel {
        WorkerModel {
            id: id.into(),
            model: Some(model.into()),
            revision: None,
            plain: false,
            capabilities: None,
            membership: membership.into(),
        }
    }

    fn names(table: &Table) -> Vec<String> {
        table.served().into_iter().map(|m| m.name).collect()
    }

    #[test]
    fn a_model_is_served_from_its_first_worker_to_its_last() {
        let mut table = Table::default();
        table.record("w1".into(), false, heard("a", true));
        table.record("w2".into(), false, heard("a", true));
        table.record("w3".into(), false, heard("b", false));
        assert_eq!(names(&table), ["a", "b"]);
        assert_eq!(table.served()[0].workers, 2);
        assert!(table.served()[0].default && !table.served()[1].default);
        table.record("w1".into(), true, heard("a", true));
        assert_eq!(names(&table), ["a", "b"], "w2 still serves a");
        table.record("w2".into(), true, heard("a", true));
        assert_eq!(names(&table), ["b"]);
        assert!(!table.created.contains_key("a"));
    }

    #[test]
    fn a_worker_missing_from_two_rounds_in_a_row_is_forgotten() {
        let now = Instant::now();
        let mut table = Table::default();
        assert!(table.older_than(LIST_TTL, now), "no round yet");
        table.round(
            vec![answer("w1", "a", "joined"), answer("w2", "b", "full")],
            now,
        );
        assert_eq!(names(&table), ["a", "b"]);
        assert!(!table.older_than(LIST_TTL, now));
        assert!(table.older_than(LIST_TTL, now + LIST_TTL + Duration::from_millis(1)));
        table.round(vec![answer("w1", "a", "joined")], now);
        assert_eq!(names(&table), ["a", "b"], "one round missed: a late answer");
        table.round(
            vec![answer("w1", "a", "joined"), answer("w2", "b", "joined")],
            now,
        );
        table.round(vec![answer("w1", "a", "joined")], now);
        assert_eq!(names(&table), ["a", "b"], "misses count in a row");
        table.round(vec![answer("w1", "a", "stopping")], now);
        assert!(names(&table).is_empty(), "w1 stops, w2 missed twice");
        assert!(table.created.is_empty());
    }
}
