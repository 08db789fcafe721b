//! [`AppState`]: what every route shares (the NATS clients, the limits, the tenants, the bulk
//! store and the metering), built once from the configuration.

use std::sync::Arc;
use std::time::Duration;

use axum::body::Bytes;
use embatch_client::EmbedClient;
use embatch_runtime::tenants::{Tenants, TenantsWatch};
use metrics_exporter_prometheus::PrometheusHandle;
use tokio::sync::Semaphore;
use tokio_util::sync::{CancellationToken, DropGuard};

use crate::models::Models;
use crate::serve::ServeLimits;

/// What the routes share.
#[derive(Clone)]
pub struct AppState {
    /// Sends requests of the default route (no model named) over the NATS connection.
    pub client: EmbedClient,
    /// The models served, live, and the route of each (see [`crate::models`]).
    pub models: Models,
    /// Longest end-to-end time of a request.
    pub request_timeout: Duration,
    /// Most inputs in one request (413 beyond).
    pub max_client_batch_size: usize,
    /// Largest body in bytes (413 beyond).
    pub max_body_bytes: usize,
    /// Longest time to receive a whole request body once its headers are in (408 beyond; see
    /// [`crate::body`]).
    pub body_read_timeout: Duration,
    /// How long `/health` waits for a worker's ping reply, and `/info` for a worker's info.
    pub health_timeout: Duration,
    /// Renders `/metrics`; `None` when no recorder is installed (tests).
    pub metrics: Option<PrometheusHandle>,
    /// Connection limits of the HTTP server.
    pub limits: ServeLimits,
    /// Most `/embed` requests in flight (`MAX_IN_FLIGHT`).
    pub max_in_flight: usize,
    /// One permit per `/embed` request in flight (`MAX_IN_FLIGHT`); none left: 429.
    pub in_flight: Arc<Semaphore>,
    /// The body of `GET /openapi.json`: [`crate::openapi::document`], serialized.
    pub openapi: Bytes,
    /// The Files and Batches routes' state (see [`crate::bulk`]).
    pub bulk: crate::bulk::Bulk,
    /// The tenants in force (`TENANTS_FILE`; open without one): see [`crate::tenancy`].
    pub tenants: TenantsWatch,
    /// Quotas and usage per tenant (see [`crate::metering`]).
    pub meter: crate::metering::Meter,
    /// Stops the quota exchange and the usage flusher when the last clone is dropped.
    _background: Arc<DropGuard>,
}

impl AppState {
    /// The state for `config`, on an open NATS connection; `metrics` renders `/metrics` (`None`:
    /// 404).
    pub fn new(
        client: async_nats::Client,
        config: &crate::Config,
        metrics: Option<PrometheusHandle>,
    ) -> AppState {
        let bulk = crate::bulk::Bulk::new(
            client.clone(),
            crate::bulk::BulkLimits {
                max_file_bytes: config.bulk_max_file_bytes,
                files_max_bytes: config.bulk_files_max_bytes,
                completion_windows: config.bulk_completion_windows.clone(),
                replicas: config.jetstream.jetstream_replicas,
            },
        );
        let background = CancellationToken::new();
        let quotas = crate::quota::Quotas::new(config.quota_window);
        crate::quota::sync::start(client.clone(), quotas.clone(), background.clone());
        let meter = crate::metering::Meter {
            quotas,
            usage: crate::usage::UsageBook::start(
                client.clone(),
                config.jetstream.jetstream_replicas,
                background.clone(),
            ),
            counters: Default::default(),
        };
        let models = Models::start(
            client.clone(),
            &config.subject,
            config.default_model.as_deref(),
        );
        AppState {
            bulk,
            client: models.default_route().client.clone(),
            models,
            request_timeout: config.request_timeout,
            max_client_batch_size: config.max_client_batch_size,
            max_body_bytes: config.max_body_bytes,
            body_read_timeout: config.body_read_timeout,
            health_timeout: config.health_timeout,
            metrics,
            limits: ServeLimits {
                max_connections: config.max_connections,
                header_read_timeout: config.header_read_timeout,
                shutdown_grace: config.shutdown_grace,
            },
            max_in_flight: config.max_in_flight,
            in_flight: Arc::new(Semaphore::new(
                config.max_in_flight.clamp(1, Semaphore::MAX_PERMITS),
            )),
            openapi: crate::openapi::document_json(),
            tenants: TenantsWatch::fixed(Tenants::open()),
            meter,
            _background: Arc::new(background.drop_guard()),
        }
    }

    /// This state with `tenants` in force instead of an open gateway (the binary passes the
    /// watch of `TENANTS_FILE`, see [`embatch_runtime::tenants::watch`]).
    pub fn with_tenants(mut self, tenants: TenantsWatch) -> AppState {
        self.tenants = tenants;
        self
    }
}
