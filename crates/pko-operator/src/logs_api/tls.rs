//! The aggregated API's TLS: its serving certificate (`--logs-api-cert-dir`, else self-signed at start, as
//! metrics-server's; the chart's APIService then skips verifying it, as metrics-server's does) and the client
//! certificates it takes as the API server's front proxy (signed by the CA the API server publishes, verified by
//! rustls; a connection without one is taken too, and must bring a bearer token).

use std::sync::Arc;

use anyhow::Context as _;
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};

use super::caller::{AUTHENTICATION_CONFIG_MAP, FrontProxy};

/// The front proxy's settings the API server publishes; `None` when it publishes none (no aggregation layer) or its
/// ConfigMap cannot be read (then the API takes bearer tokens only, and says so in the log).
pub async fn front_proxy(client: &kube::Client) -> Option<FrontProxy> {
    let (ns, name) = AUTHENTICATION_CONFIG_MAP;
    let api = kube::Api::<k8s_openapi::api::core::v1::ConfigMap>::namespaced(client.clone(), ns);
    match api.get_opt(name).await {
        Ok(Some(cm)) => match FrontProxy::from_config_map(&cm.data.unwrap_or_default()) {
            Ok(proxy) => proxy,
            Err(e) => {
                tracing::warn!(error = %e, "ConfigMap {ns}/{name}: front proxy settings not understood; tokens only");
                None
            }
        },
        Ok(None) => None,
        Err(e) => {
            tracing::warn!(error = %e, "ConfigMap {ns}/{name} not readable (RBAC: the chart binds \
                extension-apiserver-authentication-reader); the logs API takes bearer tokens only");
            None
        }
    }
}

/// The serving certificate chain and key: `dir`'s `tls.crt` and `tls.key`, else a self-signed certificate for
/// `localhost` and `names`.
///
/// Errors: unreadable or malformed files, or certificate generation.
pub fn serving_certificate(
    dir: Option<&std::path::Path>,
    names: Vec<String>,
) -> anyhow::Result<(Vec<CertificateDer<'static>>, PrivateKeyDer<'static>)> {
    let (cert, key) = match dir {
        Some(d) => (
            std::fs::read(d.join("tls.crt")).with_context(|| format!("reading {}/tls.crt", d.display()))?,
            std::fs::read(d.join("tls.key")).with_context(|| format!("reading {}/tls.key", d.display()))?,
        ),
        None => {
            let mut sans = vec!["localhost".to_string()];
            sans.extend(names);
            let c = rcgen::generate_simple_self_signed(sans).context("making the logs API certificate")?;
            (c.cert.pem().into_bytes(), c.signing_key.serialize_pem().into_bytes())
        }
    };
    let chain = CertificateDer::pem_slice_iter(&cert)
        .collect::<Result<Vec<_>, _>>()
        .context("the logs API certificate is not PEM")?;
    let key = PrivateKeyDer::from_pem_slice(&key).context("the logs API key is not PEM")?;
    Ok((chain, key))
}

/// The server configuration: `chain` and `key` served, client certificates signed by `proxy`'s CA verified when
/// offered (none required), HTTP/2 and HTTP/1.1.
///
/// Errors: a front proxy CA that holds no usable certificate, or a key that does not match.
pub fn server_config(
    chain: Vec<CertificateDer<'static>>,
    key: PrivateKeyDer<'static>,
    proxy: Option<&FrontProxy>,
) -> anyhow::Result<Arc<rustls::ServerConfig>> {
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let builder =
        rustls::ServerConfig::builder_with_provider(provider.clone()).with_safe_default_protocol_versions()?;
    let builder = match proxy {
        None => builder.with_no_client_auth(),
        Some(p) => {
            let mut roots = rustls::RootCertStore::empty();
            for c in CertificateDer::pem_slice_iter(p.ca_pem.as_bytes()) {
                roots.add(c.context("requestheader-client-ca-file is not PEM")?)?;
            }
            let verifier = rustls::server::WebPkiClientVerifier::builder_with_provider(Arc::new(roots), provider)
                .allow_unauthenticated()
                .build()
                .context("the front proxy CA")?;
            builder.with_client_cert_verifier(verifier)
        }
    };
    let mut config = builder.with_single_cert(chain, key).context("the logs API certificate and key")?;
    config.alpn_protocols = vec![b"h2".to_vec(), b"http/1.1".to_vec()];
    Ok(Arc::new(config))
}
