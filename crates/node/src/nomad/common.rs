//! What every Nomad route on the agent shares: the server's state, the index that blocking
//! queries wait on, and the agent's errors as Nomad's ([`crate::nomad_http`] has what the
//! fleet shares too).
//!
//! The index is a time in milliseconds: the latest change of any allocation (its last task
//! event) or job record. It only grows while nothing is removed, survives an agent restart,
//! and needs no counter of its own.

use crate::agent::{Agent, AgentError, POLL_INTERVAL};
use crate::nomad_http::registry::Registry;
use crate::nomad_http::{NomadApiError, NomadResult, NomadService, Params, block_until};
use axum::http::StatusCode;
use std::sync::Arc;

/// The Nomad API's state beside the agent.
#[derive(Debug)]
pub(crate) struct NomadServer {
    pub(crate) agent: Arc<Agent>,
    pub(crate) registry: Registry,
    /// The node's id, kept in the data directory so that it outlives restarts.
    pub(crate) node_id: String,
    /// One registration or stop at a time: each reads the record, places, then writes it.
    pub(crate) changing: tokio::sync::Mutex<()>,
}

pub(crate) type Shared = Arc<NomadServer>;

impl NomadServer {
    pub(crate) fn open(agent: Arc<Agent>) -> std::io::Result<NomadServer> {
        let data_dir = agent.config().data_dir.clone();
        let registry = Registry::open(&data_dir)?;
        let id_path = data_dir.join("nomad").join("node-id");
        let node_id = match std::fs::read_to_string(&id_path) {
            Ok(id) if !id.trim().is_empty() => id.trim().to_owned(),
            _ => {
                let id = crate::agent::new_alloc_id();
                std::fs::write(&id_path, &id)?;
                id
            }
        };
        Ok(NomadServer { agent, registry, node_id, changing: tokio::sync::Mutex::new(()) })
    }

    /// `host:port` the API is served on: the address the agent announced (its configured
    /// port may be 0), else the configured one.
    pub(crate) fn http_addr(&self) -> String {
        let data_dir = &self.agent.config().data_dir;
        match crate::agent_file::AgentFile::read(data_dir) {
            Ok(Some(file)) if file.pid == std::process::id() => {
                file.address.trim_start_matches("http://").to_owned()
            }
            _ => self.agent.config().bind.to_string(),
        }
    }

    /// The node's name: its host name, as Nomad's default.
    pub(crate) fn node_name(&self) -> String {
        std::fs::read_to_string("/proc/sys/kernel/hostname")
            .map(|name| name.trim().to_owned())
            .unwrap_or_else(|_| "wharf".to_owned())
    }

    /// The latest change the Nomad API can show, in milliseconds.
    pub(crate) fn index(&self) -> u64 {
        let mut latest = self.registry.last_change();
        for runner in self.agent.list() {
            let state = runner.subscribe();
            if let Some(changed) = wharf_nomad::shapes::last_change(&state.borrow()) {
                latest = latest.max(changed);
            }
        }
        latest.0.max(1)
    }
}

impl NomadService for NomadServer {
    fn token(&self) -> Option<&str> {
        self.agent.config().token.as_deref()
    }

    fn index(&self) -> u64 {
        NomadServer::index(self)
    }
}

impl From<AgentError> for NomadApiError {
    fn from(error: AgentError) -> NomadApiError {
        let status = match &error {
            AgentError::UnknownAlloc(_) => StatusCode::NOT_FOUND,
            AgentError::InvalidId(_) | AgentError::Spec(_) => StatusCode::BAD_REQUEST,
            AgentError::IdTaken(_) | AgentError::DoesNotFit(_) | AgentError::Ports(_) => {
                StatusCode::CONFLICT
            }
            AgentError::Alloc(wharf_alloc::AllocError::UnknownTask { .. }) => StatusCode::NOT_FOUND,
            AgentError::Alloc(_) => StatusCode::BAD_REQUEST,
            _ => StatusCode::INTERNAL_SERVER_ERROR,
        };
        NomadApiError::new(status, error.to_string())
    }
}

impl From<wharf_alloc::AllocError> for NomadApiError {
    fn from(error: wharf_alloc::AllocError) -> NomadApiError {
        AgentError::from(error).into()
    }
}

/// A blocking query on the agent, which has no change signal: the index is polled.
pub(crate) async fn block(server: &NomadServer, params: &Params) -> NomadResult<()> {
    block_until(params, POLL_INTERVAL, None, || server.index()).await
}
