//! The node's variables store and what templates read: wiring of wharf-store's
//! [`VariableFile`] (kept at `<data dir>/variables.json`) and wharf-health's service catalog
//! into wharf-task's [`TemplateSources`], and the API's `/v1/var/{path}` and `/v1/vars`.
//! `PUT /v1/vars` takes a fleet's whole set ([`VariableSync`]): the fleet runs `wharf var
//! sync` on each worker, so that the worker's templates read the fleet's variables.
//!
//! Templates re-render when either changes: a variable written here, or a service that comes
//! or goes in the catalog (forwarded by a small task for as long as the store lives).

use axum::extract::{Path, Query, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use axum::{Json, Router};
use serde::Deserialize;
use std::collections::BTreeMap;
use std::sync::Arc;
use tokio::sync::watch;
use wharf_health::ServiceCatalog;
use wharf_state::ServiceEntry;
use wharf_store::{StoreError, Variable, VariableFile, VariableSync};
use wharf_task::TemplateSources;
use wharf_task::template::VariableItems;

/// The file of the node's variables, under its data directory.
pub const VARIABLES_FILE: &str = "variables.json";

/// The node's variables, and its services as templates see them.
#[derive(Debug)]
pub struct NodeVariables {
    file: VariableFile,
    catalog: Arc<ServiceCatalog>,
    changed: watch::Sender<u64>,
}

impl NodeVariables {
    /// Opens the variables of `data_dir` and follows `catalog`. Call within a tokio runtime.
    pub fn open(
        data_dir: &std::path::Path,
        catalog: Arc<ServiceCatalog>,
    ) -> Result<Arc<NodeVariables>, StoreError> {
        let file = VariableFile::open(data_dir.join(VARIABLES_FILE))?;
        let mut services = catalog.subscribe();
        let variables = Arc::new(NodeVariables { file, catalog, changed: watch::channel(0).0 });
        let weak = Arc::downgrade(&variables);
        tokio::spawn(async move {
            while services.changed().await.is_ok() {
                let Some(variables) = weak.upgrade() else { return };
                variables.touch();
            }
        });
        Ok(variables)
    }

    fn touch(&self) {
        self.changed.send_modify(|version| *version += 1);
    }

    /// The variable at `path`.
    pub fn get(&self, path: &str) -> Option<Variable> {
        self.file.get(path)
    }

    /// The variables under `prefix`.
    pub fn list(&self, prefix: &str) -> Vec<Variable> {
        self.file.list(prefix)
    }

    /// Sets a variable, durably (on a blocking thread), then wakes the templates.
    pub async fn put(
        self: &Arc<Self>,
        path: String,
        items: BTreeMap<String, String>,
    ) -> Result<Variable, StoreError> {
        let this = self.clone();
        let put = tokio::task::spawn_blocking(move || this.file.put(&path, items));
        let variable = put.await.map_err(|_| StoreError::Closed)??;
        self.touch();
        Ok(variable)
    }

    /// Takes a fleet's whole set, durably, unless it holds that copy or a later one already;
    /// whether it took it (then the templates wake).
    pub async fn sync(self: &Arc<Self>, sync: VariableSync) -> Result<bool, StoreError> {
        let this = self.clone();
        let synced = tokio::task::spawn_blocking(move || this.file.sync(sync));
        let taken = synced.await.map_err(|_| StoreError::Closed)??;
        if taken {
            self.touch();
        }
        Ok(taken)
    }

    /// Removes a variable, durably; whether there was one.
    pub async fn delete(self: &Arc<Self>, path: String) -> Result<bool, StoreError> {
        let this = self.clone();
        let deleted = tokio::task::spawn_blocking(move || this.file.delete(&path));
        let deleted = deleted.await.map_err(|_| StoreError::Closed)??;
        if deleted {
            self.touch();
        }
        Ok(deleted)
    }
}

impl TemplateSources for NodeVariables {
    fn services(&self, name: &str) -> Vec<ServiceEntry> {
        self.catalog.list().into_iter().filter(|s| s.name == name).collect()
    }

    fn variable(&self, path: &str) -> Option<VariableItems> {
        self.file.get(path).map(|v| v.items)
    }

    fn variable_paths(&self, prefix: &str) -> Vec<String> {
        self.file.list(prefix).into_iter().map(|v| v.path).collect()
    }

    fn changes(&self) -> watch::Receiver<u64> {
        self.changed.subscribe()
    }
}

/// Why a variables call is refused: its status and the message the API answers with (as
/// `{"error": "..."}`, as every error of the API is).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct VariableError {
    /// The status.
    pub status: StatusCode,
    /// What is wrong.
    pub message: String,
}

impl VariableError {
    /// A refusal with `status`, saying `message`.
    pub fn new(status: StatusCode, message: impl Into<String>) -> VariableError {
        VariableError { status, message: message.into() }
    }
}

impl IntoResponse for VariableError {
    fn into_response(self) -> Response {
        (self.status, Json(serde_json::json!({ "error": self.message }))).into_response()
    }
}

/// A set of variables the API serves at `/v1/var/{path}` and `/v1/vars`: the node's, or the
/// one a fleet gives its workers (`crate::fleet::variables`).
pub trait VariableService: Send + Sync + 'static {
    /// Why the variables cannot be served now, if they cannot: every call answers it.
    fn unavailable(&self) -> Option<VariableError> {
        None
    }

    /// The variable at `path`.
    fn get(&self, path: &str) -> Option<Variable>;

    /// The variables under `prefix`, by path.
    fn list(&self, prefix: &str) -> Vec<Variable>;

    /// Sets the variable at `path` to `items`, durably.
    fn put(
        self: Arc<Self>,
        path: String,
        items: BTreeMap<String, String>,
    ) -> impl Future<Output = Result<Variable, VariableError>> + Send;

    /// Removes the variable at `path`, durably; whether there was one.
    fn delete(
        self: Arc<Self>,
        path: String,
    ) -> impl Future<Output = Result<bool, VariableError>> + Send;

    /// Takes a fleet's whole set (`PUT /v1/vars`): a worker's agent does.
    fn sync(
        self: Arc<Self>,
        sync: VariableSync,
    ) -> impl Future<Output = Result<Synced, VariableError>> + Send;
}

impl VariableService for NodeVariables {
    fn get(&self, path: &str) -> Option<Variable> {
        NodeVariables::get(self, path)
    }

    fn list(&self, prefix: &str) -> Vec<Variable> {
        NodeVariables::list(self, prefix)
    }

    async fn put(
        self: Arc<Self>,
        path: String,
        items: BTreeMap<String, String>,
    ) -> Result<Variable, VariableError> {
        NodeVariables::put(&self, path, items).await.map_err(store_error)
    }

    async fn delete(self: Arc<Self>, path: String) -> Result<bool, VariableError> {
        NodeVariables::delete(&self, path).await.map_err(store_error)
    }

    async fn sync(self: Arc<Self>, sync: VariableSync) -> Result<Synced, VariableError> {
        let taken = NodeVariables::sync(&self, sync).await.map_err(store_error)?;
        Ok(Synced { taken, source_index: self.file.source_index() })
    }
}

/// The API's routes for `variables` (the router they join guards them with its token).
pub fn routes<S, V>(variables: Arc<V>) -> Router<S>
where
    S: Clone + Send + Sync + 'static,
    V: VariableService,
{
    Router::new()
        .route("/v1/var/{*path}", get(get_var::<V>).put(put_var::<V>).delete(delete_var::<V>))
        .route("/v1/vars", get(list_vars::<V>).put(sync_vars::<V>))
        .with_state(variables)
}

fn store_error(failure: StoreError) -> VariableError {
    let status = match failure {
        StoreError::InvalidVariable { .. } => StatusCode::BAD_REQUEST,
        _ => StatusCode::INTERNAL_SERVER_ERROR,
    };
    VariableError::new(status, failure.to_string())
}

fn no_variable(path: &str) -> VariableError {
    VariableError::new(StatusCode::NOT_FOUND, format!("no variable at {path:?}"))
}

/// A body or query axum could not take, as the API's error.
fn rejected(status: StatusCode, text: String) -> Response {
    VariableError::new(status, text).into_response()
}

async fn get_var<V: VariableService>(
    State(vars): State<Arc<V>>,
    Path(path): Path<String>,
) -> Response {
    if let Some(refused) = vars.unavailable() {
        return refused.into_response();
    }
    match vars.get(&path) {
        Some(variable) => Json(variable).into_response(),
        None => no_variable(&path).into_response(),
    }
}

/// The body of a PUT: the items.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct PutBody {
    items: BTreeMap<String, String>,
}

async fn put_var<V: VariableService>(
    State(vars): State<Arc<V>>,
    Path(path): Path<String>,
    body: Result<Json<PutBody>, axum::extract::rejection::JsonRejection>,
) -> Response {
    if let Some(refused) = vars.unavailable() {
        return refused.into_response();
    }
    let body = match body {
        Ok(Json(body)) => body,
        Err(rejection) => return rejected(rejection.status(), rejection.body_text()),
    };
    match vars.put(path, body.items).await {
        Ok(variable) => Json(variable).into_response(),
        Err(error) => error.into_response(),
    }
}

async fn delete_var<V: VariableService>(
    State(vars): State<Arc<V>>,
    Path(path): Path<String>,
) -> Response {
    if let Some(refused) = vars.unavailable() {
        return refused.into_response();
    }
    match vars.delete(path.clone()).await {
        Ok(true) => StatusCode::NO_CONTENT.into_response(),
        Ok(false) => no_variable(&path).into_response(),
        Err(error) => error.into_response(),
    }
}

/// What a sync answers: whether the copy was taken, and the fleet's index the worker holds.
#[derive(Debug, Clone, serde::Serialize, Deserialize)]
pub struct Synced {
    /// Whether the copy replaced the set (not when it held that copy or a later one).
    pub taken: bool,
    /// The fleet's index of the set the worker now holds.
    pub source_index: Option<u64>,
}

async fn sync_vars<V: VariableService>(
    State(vars): State<Arc<V>>,
    body: Result<Json<VariableSync>, axum::extract::rejection::JsonRejection>,
) -> Response {
    match body {
        Ok(Json(sync)) => match vars.sync(sync).await {
            Ok(synced) => Json(synced).into_response(),
            Err(error) => error.into_response(),
        },
        Err(rejection) => rejected(rejection.status(), rejection.body_text()),
    }
}

/// The query of a list.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct ListQuery {
    #[serde(default)]
    prefix: String,
}

async fn list_vars<V: VariableService>(
    State(vars): State<Arc<V>>,
    query: Result<Query<ListQuery>, axum::extract::rejection::QueryRejection>,
) -> Response {
    if let Some(refused) = vars.unavailable() {
        return refused.into_response();
    }
    match query {
        Ok(Query(query)) => Json(vars.list(&query.prefix)).into_response(),
        Err(rejection) => rejected(rejection.status(), rejection.body_text()),
    }
}
