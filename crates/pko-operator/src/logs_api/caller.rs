//! Who is asking, as every extension API server decides it (Kubernetes' delegated authentication,
//! `k8s.io/apiserver/pkg/authentication/request/headerrequest`): a request on a TLS connection whose client certificate
//! the front proxy CA signed, with a common name among the allowed ones (any, when none are listed), comes from the
//! API server, which already authenticated the user and names them in its request headers (`X-Remote-User`,
//! `X-Remote-Group`, `X-Remote-Extra-<key>`, or the names the ConfigMap lists); any other request must bring a bearer
//! token (TokenReview). The settings are the API server's own, published in ConfigMap
//! `kube-system/extension-apiserver-authentication`. Pure.

use std::collections::BTreeMap;

use axum::http::HeaderMap;
use k8s_openapi::api::authentication::v1::UserInfo;

/// The ConfigMap where the API server publishes its front proxy settings (Kubernetes convention).
pub const AUTHENTICATION_CONFIG_MAP: (&str, &str) = ("kube-system", "extension-apiserver-authentication");

/// The front proxy's settings (`--requestheader-*` flags of kube-apiserver).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct FrontProxy {
    /// PEM of the CA that signs the front proxy's client certificate (`requestheader-client-ca-file`).
    pub ca_pem: String,
    /// Common names the front proxy's certificate may have; empty: any the CA signed (`requestheader-allowed-names`).
    pub allowed_names: Vec<String>,
    /// Headers naming the user, first present wins (`requestheader-username-headers`).
    pub user_headers: Vec<String>,
    /// Headers naming the user's groups, every value of each (`requestheader-group-headers`).
    pub group_headers: Vec<String>,
    /// Prefixes of headers carrying the user's extra attributes (`requestheader-extra-headers-prefix`).
    pub extra_prefixes: Vec<String>,
}

/// Why a request is not taken as the front proxy's.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Refusal {
    /// The certificate's common name is not among the allowed ones.
    #[error("client certificate {0:?} is not an allowed front proxy (requestheader-allowed-names)")]
    NotAllowed(String),
    /// No header names the user.
    #[error("the front proxy named no user (requestheader-username-headers)")]
    NoUser,
}

impl FrontProxy {
    /// The settings in the ConfigMap's `data`; `None` when it has no front proxy CA (the API server runs without an
    /// aggregation layer: only bearer tokens are taken).
    ///
    /// Errors: a list that is not a JSON array of strings, named by its key.
    pub fn from_config_map(data: &BTreeMap<String, String>) -> Result<Option<Self>, String> {
        let Some(ca_pem) = data.get("requestheader-client-ca-file").filter(|c| !c.trim().is_empty()) else {
            return Ok(None);
        };
        let list = |key: &str| -> Result<Vec<String>, String> {
            data.get(key).map_or(Ok(vec![]), |v| serde_json::from_str(v).map_err(|e| format!("{key}: {e}")))
        };
        Ok(Some(FrontProxy {
            ca_pem: ca_pem.clone(),
            allowed_names: list("requestheader-allowed-names")?,
            user_headers: list("requestheader-username-headers")?,
            group_headers: list("requestheader-group-headers")?,
            extra_prefixes: list("requestheader-extra-headers-prefix")?,
        }))
    }

    /// The user the API server asks for, from `headers`, on a connection whose verified client certificate has common
    /// name `common_name`.
    ///
    /// Errors: [`Refusal::NotAllowed`], [`Refusal::NoUser`].
    pub fn user(&self, common_name: &str, headers: &HeaderMap) -> Result<UserInfo, Refusal> {
        if !self.allowed_names.is_empty() && !self.allowed_names.iter().any(|n| n == common_name) {
            return Err(Refusal::NotAllowed(common_name.to_string()));
        }
        let value = |h: &axum::http::HeaderValue| h.to_str().ok().map(str::to_string);
        let username = self
            .user_headers
            .iter()
            .find_map(|h| headers.get(h.as_str()).and_then(value))
            .filter(|u| !u.is_empty())
            .ok_or(Refusal::NoUser)?;
        let groups: Vec<String> =
            self.group_headers.iter().flat_map(|h| headers.get_all(h.as_str()).iter().filter_map(value)).collect();
        let mut extra: BTreeMap<String, Vec<String>> = BTreeMap::new();
        for (name, v) in headers {
            let lower = name.as_str();
            let Some(key) = self.extra_prefixes.iter().find_map(|p| lower.strip_prefix(&p.to_ascii_lowercase()[..]))
            else {
                continue;
            };
            if let Some(v) = value(v) {
                extra.entry(unescape(key)).or_default().push(v);
            }
        }
        Ok(UserInfo {
            username: Some(username),
            groups: (!groups.is_empty()).then_some(groups),
            extra: (!extra.is_empty()).then_some(extra),
            uid: None,
        })
    }
}

/// An extra key as the front proxy escaped it into a header name (percent-encoded, lower case: Kubernetes'
/// `unescapeExtraKey`).
fn unescape(key: &str) -> String {
    let bytes = key.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        let hex = bytes.get(i + 1..i + 3).and_then(|h| std::str::from_utf8(h).ok());
        match (bytes[i], hex.and_then(|h| u8::from_str_radix(h, 16).ok())) {
            (b'%', Some(b)) => {
                out.push(b);
                i += 3;
            }
            (b, _) => {
                out.push(b);
                i += 1;
            }
        }
    }
    String::from_utf8_lossy(&out).into_owned()
}

/// The subject common name of a DER certificate; `None` when it does not parse or has none.
pub fn common_name(der: &[u8]) -> Option<String> {
    let (_, cert) = x509_parser::parse_x509_certificate(der).ok()?;
    let cn = cert.subject().iter_common_name().next()?.as_str().ok()?.to_string();
    Some(cn)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn proxy() -> FrontProxy {
        let data: BTreeMap<String, String> = [
            ("requestheader-client-ca-file", "-----BEGIN CERTIFICATE-----\n"),
            ("requestheader-allowed-names", r#"["front-proxy-client"]"#),
            ("requestheader-username-headers", r#"["X-Remote-User"]"#),
            ("requestheader-group-headers", r#"["X-Remote-Group"]"#),
            ("requestheader-extra-headers-prefix", r#"["X-Remote-Extra-"]"#),
        ]
        .into_iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect();
        FrontProxy::from_config_map(&data).unwrap().unwrap()
    }

    fn headers(pairs: &[(&str, &str)]) -> HeaderMap {
        let mut h = HeaderMap::new();
        for (k, v) in pairs {
            h.append(axum::http::HeaderName::from_bytes(k.as_bytes()).unwrap(), v.parse().unwrap());
        }
        h
    }

    #[test]
    fn the_front_proxy_names_the_user_its_groups_and_extras() {
        let h = headers(&[
            ("x-remote-user", "alice"),
            ("x-remote-group", "dev"),
            ("x-remote-group", "system:authenticated"),
            ("x-remote-extra-scopes", "a"),
            ("x-remote-extra-acme.com%2fproject", "p1"),
        ]);
        let u = proxy().user("front-proxy-client", &h).unwrap();
        assert_eq!(u.username.as_deref(), Some("alice"));
        assert_eq!(u.groups.unwrap(), ["dev", "system:authenticated"]);
        let extra = u.extra.unwrap();
        assert_eq!(extra["scopes"], ["a"]);
        assert_eq!(extra["acme.com/project"], ["p1"]);
    }

    #[test]
    fn another_certificate_or_no_user_is_refused_and_no_ca_means_tokens_only() {
        let h = headers(&[("x-remote-user", "alice")]);
        assert_eq!(proxy().user("someone-else", &h), Err(Refusal::NotAllowed("someone-else".into())));
        assert_eq!(proxy().user("front-proxy-client", &headers(&[])), Err(Refusal::NoUser));
        assert_eq!(FrontProxy::from_config_map(&BTreeMap::new()), Ok(None));
        let bad: BTreeMap<String, String> =
            [("requestheader-client-ca-file", "x"), ("requestheader-allowed-names", "[1")]
                .into_iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect();
        assert!(FrontProxy::from_config_map(&bad).unwrap_err().starts_with("requestheader-allowed-names"));
    }

    #[test]
    fn a_common_name_is_read_from_a_certificate() {
        let mut params = rcgen::CertificateParams::new(vec!["x".into()]).unwrap();
        params.distinguished_name.push(rcgen::DnType::CommonName, "front-proxy-client");
        let key = rcgen::KeyPair::generate().unwrap();
        let cert = params.self_signed(&key).unwrap();
        assert_eq!(common_name(cert.der()).as_deref(), Some("front-proxy-client"));
        assert_eq!(common_name(b"not a certificate"), None);
    }
}
