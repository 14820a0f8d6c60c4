//! State shared by the controllers.

use std::sync::Arc;

use crate::ownership::Ownership;

/// What every reconcile gets.
#[derive(Clone)]
pub struct Context {
    /// Client of the API server.
    pub client: kube::Client,
    /// `host:port` under which the artifact server is reachable by agents (PKO
    /// `--program-fs-adv-addr`).
    pub advertised_addr: String,
    /// Which objects this replica may act on.
    pub ownership: Arc<dyn Ownership>,
}

impl std::fmt::Debug for Context {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Context").field("advertised_addr", &self.advertised_addr).field("ownership", &self.ownership).finish()
    }
}
