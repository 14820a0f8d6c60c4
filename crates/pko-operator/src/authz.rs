//! Who may read what the operator serves besides the API: bearer tokens authenticated by a TokenReview and authorized
//! by a SubjectAccessReview of `get` on what is asked (an [`Access`]) — `/metrics` (controller-runtime's metrics
//! authorization, PKO `--metrics-secure`) and a Stack's operation output (`crate::logs`).

use std::sync::Arc;

/// What a caller asks to `get`, authorized by a SubjectAccessReview.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum Access {
    /// The non-resource URL `/metrics` (controller-runtime's metrics authorization).
    Metrics,
    /// Stack `name` of namespace `namespace` (`pulumi.com`, `stacks`): its operations' output.
    Stack {
        /// The Stack's namespace.
        namespace: String,
        /// The Stack's name.
        name: String,
    },
}

impl Access {
    /// The SubjectAccessReview attributes of `get` on this.
    fn review(
        &self,
        user: k8s_openapi::api::authentication::v1::UserInfo,
    ) -> k8s_openapi::api::authorization::v1::SubjectAccessReview {
        use k8s_openapi::api::authorization::v1::{
            NonResourceAttributes, ResourceAttributes, SubjectAccessReview, SubjectAccessReviewSpec,
        };
        let (non_resource, resource) = match self {
            Access::Metrics => {
                (Some(NonResourceAttributes { path: Some("/metrics".into()), verb: Some("get".into()) }), None)
            }
            Access::Stack { namespace, name } => (
                None,
                Some(ResourceAttributes {
                    group: Some("pulumi.com".into()),
                    resource: Some("stacks".into()),
                    namespace: Some(namespace.clone()),
                    name: Some(name.clone()),
                    verb: Some("get".into()),
                    ..Default::default()
                }),
            ),
        };
        let spec = SubjectAccessReviewSpec {
            user: user.username,
            groups: user.groups,
            uid: user.uid,
            extra: user.extra,
            non_resource_attributes: non_resource,
            resource_attributes: resource,
        };
        SubjectAccessReview { spec, ..Default::default() }
    }
}

/// Bearer-token authentication (TokenReview) and authorization (SubjectAccessReview: `get` on what is asked, an
/// [`Access`]) of callers, with decisions cached per token and access (allowed: 60 s, refused: 5 s).
pub struct Authz {
    client: kube::Client,
    cache: std::sync::Mutex<std::collections::HashMap<(String, Access), (axum::http::StatusCode, std::time::Instant)>>,
}

impl Authz {
    /// Checks tokens with `client`'s API server.
    pub fn new(client: kube::Client) -> Arc<Self> {
        Arc::new(Self { client, cache: Default::default() })
    }

    /// `200 OK` when the token may `get` `access`, `401` when it is missing or not authenticated, `403` when it is not
    /// allowed, `503` when the API server could not be asked.
    pub async fn decide(&self, token: Option<&str>, access: &Access) -> axum::http::StatusCode {
        use axum::http::StatusCode;
        use k8s_openapi::api::authentication::v1::{TokenReview, TokenReviewSpec};
        use k8s_openapi::api::authorization::v1::SubjectAccessReview;
        let Some(token) = token.filter(|t| !t.is_empty()) else { return StatusCode::UNAUTHORIZED };
        let key = (token.to_string(), access.clone());
        if let Some((code, until)) = self.cache.lock().ok().and_then(|c| c.get(&key).cloned())
            && std::time::Instant::now() < until
        {
            return code;
        }
        let pp = kube::api::PostParams::default();
        let review = TokenReview {
            spec: TokenReviewSpec { token: Some(token.to_string()), ..Default::default() },
            ..Default::default()
        };
        let code = match kube::Api::<TokenReview>::all(self.client.clone()).create(&pp, &review).await {
            Err(_) => return StatusCode::SERVICE_UNAVAILABLE,
            Ok(r) => match r.status.filter(|s| s.authenticated == Some(true)).and_then(|s| s.user) {
                None => StatusCode::UNAUTHORIZED,
                Some(user) => match kube::Api::<SubjectAccessReview>::all(self.client.clone())
                    .create(&pp, &access.review(user))
                    .await
                {
                    Err(_) => return StatusCode::SERVICE_UNAVAILABLE,
                    Ok(r) if r.status.as_ref().is_some_and(|s| s.allowed) => StatusCode::OK,
                    Ok(_) => StatusCode::FORBIDDEN,
                },
            },
        };
        let ttl = std::time::Duration::from_secs(if code == StatusCode::OK { 60 } else { 5 });
        if let Ok(mut c) = self.cache.lock() {
            c.retain(|_, (_, until)| *until > std::time::Instant::now());
            c.insert(key, (code, std::time::Instant::now() + ttl));
        }
        code
    }
}

/// The bearer token of `headers`' `Authorization`.
pub fn bearer(headers: &axum::http::HeaderMap) -> Option<&str> {
    headers
        .get(axum::http::header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.strip_prefix("Bearer ").or_else(|| v.strip_prefix("bearer ")))
        .map(str::trim)
}
