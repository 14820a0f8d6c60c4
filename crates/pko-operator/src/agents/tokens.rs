//! The operator's credentials towards workspace agents (PKO §2.2): agents in pods run `--auth kube` and accept a
//! bearer token of a service account that may `use` the Workspace's `workspaces/rpc` subresource, issued for the
//! audience `<workspace>.<namespace>`. The operator asks the API server for such tokens for its own service account
//! (TokenRequest, `serviceaccounts/token create` on itself) and keeps each until 5 minutes before it expires.

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use k8s_openapi::api::authentication::v1::{TokenRequest, TokenRequestSpec};
use k8s_openapi::api::core::v1::ServiceAccount;
use kube::api::{Api, PostParams};

/// Lifetime asked for each token (seconds).
pub const TOKEN_LIFETIME_SECONDS: i64 = 3600;
/// A cached token is renewed this long before it expires.
pub const RENEW_BEFORE: Duration = Duration::from_secs(300);

/// Tokens of one service account, per audience.
pub struct AgentTokens {
    client: kube::Client,
    namespace: String,
    service_account: String,
    cache: Mutex<HashMap<String, (String, Instant)>>,
}

impl std::fmt::Debug for AgentTokens {
    /// Names the service account; never shows a token.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("AgentTokens")
            .field("service_account", &format!("{}/{}", self.namespace, self.service_account))
            .finish()
    }
}

impl AgentTokens {
    /// Tokens of the service account `namespace/service_account` (normally the operator's own).
    pub fn new(client: kube::Client, namespace: impl Into<String>, service_account: impl Into<String>) -> Self {
        Self { client, namespace: namespace.into(), service_account: service_account.into(), cache: Mutex::default() }
    }

    /// A token for `audience`, from the cache while it has more than [`RENEW_BEFORE`] left. Errors: the TokenRequest
    /// failed (e.g. 403 without `serviceaccounts/token create`, 404 for a missing account).
    pub async fn token(&self, audience: &str) -> Result<String, kube::Error> {
        if let Some((t, expires)) = self.cache.lock().unwrap_or_else(std::sync::PoisonError::into_inner).get(audience)
            && *expires > Instant::now() + RENEW_BEFORE
        {
            return Ok(t.clone());
        }
        let req = TokenRequest {
            spec: TokenRequestSpec {
                audiences: vec![audience.to_string()],
                expiration_seconds: Some(TOKEN_LIFETIME_SECONDS),
                ..Default::default()
            },
            ..Default::default()
        };
        let issued = Api::<ServiceAccount>::namespaced(self.client.clone(), &self.namespace)
            .create_token_request(&self.service_account, &PostParams::default(), &req)
            .await?;
        let token = issued.status.map(|s| s.token).unwrap_or_default();
        let expires = Instant::now() + Duration::from_secs(TOKEN_LIFETIME_SECONDS as u64);
        self.cache
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .insert(audience.to_string(), (token.clone(), expires));
        Ok(token)
    }
}
