//! Caller authentication (PKO's `--auth-mode kube`): the bearer token is checked with a TokenReview for the workspace's
//! audience, then a SubjectAccessReview for verb `use` on `workspaces/rpc` of the workspace (group `auto.pulumi.com`).
//! Decisions are cached per token: allow 5 minutes, deny 5 seconds.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use k8s_openapi::api::authentication::v1::{TokenReview, TokenReviewSpec};
use k8s_openapi::api::authorization::v1::{ResourceAttributes, SubjectAccessReview, SubjectAccessReviewSpec};
use kube::Api;
use kube::api::PostParams;
use tonic::Status;

/// How long an allow decision is cached.
pub const ALLOW_TTL: Duration = Duration::from_secs(300);
/// How long a deny decision is cached.
pub const DENY_TTL: Duration = Duration::from_secs(5);

/// Who may call the agent.
#[derive(Clone)]
pub enum Auth {
    /// Anyone (only allowed when the agent listens on loopback).
    None,
    /// Kubernetes TokenReview + SubjectAccessReview.
    Kube(Arc<KubeAuth>),
}

impl std::fmt::Debug for Auth {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Auth::None => f.write_str("Auth::None"),
            Auth::Kube(k) => write!(f, "Auth::Kube({}/{}, audience {})", k.namespace, k.workspace, k.audience),
        }
    }
}

/// A cached decision and when it expires.
type CachedDecision = (Result<(), Status>, Instant);

/// Settings and cache of kube authentication.
pub struct KubeAuth {
    client: kube::Client,
    audience: String,
    namespace: String,
    workspace: String,
    cache: Mutex<HashMap<String, CachedDecision>>,
}

impl KubeAuth {
    /// Authentication for workspace `namespace/workspace`, accepting tokens for `audience`.
    pub fn new(client: kube::Client, audience: String, namespace: String, workspace: String) -> Self {
        Self { client, audience, namespace, workspace, cache: Mutex::default() }
    }
}

impl Auth {
    /// Checks the `authorization: Bearer <token>` metadata of a request.
    ///
    /// Errors: `UNAUTHENTICATED` (no or invalid token, or the workspace's service account may not review tokens: it
    /// lacks `system:auth-delegator`), `PERMISSION_DENIED` (not allowed to `use` `workspaces/rpc` of this workspace),
    /// `UNAVAILABLE` (the API server could not be asked).
    pub async fn check(&self, md: &tonic::metadata::MetadataMap) -> Result<(), Status> {
        let Auth::Kube(k) = self else { return Ok(()) };
        let token = md
            .get("authorization")
            .and_then(|v| v.to_str().ok())
            .and_then(|v| v.strip_prefix("Bearer ").or_else(|| v.strip_prefix("bearer ")))
            .map(str::trim)
            .filter(|t| !t.is_empty())
            .ok_or_else(|| Status::unauthenticated("a bearer token is required (authorization: Bearer <token>)"))?
            .to_string();
        if let Some((decision, until)) =
            k.cache.lock().unwrap_or_else(std::sync::PoisonError::into_inner).get(&token).cloned()
            && Instant::now() < until
        {
            return decision;
        }
        let decision = k.decide(&token).await;
        if let Err(s) = &decision
            && s.code() == tonic::Code::Unavailable
        {
            return decision; // never cache an outage
        }
        let ttl = if decision.is_ok() { ALLOW_TTL } else { DENY_TTL };
        let mut cache = k.cache.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        cache.retain(|_, (_, until)| Instant::now() < *until);
        cache.insert(token, (decision.clone(), Instant::now() + ttl));
        decision
    }
}

/// The status of a review (`kind`: `TokenReview` or `SubjectAccessReview`) the API server did not answer: forbidden
/// (403), the workspace's service account lacks `system:auth-delegator` — a setup error, `UNAUTHENTICATED` as PKO's
/// agent says, naming the fix; anything else is an outage, `UNAVAILABLE` (retried, never cached).
fn review_failed(kind: &str, e: kube::Error) -> Status {
    match e {
        kube::Error::Api(ae) if ae.code == 403 => Status::unauthenticated(format!(
            "{kind} forbidden: the workspace's service account may not review tokens; bind it to the ClusterRole \
                system:auth-delegator ({})",
            ae.message
        )),
        e => Status::unavailable(format!("{kind} failed: {e}")),
    }
}

impl KubeAuth {
    async fn decide(&self, token: &str) -> Result<(), Status> {
        let review = TokenReview {
            spec: TokenReviewSpec { token: Some(token.to_string()), audiences: Some(vec![self.audience.clone()]) },
            ..Default::default()
        };
        let review = Api::<TokenReview>::all(self.client.clone())
            .create(&PostParams::default(), &review)
            .await
            .map_err(|e| review_failed("TokenReview", e))?;
        let status = review.status.unwrap_or_default();
        if status.authenticated != Some(true) {
            let why = status.error.unwrap_or_else(|| "token not authenticated".into());
            return Err(Status::unauthenticated(format!("invalid token for audience {}: {why}", self.audience)));
        }
        let user = status.user.unwrap_or_default();
        let sar = SubjectAccessReview {
            spec: SubjectAccessReviewSpec {
                user: user.username.clone(),
                groups: user.groups.clone(),
                uid: user.uid.clone(),
                extra: user.extra.clone(),
                resource_attributes: Some(ResourceAttributes {
                    group: Some("auto.pulumi.com".into()),
                    version: Some("v1alpha1".into()),
                    resource: Some("workspaces".into()),
                    subresource: Some("rpc".into()),
                    verb: Some("use".into()),
                    name: Some(self.workspace.clone()),
                    namespace: Some(self.namespace.clone()),
                    ..Default::default()
                }),
                ..Default::default()
            },
            ..Default::default()
        };
        let sar = Api::<SubjectAccessReview>::all(self.client.clone())
            .create(&PostParams::default(), &sar)
            .await
            .map_err(|e| review_failed("SubjectAccessReview", e))?;
        if sar.status.as_ref().is_some_and(|s| s.allowed) {
            Ok(())
        } else {
            Err(Status::permission_denied(format!(
                "{} may not use workspaces/rpc of {}/{}",
                user.username.unwrap_or_default(),
                self.namespace,
                self.workspace
            )))
        }
    }
}
