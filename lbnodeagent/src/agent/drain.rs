//! `lbnodeagent drain` and `undrain`, from the host, for operators
//! without kubectl: the node's NodeAgent `spec.drain` is written with the
//! agent's own credential (which may write this node's record and no
//! other), then the local agent's `/status` shows the VIPs leave (see
//! [`crate::drain`]).

use std::time::Duration;

use super::config::AgentConfig;
use super::start::kube_client;
use crate::drain::Outcome;

#[derive(Debug, thiserror::Error)]
pub enum DrainError {
    #[error(transparent)]
    Agent(#[from] super::AgentError),
    #[error(transparent)]
    Write(#[from] crate::drain::WriteError),
    #[error("cannot read the local agent's status: {0}")]
    Status(String),
}

/// Writes this node's `spec.drain` (`false` removes it).
pub async fn set(cfg: &AgentConfig, drain: bool) -> Result<(), DrainError> {
    let (client, _) = kube_client(cfg).await?;
    Ok(crate::drain::write(&client, &cfg.node_name, drain).await?)
}

/// Follows the drain through the local agent's `/status` (see
/// [`crate::drain::follow`]).
pub async fn follow(cfg: &AgentConfig, timeout: Duration) -> Result<Outcome, DrainError> {
    let listen = cfg.http_listen;
    crate::drain::follow(
        &cfg.node_name,
        timeout,
        Duration::from_millis(200),
        || async move {
            let doc = tokio::task::spawn_blocking(move || super::status::fetch(listen))
                .await
                .map_err(|e| DrainError::Status(e.to_string()))?
                .map_err(DrainError::Status)?;
            Ok(super::status::drain_snapshot(&doc))
        },
    )
    .await
}
