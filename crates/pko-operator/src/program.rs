//! The Program controller: renders a Program into a `Pulumi.yaml` project, packs it as a gzipped tarball and publishes
//! a Flux-compatible `status.artifact` (PKO `program_controller.go`); the artifact server ([`crate::artifacts`]) serves
//! the same bytes at `status.artifact.url`.
//!
//! Rendering is deterministic (fixed mtime, owner and mode), so a tarball regenerated on request always matches the
//! published digest.

use std::sync::Arc;
use std::time::Duration;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use kube::api::Api;
use kube::runtime::controller::Action;
use kube::{Resource, ResourceExt};
use pko_api::program::{Artifact, ProgramStatus};
use pko_api::{Program, ProgramSpec};
use serde_json::{Value, json};

use crate::context::Context;

/// Field manager of Program status writes.
pub const STATUS_FIELD_MANAGER: &str = "pulumi-kubernetes-operator/program-status";

/// Errors of the Program controller, one per step.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// The Program could not be rendered to YAML.
    #[error("rendering program {0}: {1}")]
    Render(String, String),
    /// Writing the status failed.
    #[error("writing program status: {0}")]
    Status(#[source] kube::Error),
}

/// The `Pulumi.yaml` of a Program: `{name: <program name>, runtime: yaml, ...program}`.
pub fn render_yaml(name: &str, spec: &ProgramSpec) -> Result<String, Error> {
    let mut doc = serde_json::Map::new();
    doc.insert("name".into(), json!(name));
    doc.insert("runtime".into(), json!("yaml"));
    if let Value::Object(body) = serde_json::to_value(spec).map_err(|e| Error::Render(name.into(), e.to_string()))? {
        doc.extend(body);
    }
    serde_yaml_ng::to_string(&Value::Object(doc)).map_err(|e| Error::Render(name.into(), e.to_string()))
}

/// A gzipped tarball holding one file, `Pulumi.yaml` (mode 0775, mtime 0, uid/gid 0): byte-for-byte the same for the
/// same YAML.
pub fn pack(yaml: &str) -> Vec<u8> {
    let gz = flate2::GzBuilder::new().mtime(0).write(Vec::new(), flate2::Compression::default());
    let mut b = tar::Builder::new(gz);
    let mut h = tar::Header::new_gnu();
    h.set_size(yaml.len() as u64);
    h.set_mode(0o775);
    h.set_mtime(0);
    h.set_uid(0);
    h.set_gid(0);
    h.set_cksum();
    b.append_data(&mut h, "Pulumi.yaml", yaml.as_bytes()).expect("in-memory tar");
    b.into_inner().expect("in-memory tar").finish().expect("in-memory gzip")
}

/// `sha256:<hex>` of `bytes`.
pub fn digest(bytes: &[u8]) -> String {
    format!("sha256:{}", pko_api::hash::sha256_hex(bytes, 32))
}

/// The tarball of `program` at its current generation.
pub fn tarball(program: &Program) -> Result<Vec<u8>, Error> {
    let yaml = render_yaml(&program.name_any(), &program.spec.program.clone().unwrap_or_default())?;
    Ok(pack(&yaml))
}

/// The artifact `status.artifact` should hold for `program`, served from `advertised` (host:port). `last_update_time`
/// is kept from `previous` when the digest did not change.
pub fn desired_artifact(
    program: &Program,
    advertised: &str,
    previous: Option<&Artifact>,
    now: Time,
) -> Result<Artifact, Error> {
    let bytes = tarball(program)?;
    let ns = program.namespace().unwrap_or_default();
    let name = program.name_any();
    let generation = program.meta().generation.unwrap_or(0);
    let digest = digest(&bytes);
    let unchanged = previous.filter(|p| {
        p.digest.as_deref() == Some(digest.as_str()) && p.revision.as_deref() == Some(generation.to_string().as_str())
    });
    Ok(Artifact {
        path: format!("programs/{ns}/{name}/{generation}/{hex}.tar.gz", hex = digest.trim_start_matches("sha256:")),
        url: format!(
            "http://{advertised}/programs/{ns}/{name}/{generation}/{hex}.tar.gz",
            hex = digest.trim_start_matches("sha256:")
        ),
        revision: Some(generation.to_string()),
        digest: Some(digest),
        last_update_time: unchanged.map(|p| p.last_update_time.clone()).unwrap_or(now),
        size: Some(bytes.len() as i64),
        metadata: None,
    })
}

/// Reconciles one Program: publishes its artifact when it changed.
pub async fn reconcile(program: Arc<Program>, ctx: Arc<Context>) -> Result<Action, Error> {
    let ns = program.namespace().unwrap_or_default();
    let name = program.name_any();
    if !ctx.ownership.owns(&ns, &name) {
        return Ok(Action::await_change());
    }
    let status = program.status.clone().unwrap_or_default();
    let now = pko_api::conditions::now();
    let artifact = desired_artifact(&program, &ctx.advertised_addr, status.artifact.as_ref(), now)?;
    let generation = program.meta().generation;
    if status.artifact.as_ref() == Some(&artifact) && status.observed_generation == generation {
        return Ok(Action::await_change());
    }
    let status = ProgramStatus { observed_generation: generation, artifact: Some(artifact) };
    crate::k8s::apply_status(
        &Api::<Program>::namespaced(ctx.client.clone(), &ns),
        &name,
        STATUS_FIELD_MANAGER,
        &status,
    )
    .await
    .map_err(Error::Status)?;
    tracing::info!(program = %format!("{ns}/{name}"), generation, "published program artifact");
    Ok(Action::await_change())
}

/// The steps of a Program reconcile: `render`, `status`.
impl crate::k8s::ReconcileError for Error {
    fn step(&self) -> &'static str {
        match self {
            Error::Render(..) => "render",
            Error::Status(_) => "status",
        }
    }

    /// A Program that cannot be rendered waits for its next change.
    fn retry_after(&self) -> Option<Duration> {
        match self {
            Error::Render(..) => None,
            Error::Status(_) => Some(Duration::from_secs(5)),
        }
    }
}

/// The Program controller and its cache (which the artifact server reads), watching Programs through `informers`: run
/// the future until shutdown.
pub fn program_controller(
    ctx: std::sync::Arc<crate::context::Context>,
    informers: &mut crate::informer::Informers,
) -> (kube::runtime::reflector::Store<pko_api::Program>, impl std::future::Future<Output = ()> + Send + 'static) {
    let programs = informers.programs();
    let store = programs.store();
    let mut controller = kube::runtime::Controller::for_stream(programs.objects(), store.clone());
    if let Some(ticks) = ctx.shards_gained_ticks() {
        // watched whole: one that was not ours may be now
        controller = controller.reconcile_all_on(ticks);
    }
    let run = async move { crate::k8s::run_controller(controller, ctx.running(), "program", reconcile, ctx).await };
    (store, run)
}

#[cfg(test)]
mod tests {
    use super::*;
    use pko_api::program::{ProgramFields, Resource as PResource};
    use std::collections::BTreeMap;

    fn program(generation: i64) -> Program {
        let mut resources = BTreeMap::new();
        resources.insert(
            "hello".to_string(),
            PResource {
                resource_type: "command:local:Command".into(),
                properties: Some(BTreeMap::from([("create".to_string(), json!("echo hi"))])),
                ..Default::default()
            },
        );
        let mut p = Program::new(
            "demo",
            ProgramFields { program: Some(ProgramSpec { resources: Some(resources), ..Default::default() }) },
        );
        p.metadata.namespace = Some("team".into());
        p.metadata.generation = Some(generation);
        p
    }

    #[test]
    fn renders_name_runtime_and_body() {
        let yaml = render_yaml("demo", &program(1).spec.program.unwrap()).unwrap();
        let v: serde_yaml_ng::Value = serde_yaml_ng::from_str(&yaml).unwrap();
        assert_eq!(v["name"], "demo");
        assert_eq!(v["runtime"], "yaml");
        assert_eq!(v["resources"]["hello"]["type"], "command:local:Command");
    }

    #[test]
    fn tarballs_are_deterministic_and_digests_match() {
        let a = tarball(&program(1)).unwrap();
        let b = tarball(&program(1)).unwrap();
        assert_eq!(a, b, "same program, same bytes");
        let art =
            desired_artifact(&program(3), "op.pko:80", None, Time(k8s_openapi::jiff::Timestamp::UNIX_EPOCH)).unwrap();
        assert_eq!(art.digest.as_deref(), Some(digest(&a).as_str()));
        let hex = digest(&tarball(&program(3)).unwrap()).trim_start_matches("sha256:").to_string();
        assert_eq!(
            art.url,
            format!("http://op.pko:80/programs/team/demo/3/{hex}.tar.gz"),
            "the digest makes the URL a capability"
        );
        assert_eq!(art.path, format!("programs/team/demo/3/{hex}.tar.gz"));
        assert_eq!(art.revision.as_deref(), Some("3"));
        assert_eq!(art.size, Some(a.len() as i64));
    }

    #[test]
    fn last_update_time_moves_only_with_the_artifact() {
        let t0 = Time(k8s_openapi::jiff::Timestamp::UNIX_EPOCH);
        let t1 = Time(k8s_openapi::jiff::Timestamp::from_second(100).unwrap());
        let first = desired_artifact(&program(1), "a", None, t0.clone()).unwrap();
        let same = desired_artifact(&program(1), "a", Some(&first), t1.clone()).unwrap();
        assert_eq!(same.last_update_time, t0);
        let next = desired_artifact(&program(2), "a", Some(&first), t1.clone()).unwrap();
        assert_eq!(next.last_update_time, t1);
    }
}
