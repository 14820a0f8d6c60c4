//! Who may read what the operator serves besides the CRDs: callers authenticated by a TokenReview of their bearer token
//! (or, on the aggregated API, by the API server's front proxy: `crate::logs_api::caller`) and authorized by a
//! SubjectAccessReview of `get` on what is asked (an [`Access`]) — `/metrics` (controller-runtime's metrics
//! authorization, PKO `--metrics-secure`), a Stack's operation output on the metrics port (`crate::logs`) and the
//! `log` subresources of `logs.pulumi.com` (`crate::logs_api`).

use std::sync::Arc;

/// The operator's aggregated API group (`crate::logs_api`; distinct from `pulumi.com`, whose kinds are CRDs).
pub const LOGS_GROUP: &str = "logs.pulumi.com";
/// Its version.
pub const LOGS_VERSION: &str = "v1alpha1";

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
    /// The `log` subresource of `resource` (`stacks` or `updates`) `name` of namespace `namespace` in the aggregated
    /// API group `logs.pulumi.com` (`crate::logs_api`).
    Log {
        /// `stacks` or `updates`.
        resource: String,
        /// The object's namespace.
        namespace: String,
        /// The object's name.
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
            Access::Log { resource, namespace, name } => (
                None,
                Some(ResourceAttributes {
                    group: Some(LOGS_GROUP.into()),
                    version: Some(LOGS_VERSION.into()),
                    resource: Some(resource.clone()),
                    subresource: Some("log".into()),
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
/// [`Access`]) of callers, with answers cached (allowed or authenticated: 60 s, refused: 5 s; an API server that
/// did not answer: not cached).
pub struct Authz {
    client: kube::Client,
    tokens: Cache<String, Result<UserInfo, StatusCode>>,
    decisions: Cache<(String, Access), StatusCode>,
}

type UserInfo = k8s_openapi::api::authentication::v1::UserInfo;
type StatusCode = axum::http::StatusCode;

/// Answers kept until their instant.
struct Cache<K, V>(std::sync::Mutex<std::collections::HashMap<K, (V, std::time::Instant)>>);

impl<K: std::hash::Hash + Eq, V: Clone> Cache<K, V> {
    fn get(&self, key: &K) -> Option<V> {
        let c = self.0.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        c.get(key).filter(|(_, until)| std::time::Instant::now() < *until).map(|(v, _)| v.clone())
    }

    fn put(&self, key: K, value: V, allowed: bool) {
        let now = std::time::Instant::now();
        let ttl = std::time::Duration::from_secs(if allowed { 60 } else { 5 });
        let mut c = self.0.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        c.retain(|_, (_, until)| *until > now);
        c.insert(key, (value, now + ttl));
    }
}

impl<K, V> Default for Cache<K, V> {
    fn default() -> Self {
        Cache(Default::default())
    }
}

impl Authz {
    /// Checks callers with `client`'s API server.
    pub fn new(client: kube::Client) -> Arc<Self> {
        Arc::new(Self { client, tokens: Cache::default(), decisions: Cache::default() })
    }

    /// `200 OK` when the token may `get` `access`, `401` when it is missing or not authenticated, `403` when it is not
    /// allowed, `503` when the API server could not be asked.
    pub async fn decide(&self, token: Option<&str>, access: &Access) -> StatusCode {
        match self.authenticate(token).await {
            Ok(user) => self.authorize(&user, access).await,
            Err(code) => code,
        }
    }

    /// The user a bearer token belongs to (TokenReview).
    ///
    /// Errors: `401` for a missing or unauthenticated token, `503` when the API server did not answer.
    pub async fn authenticate(&self, token: Option<&str>) -> Result<UserInfo, StatusCode> {
        use k8s_openapi::api::authentication::v1::{TokenReview, TokenReviewSpec};
        let Some(token) = token.filter(|t| !t.is_empty()) else { return Err(StatusCode::UNAUTHORIZED) };
        if let Some(known) = self.tokens.get(&token.to_string()) {
            return known;
        }
        let review = TokenReview {
            spec: TokenReviewSpec { token: Some(token.to_string()), ..Default::default() },
            ..Default::default()
        };
        let answer = match kube::Api::<TokenReview>::all(self.client.clone()).create(&Default::default(), &review).await
        {
            Err(_) => return Err(StatusCode::SERVICE_UNAVAILABLE),
            Ok(r) => r.status.filter(|s| s.authenticated == Some(true)).and_then(|s| s.user),
        };
        let answer = answer.ok_or(StatusCode::UNAUTHORIZED);
        self.tokens.put(token.to_string(), answer.clone(), answer.is_ok());
        answer
    }

    /// `200 OK` when `user` may `get` `access` (SubjectAccessReview), `403` when not, `503` when the API server did
    /// not answer.
    pub async fn authorize(&self, user: &UserInfo, access: &Access) -> StatusCode {
        use k8s_openapi::api::authorization::v1::SubjectAccessReview;
        let key = (serde_json::to_string(user).unwrap_or_default(), access.clone());
        if let Some(code) = self.decisions.get(&key) {
            return code;
        }
        let code = match kube::Api::<SubjectAccessReview>::all(self.client.clone())
            .create(&Default::default(), &access.review(user.clone()))
            .await
        {
            Err(_) => return StatusCode::SERVICE_UNAVAILABLE,
            Ok(r) if r.status.as_ref().is_some_and(|s| s.allowed) => StatusCode::OK,
            Ok(_) => StatusCode::FORBIDDEN,
        };
        self.decisions.put(key, code, code == StatusCode::OK);
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
