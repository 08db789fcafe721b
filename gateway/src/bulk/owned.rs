//! The object a `/v1/files/{id}...` or `/v1/batches/{id}...` route names, read once for every
//! such handler: the `{id}` of the path, checked to belong to the caller.

use std::future::Future;

use axum::extract::{Extension, FromRequestParts, Path};
use axum::http::request::Parts;
use axum::response::{IntoResponse, Response};

use super::{ApiError, Bulk};
use crate::tenancy::Caller;

/// A stored object a route's `{id}` names: a file's `ObjectInfo`, a batch.
pub trait Lookup: Sized + Send {
    /// The object `id` when `tenant` owns it; else the route's 404 (also for another tenant's
    /// object, as OpenAI answers another project's id).
    fn lookup(
        bulk: &Bulk,
        id: &str,
        tenant: &str,
    ) -> impl Future<Output = Result<Self, ApiError>> + Send;

    /// The route's 404 for `id`.
    fn not_found(id: &str) -> ApiError;
}

/// The object `T` the path's `{id}` names, owned by the caller, with the bulk state. An id no
/// object can have (not UTF-8 once percent-decoded) is answered with `T`'s 404 for `?`.
pub struct Owned<T> {
    /// The bulk routes' state.
    pub bulk: Bulk,
    /// The `{id}` of the path.
    pub id: String,
    /// What it names.
    pub item: T,
}

impl<T: Lookup> FromRequestParts<Bulk> for Owned<T> {
    type Rejection = Response;

    async fn from_request_parts(parts: &mut Parts, bulk: &Bulk) -> Result<Self, Response> {
        let Extension(caller) = Extension::<Caller>::from_request_parts(parts, bulk)
            .await
            .map_err(IntoResponse::into_response)?;
        let Ok(Path(id)) = Path::<String>::from_request_parts(parts, bulk).await else {
            return Err(T::not_found("?").into_response());
        };
        match T::lookup(bulk, &id, caller.name()).await {
            Ok(item) => Ok(Owned {
                bulk: bulk.clone(),
                id,
                item,
            }),
            Err(err) => Err(err.into_response()),
        }
    }
}
