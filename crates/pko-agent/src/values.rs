//! Resolution of [`ValueRef`]s: literals, the agent's own environment and files, and keys of Secrets and ConfigMaps
//! read in the agent's namespace with the agent's own service account.

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::{ConfigMap, Secret};
use kube::Api;
use pko_proto::v1::{ValueRef, value_ref::Kind};

/// Resolves value references.
#[derive(Clone)]
pub struct ValueResolver {
    client: Option<kube::Client>,
    namespace: String,
}

impl std::fmt::Debug for ValueResolver {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ValueResolver")
            .field("namespace", &self.namespace)
            .field("kube", &self.client.is_some())
            .finish()
    }
}

impl ValueResolver {
    /// A resolver reading Secrets and ConfigMaps in `namespace` through `client` (none: such references fail with a
    /// clear error).
    pub fn new(client: Option<kube::Client>, namespace: impl Into<String>) -> Self {
        Self { client, namespace: namespace.into() }
    }

    /// The value of `r`. Errors name what could not be read (never the value).
    pub async fn resolve(&self, r: &ValueRef) -> Result<String, String> {
        match &r.kind {
            None => Err("empty value reference".into()),
            Some(Kind::Literal(v)) => Ok(v.clone()),
            Some(Kind::Env(name)) => {
                std::env::var(name).map_err(|_| format!("environment variable {name} is not set on the agent"))
            }
            Some(Kind::Path(path)) => std::fs::read_to_string(path).map_err(|e| format!("reading {path}: {e}")),
            Some(Kind::Secret(k)) => {
                let client =
                    self.client.clone().ok_or("secret references need the agent to run with Kubernetes access")?;
                let s = Api::<Secret>::namespaced(client, &self.namespace)
                    .get(&k.name)
                    .await
                    .map_err(|e| format!("reading Secret {}/{}: {}", self.namespace, k.name, short(&e)))?;
                let data: BTreeMap<_, _> = s.data.unwrap_or_default();
                let v = data
                    .get(&k.key)
                    .ok_or_else(|| format!("Secret {}/{} has no key {:?}", self.namespace, k.name, k.key))?;
                String::from_utf8(v.0.clone())
                    .map_err(|_| format!("Secret {}/{} key {:?} is not UTF-8", self.namespace, k.name, k.key))
            }
            Some(Kind::ConfigMap(k)) => {
                let client =
                    self.client.clone().ok_or("ConfigMap references need the agent to run with Kubernetes access")?;
                let cm = Api::<ConfigMap>::namespaced(client, &self.namespace)
                    .get(&k.name)
                    .await
                    .map_err(|e| format!("reading ConfigMap {}/{}: {}", self.namespace, k.name, short(&e)))?;
                cm.data
                    .unwrap_or_default()
                    .get(&k.key)
                    .cloned()
                    .ok_or_else(|| format!("ConfigMap {}/{} has no key {:?}", self.namespace, k.name, k.key))
            }
        }
    }
}

fn short(e: &kube::Error) -> String {
    match e {
        kube::Error::Api(s) => format!("{} ({})", s.message, s.code),
        other => other.to_string(),
    }
}
