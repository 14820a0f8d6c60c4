//! The `pod` runtime of a Workspace (PKO §2.3–2.4): a headless Service and a StatefulSet `<workspace>-workspace`,
//! the agent copied into the pod by an init container, PKO's security profiles, a 600 s termination grace (time for
//! Pulumi to wind down after Ctrl-C), and the user's pod template merged on top. Pure.
//!
//! Unlike PKO, the pod's revision hash covers only what changes the pod (image, env, resources, service account,
//! security profile, pod template) — not stacks, config or the source, which travel with each operation — so a
//! config change never rolls the pod (PKO #965).

use std::collections::BTreeMap;

use k8s_openapi::api::apps::v1::{StatefulSet, StatefulSetSpec};
use k8s_openapi::api::core::v1::{
    Capabilities, Container, ContainerPort, EmptyDirVolumeSource, EnvVar, EnvVarSource, ObjectFieldSelector,
    PodSecurityContext, PodSpec, PodTemplateSpec, SeccompProfile, SecurityContext, Service, ServicePort, ServiceSpec,
    Volume, VolumeMount,
};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{LabelSelector, ObjectMeta, OwnerReference};
use pko_api::Workspace;
use pko_api::constants::{AUTO_COMPONENT_LABEL, REVISION_HASH_ANNOTATION, SHARD_LABEL, WORKSPACE_NAME_LABEL};
use pko_api::workspace::{AGENT_PORT, SecurityProfile};

/// Termination grace of workspace pods (seconds): Pulumi's wind-down after Ctrl-C.
pub const TERMINATION_GRACE_SECONDS: i64 = 600;
/// Where the agent binary is placed in the pod.
pub const AGENT_PATH: &str = "/share/pko-agent";
/// Where the `bootstrap` init container puts `tini` (from the agent image's `/tini`), the workspace container's PID 1:
/// it forwards SIGTERM to the agent and reaps the zombies Pulumi's plugins leave (PKO: `/share/tini`,
/// pulumi/pulumi-kubernetes-operator#698).
pub const TINI_PATH: &str = "/share/tini";
/// PKO's dynamic environment file: containers append `NAME=value` lines, the agent reads it before each operation
/// (`--env-file`).
pub const ENV_FILE: &str = "/share/.env";
/// PKO's `/share/workspace`: a link to the project directory of the latest operation (the agent's `--workspace-link`),
/// for sidecars that read the program.
pub const WORKSPACE_LINK: &str = "/share/workspace";
/// The variable naming [`ENV_FILE`] in every container (PKO).
pub const PULUMI_ENV: &str = "PULUMI_ENV";

/// Operator settings for the pod runtime.
#[derive(Debug, Clone)]
pub struct PodRuntimeConfig {
    /// Image holding `/pko-agent` and `/tini` (copied into the pod by the `bootstrap` init container).
    pub agent_image: String,
    /// Pull policy of that image (PKO `AGENT_IMAGE_PULL_POLICY`: `Always`, `IfNotPresent`, `Never`); none: Kubernetes'
    /// default for the tag.
    pub agent_image_pull_policy: Option<String>,
    /// PKO `FLUX_MAX_UNTAR_SIZE_BYTES` of the operator, passed on to every agent: the largest uncompressed Flux
    /// artifact in bytes (−1: no limit); none: the agent's default (100 MiB).
    pub flux_max_untar_size_bytes: Option<i64>,
}

/// Name of the Service and StatefulSet of workspace `name`.
pub fn object_name(name: &str) -> String {
    format!("{name}-workspace")
}

/// gRPC address of the agent of workspace `name` in `namespace` (PKO's `status.address`).
pub fn address(name: &str, namespace: &str) -> String {
    format!("{}.{namespace}:{AGENT_PORT}", object_name(name))
}

fn labels(name: &str) -> BTreeMap<String, String> {
    BTreeMap::from([
        (AUTO_COMPONENT_LABEL.to_string(), "workspace".to_string()),
        (WORKSPACE_NAME_LABEL.to_string(), name.to_string()),
    ])
}

fn owner(ws: &Workspace) -> Option<OwnerReference> {
    use kube::Resource;
    ws.controller_owner_ref(&())
}

/// The headless Service of the workspace.
pub fn service(ws: &Workspace) -> Service {
    let name = ws.metadata.name.clone().unwrap_or_default();
    let mut l = labels(&name);
    let tmpl = ws.spec.service_template.as_ref().and_then(|t| t.metadata.clone()).unwrap_or_default();
    l.extend(tmpl.labels.unwrap_or_default());
    Service {
        metadata: ObjectMeta {
            name: Some(object_name(&name)),
            namespace: ws.metadata.namespace.clone(),
            labels: Some(l),
            annotations: tmpl.annotations,
            owner_references: owner(ws).map(|o| vec![o]),
            ..Default::default()
        },
        spec: Some(ServiceSpec {
            cluster_ip: Some("None".into()),
            selector: Some(labels(&name)),
            ports: Some(vec![ServicePort {
                name: Some("grpc".into()),
                port: AGENT_PORT,
                target_port: Some(k8s_openapi::apimachinery::pkg::util::intstr::IntOrString::String("grpc".into())),
                ..Default::default()
            }]),
            ..Default::default()
        }),
        ..Default::default()
    }
}

fn restricted_container() -> SecurityContext {
    SecurityContext {
        allow_privilege_escalation: Some(false),
        capabilities: Some(Capabilities { drop: Some(vec!["ALL".into()]), add: Some(vec!["NET_BIND_SERVICE".into()]) }),
        ..Default::default()
    }
}

/// Hash of what shapes the pod (see the module docs).
pub fn revision_hash(ws: &Workspace) -> String {
    let s = &ws.spec;
    let key = serde_json::json!([
        s.image,
        s.image_pull_policy,
        s.env,
        s.env_from,
        s.resources,
        s.service_account_name,
        s.security_profile,
        s.pod_template,
        s.pulumi_log_level
    ]);
    pko_api::hash::sha256_hex(key.to_string(), 8)
}

/// The agent argument of a Workspace's own pod: its operations run in the fetched source with the pod's `HOME`, as in
/// PKO's pod (one Stack's operations only; language caches stay between them). A pool's pods leave it out: their agents
/// isolate each operation (`pko_agent::sandbox`).
pub const SHARED_OPERATIONS: &str = "--isolate-operations=false";

/// The arguments of the agent of Workspace `ns/name` in its pod (`--auth kube` for its audience, the grace period,
/// PKO's env file and workspace link, its operations shared as PKO's), with the Pulumi log level when set. Pure.
fn agent_args(ns: &str, name: &str, log_level: Option<u32>) -> Vec<String> {
    let mut args: Vec<String> = [
        "serve",
        "--listen",
        &format!("0.0.0.0:{AGENT_PORT}"),
        "--work-dir",
        "/share/work",
        "--auth",
        "kube",
        "--kube-audience",
    ]
    .iter()
    .map(|s| s.to_string())
    .collect();
    args.push(pko_proto::workspace_audience(ns, name));
    args.extend([
        "--kube-workspace-namespace".into(),
        ns.to_string(),
        "--kube-workspace-name".into(),
        name.to_string(),
    ]);
    args.extend(["--grace-seconds".into(), (TERMINATION_GRACE_SECONDS - 10).to_string()]);
    args.extend([
        "--env-file".into(),
        ENV_FILE.into(),
        "--workspace-link".into(),
        WORKSPACE_LINK.into(),
        SHARED_OPERATIONS.into(),
    ]);
    if let Some(level) = log_level.filter(|l| *l > 0) {
        args.extend(["--pulumi-log-level".into(), level.to_string()]);
    }
    args
}

/// The environment of the `pulumi` container: the pod's namespace and service account (downward API), the Flux untar
/// limit when set, then the Workspace's `env`. Pure.
fn agent_env(spec: &pko_api::WorkspaceSpec, cfg: &PodRuntimeConfig) -> Vec<EnvVar> {
    let field = |path: &str| {
        Some(EnvVarSource {
            field_ref: Some(ObjectFieldSelector { field_path: path.into(), ..Default::default() }),
            ..Default::default()
        })
    };
    let mut env = vec![
        EnvVar { name: "POD_NAMESPACE".into(), value_from: field("metadata.namespace"), ..Default::default() },
        EnvVar { name: "POD_SA_NAME".into(), value_from: field("spec.serviceAccountName"), ..Default::default() },
    ];
    if let Some(max) = cfg.flux_max_untar_size_bytes {
        env.push(EnvVar {
            name: "FLUX_MAX_UNTAR_SIZE_BYTES".into(),
            value: Some(max.to_string()),
            ..Default::default()
        });
    }
    env.extend(spec.env.clone().unwrap_or_default());
    env
}

/// The three containers of a workspace pod: the init containers `bootstrap` (copies the agent and tini into `/share`)
/// and `fetch` (PKO's name, so podTemplate patches written for PKO's merge into a whole container: here it prepares the
/// shared volume — sources are fetched per operation), and `pulumi` (tini, then the agent). Pure.
fn containers(
    ws: &Workspace,
    spec: &pko_api::WorkspaceSpec,
    cfg: &PodRuntimeConfig,
) -> (Container, Container, Container) {
    let (name, ns) = (ws.metadata.name.clone().unwrap_or_default(), ws.metadata.namespace.clone().unwrap_or_default());
    let restricted = spec.security_profile == Some(SecurityProfile::Restricted);
    let share = VolumeMount { name: "share".into(), mount_path: "/share".into(), ..Default::default() };
    let bootstrap = Container {
        name: "bootstrap".into(),
        image: Some(cfg.agent_image.clone()),
        image_pull_policy: cfg.agent_image_pull_policy.clone(),
        command: Some(vec!["cp".into(), "/pko-agent".into(), "/tini".into(), "/share/".into()]),
        volume_mounts: Some(vec![share.clone()]),
        security_context: restricted.then(restricted_container),
        ..Default::default()
    };
    let fetch = Container {
        name: "fetch".into(),
        image: spec.image.clone(),
        image_pull_policy: spec.image_pull_policy.as_ref().map(ToString::to_string),
        command: Some(vec![AGENT_PATH.into(), "init".into(), "--share".into(), "/share".into()]),
        volume_mounts: Some(vec![share.clone()]),
        security_context: restricted.then(restricted_container),
        ..Default::default()
    };
    let pulumi = Container {
        name: "pulumi".into(),
        image: spec.image.clone(),
        image_pull_policy: spec.image_pull_policy.as_ref().map(ToString::to_string),
        command: Some(vec![TINI_PATH.into(), "--".into(), AGENT_PATH.into()]),
        args: Some(agent_args(&ns, &name, spec.pulumi_log_level)),
        env: Some(agent_env(spec, cfg)),
        env_from: spec.env_from.clone(),
        resources: spec.resources.clone(),
        ports: Some(vec![ContainerPort {
            name: Some("grpc".into()),
            container_port: AGENT_PORT,
            ..Default::default()
        }]),
        volume_mounts: Some(vec![share]),
        working_dir: Some("/share".into()),
        security_context: restricted.then(restricted_container),
        ..Default::default()
    };
    (bootstrap, fetch, pulumi)
}

/// The pod of the workspace (`spec` defaults applied), with the user's `podTemplate` merged in. Pure.
fn pod_spec(ws: &Workspace, spec: &pko_api::WorkspaceSpec, cfg: &PodRuntimeConfig) -> PodSpec {
    let restricted = spec.security_profile == Some(SecurityProfile::Restricted);
    let (bootstrap, fetch, pulumi) = containers(ws, spec, cfg);
    let mut pod = PodSpec {
        service_account_name: spec.service_account_name.clone(),
        termination_grace_period_seconds: Some(TERMINATION_GRACE_SECONDS),
        init_containers: Some(vec![bootstrap, fetch]),
        containers: vec![pulumi],
        volumes: Some(vec![Volume {
            name: "share".into(),
            empty_dir: Some(EmptyDirVolumeSource::default()),
            ..Default::default()
        }]),
        security_context: Some(PodSecurityContext {
            seccomp_profile: Some(SeccompProfile { type_: "RuntimeDefault".into(), ..Default::default() }),
            run_as_non_root: restricted.then_some(true),
            run_as_user: restricted.then_some(1000),
            run_as_group: restricted.then_some(1000),
            ..Default::default()
        }),
        ..Default::default()
    };
    if let Some(user) = spec.pod_template.as_ref().and_then(|t| t.spec.as_ref()) {
        merge_pod_spec(&mut pod, user);
    }
    add_pulumi_env(&mut pod);
    pod
}

/// The StatefulSet of the workspace (`spec` defaults applied). Pure.
pub fn stateful_set(ws: &Workspace, cfg: &PodRuntimeConfig) -> StatefulSet {
    let name = ws.metadata.name.clone().unwrap_or_default();
    let ns = ws.metadata.namespace.clone().unwrap_or_default();
    let spec = ws.spec.with_defaults();
    let pod = pod_spec(ws, &spec, cfg);
    let mut pod_labels = labels(&name);
    let tmeta = spec.pod_template.clone().unwrap_or_default().metadata.unwrap_or_default();
    pod_labels.extend(tmeta.labels.unwrap_or_default());
    let mut annotations = tmeta.annotations.unwrap_or_default();
    annotations.insert(REVISION_HASH_ANNOTATION.into(), revision_hash(ws));
    StatefulSet {
        metadata: ObjectMeta {
            name: Some(object_name(&name)),
            namespace: Some(ns),
            // the Workspace's shard too: the replica holding it watches this StatefulSet
            labels: Some(
                labels(&name)
                    .into_iter()
                    .chain(kube::ResourceExt::labels(ws).get(SHARD_LABEL).map(|s| (SHARD_LABEL.to_string(), s.clone())))
                    .collect(),
            ),
            owner_references: owner(ws).map(|o| vec![o]),
            ..Default::default()
        },
        spec: Some(StatefulSetSpec {
            replicas: Some(1),
            service_name: Some(object_name(&name)),
            pod_management_policy: Some("Parallel".into()),
            selector: LabelSelector { match_labels: Some(labels(&name)), ..Default::default() },
            template: PodTemplateSpec {
                metadata: Some(ObjectMeta {
                    labels: Some(pod_labels),
                    annotations: Some(annotations),
                    ..Default::default()
                }),
                spec: Some(pod),
            },
            ..Default::default()
        }),
        ..Default::default()
    }
}

/// Kubernetes' strategic merge of the user's pod spec onto the generated one ([`super::merge`]), as PKO merges
/// `podTemplate`: lists with a merge key merge element by element (the built-in containers, volumes and mounts keep
/// their places, the user's new ones follow), maps merge, every other field the user sets replaces — every PodSpec
/// field, none dropped.
pub fn merge_pod_spec(base: &mut PodSpec, user: &PodSpec) {
    let (Ok(mut merged), Ok(patch)) = (serde_json::to_value(&*base), serde_json::to_value(user)) else { return };
    super::merge::strategic_merge(&mut merged, &patch);
    match serde_json::from_value(merged) {
        Ok(spec) => *base = spec,
        // both sides are PodSpecs and the merge keeps the shape: not expected
        Err(e) => {
            tracing::warn!(error = %e,
                "the merged pod template is not a PodSpec; the user's podTemplate.spec is ignored")
        }
    }
}

/// PKO's `$PULUMI_ENV`: every container and init container of the pod (the user's too) gets `PULUMI_ENV=/share/.env`;
/// what they write there reaches each Pulumi operation (the agent's `--env-file`, PKO 2.2 dynamic environment
/// variables).
fn add_pulumi_env(pod: &mut PodSpec) {
    let var = EnvVar { name: PULUMI_ENV.into(), value: Some(ENV_FILE.into()), ..Default::default() };
    for c in pod.containers.iter_mut().chain(pod.init_containers.iter_mut().flatten()) {
        let env = c.env.get_or_insert_with(Vec::new);
        env.retain(|e| e.name != PULUMI_ENV);
        env.push(var.clone());
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn ws(spec: serde_json::Value) -> Workspace {
        serde_json::from_value(json!({"apiVersion": "auto.pulumi.com/v1alpha1", "kind": "Workspace",
            "metadata": {"name": "w", "namespace": "ns", "uid": "u1"}, "spec": spec}))
        .unwrap()
    }

    fn cfg() -> PodRuntimeConfig {
        PodRuntimeConfig {
            agent_image: "pko-agent:test".into(),
            agent_image_pull_policy: Some("Never".into()),
            flux_max_untar_size_bytes: Some(-1),
        }
    }

    #[test]
    fn restricted_defaults_match_pko() {
        let s = stateful_set(&ws(json!({"local": {"dir": "/p"}})), &cfg());
        let spec = s.spec.unwrap();
        assert_eq!(
            (spec.replicas, spec.pod_management_policy.as_deref(), spec.service_name.as_deref()),
            (Some(1), Some("Parallel"), Some("w-workspace"))
        );
        let pod = spec.template.spec.unwrap();
        assert_eq!(pod.service_account_name.as_deref(), Some("default"));
        assert_eq!(pod.termination_grace_period_seconds, Some(600));
        let sc = pod.security_context.unwrap();
        assert_eq!((sc.run_as_non_root, sc.run_as_user, sc.run_as_group), (Some(true), Some(1000), Some(1000)));
        assert_eq!(sc.seccomp_profile.unwrap().type_, "RuntimeDefault");
        let c = &pod.containers[0];
        assert_eq!(c.image.as_deref(), Some("pulumi/pulumi:latest-nonroot"));
        let csc = c.security_context.clone().unwrap();
        assert_eq!(csc.allow_privilege_escalation, Some(false));
        assert_eq!(csc.capabilities.unwrap().drop, Some(vec!["ALL".to_string()]));
        assert_eq!(c.resources.as_ref().unwrap().requests.as_ref().unwrap()["memory"].0, "64Mi");
        assert!(
            c.args
                .as_ref()
                .unwrap()
                .join(" ")
                .contains("--auth kube --kube-audience w.ns --kube-workspace-namespace ns --kube-workspace-name w")
        );
        let env = c.env.clone().unwrap_or_default();
        assert!(
            env.iter().any(|e| e.name == "FLUX_MAX_UNTAR_SIZE_BYTES" && e.value.as_deref() == Some("-1")),
            "the operator's FLUX_MAX_UNTAR_SIZE_BYTES reaches the agent"
        );
        let bootstrap = &pod.init_containers.unwrap()[0];
        assert_eq!(
            (bootstrap.name.as_str(), bootstrap.image_pull_policy.as_deref()),
            ("bootstrap", Some("Never")),
            "AGENT_IMAGE_PULL_POLICY"
        );
        assert_eq!(bootstrap.command.clone().unwrap(), vec!["cp", "/pko-agent", "/tini", "/share/"]);
        assert_eq!(
            c.command.clone().unwrap(),
            vec!["/share/tini", "--", "/share/pko-agent"],
            "tini is PID 1: it reaps zombies and forwards SIGTERM"
        );
        assert_eq!(s.metadata.owner_references.unwrap()[0].kind, "Workspace");
        assert_eq!(address("w", "ns"), "w-workspace.ns:50051");
    }

    #[test]
    fn baseline_runs_as_root_with_the_full_image() {
        let pod =
            stateful_set(&ws(json!({"securityProfile": "baseline"})), &cfg()).spec.unwrap().template.spec.unwrap();
        assert_eq!(pod.containers[0].image.as_deref(), Some("pulumi/pulumi:latest"));
        assert_eq!(pod.security_context.as_ref().unwrap().run_as_non_root, None);
        assert!(pod.containers[0].security_context.is_none());
    }

    #[test]
    fn pod_template_is_merged() {
        let s = stateful_set(
            &ws(json!({"podTemplate": {"metadata": {"labels": {"team": "a"}}, "spec": {
                "containers": [{"name": "pulumi", "env": [{"name": "X", "value": "1"}],
                    "volumeMounts": [{"name": "cache", "mountPath": "/cache"}]}, {"name": "sidecar",
                        "image": "busybox"}],
                "initContainers": [{"name": "fetch-extra", "image": "busybox"}],
                "volumes": [{"name": "cache", "emptyDir": {}}],
                "tolerations": [{"key": "k", "operator": "Exists"}]
            }}})),
            &cfg(),
        );
        let t = s.spec.unwrap().template;
        assert_eq!(t.metadata.unwrap().labels.unwrap()["team"], "a");
        let pod = t.spec.unwrap();
        let names: Vec<_> = pod.containers.iter().map(|c| c.name.as_str()).collect();
        assert_eq!(names, vec!["pulumi", "sidecar"]);
        let pulumi = &pod.containers[0];
        assert!(
            pulumi.env.as_ref().unwrap().iter().any(|e| e.name == "X")
                && pulumi.env.as_ref().unwrap().iter().any(|e| e.name == "POD_NAMESPACE")
        );
        assert_eq!(pulumi.volume_mounts.as_ref().unwrap().len(), 2);
        let inits: Vec<_> = pod.init_containers.unwrap().iter().map(|c| c.name.clone()).collect();
        assert_eq!(
            inits,
            vec!["bootstrap", "fetch", "fetch-extra"],
            "user init containers run after the built-in ones"
        );
        assert_eq!(pod.volumes.unwrap().len(), 2);
        assert!(pod.tolerations.is_some());
    }

    /// PKO's `examples/custom-workspace` podTemplate, merged as PKO's strategic merge does: every field kept (none
    /// dropped, maps merged), and `$PULUMI_ENV` on every container, the user's init container included, so its `echo
    /// X=Y >> $PULUMI_ENV` works.
    #[test]
    fn pko_custom_workspace_example_merges_as_in_pko() {
        let s = stateful_set(
            &ws(json!({"podTemplate": {"metadata": {"labels": {"example.com/mylabel": "bar"}}, "spec": {
                "terminationGracePeriodSeconds": 3600,
                "shareProcessNamespace": true,
                "enableServiceLinks": false,
                "securityContext": {"fsGroup": 1000},
                "tolerations": [{"key": "example.com/foo", "operator": "Exists", "effect": "NoSchedule"}],
                "initContainers": [{"name": "extra", "image": "busybox", "command": ["sh", "-c",
                    "echo 'PULUMI_CONFIG_PASSPHRASE=test' >> $PULUMI_ENV"],
                                    "volumeMounts": [{"name": "share", "mountPath": "/share"}]}],
                "containers": [{"name": "pulumi", "stdin": true, "securityContext": {"readOnlyRootFilesystem": true},
                                "volumeMounts": [{"name": "secret-volume", "mountPath": "/etc/secret-volume",
                                    "readOnly": true}]}],
                "volumes": [{"name": "secret-volume", "secret": {"secretName": "test-secret"}}]
            }}})),
            &cfg(),
        );
        let pod = s.spec.unwrap().template.spec.unwrap();
        assert_eq!(
            (pod.termination_grace_period_seconds, pod.share_process_namespace, pod.enable_service_links),
            (Some(3600), Some(true), Some(false)),
            "every PodSpec field"
        );
        let sc = pod.security_context.unwrap();
        assert_eq!(
            (sc.fs_group, sc.run_as_user, sc.seccomp_profile.map(|p| p.type_)),
            (Some(1000), Some(1000), Some("RuntimeDefault".to_string())),
            "maps merge"
        );
        let pulumi = &pod.containers[0];
        assert_eq!(pulumi.stdin, Some(true), "every field of a generated container");
        let csc = pulumi.security_context.clone().unwrap();
        assert_eq!(
            (csc.read_only_root_filesystem, csc.allow_privilege_escalation),
            (Some(true), Some(false)),
            "the restricted profile stays"
        );
        assert_eq!(pulumi.image.as_deref(), Some("pulumi/pulumi:latest-nonroot"));
        let mounts: Vec<_> = pulumi.volume_mounts.iter().flatten().map(|m| m.mount_path.as_str()).collect();
        assert_eq!(mounts, vec!["/share", "/etc/secret-volume"]);
        let inits = pod.init_containers.unwrap();
        for c in pod.containers.iter().chain(inits.iter()) {
            assert!(
                c.env.iter().flatten().any(|e| e.name == "PULUMI_ENV" && e.value.as_deref() == Some("/share/.env")),
                "{} has $PULUMI_ENV",
                c.name
            );
        }
        assert_eq!(inits.iter().map(|c| c.name.as_str()).collect::<Vec<_>>(), vec!["bootstrap", "fetch", "extra"]);
        let args = pulumi.args.clone().unwrap();
        assert!(
            args.windows(2).any(|w| w == ["--env-file", "/share/.env"]),
            "the agent reads it before each operation: {args:?}"
        );
        assert!(
            args.windows(2).any(|w| w == ["--workspace-link", "/share/workspace"]),
            "PKO's /share/workspace: {args:?}"
        );
    }

    /// A podTemplate written for PKO that patches its `fetch` init container merges into ours, a whole container,
    /// instead of adding an init container without an image.
    #[test]
    fn a_patch_of_pko_s_fetch_container_merges() {
        let s = stateful_set(
            &ws(json!({"podTemplate": {"spec": {"containers": [], "initContainers": [{"name": "fetch",
                    "env": [{"name": "HTTPS_PROXY", "value": "http://proxy:3128"}],
                    "resources": {"limits": {"memory": "128Mi"}}}]}}})),
            &cfg(),
        );
        let inits = s.spec.unwrap().template.spec.unwrap().init_containers.unwrap();
        assert_eq!(inits.len(), 2, "merged, not added");
        let fetch = &inits[1];
        assert_eq!((fetch.name.as_str(), fetch.image.as_deref()), ("fetch", Some("pulumi/pulumi:latest-nonroot")));
        assert_eq!(fetch.command.clone().unwrap(), vec!["/share/pko-agent", "init", "--share", "/share"]);
        assert!(fetch.env.iter().flatten().any(|e| e.name == "HTTPS_PROXY") && fetch.resources.is_some());
    }

    #[test]
    fn config_changes_do_not_roll_the_pod() {
        let a =
            ws(json!({"local": {"dir": "/p"}, "stacks": [{"name": "dev", "config": [{"key": "a", "value": "1"}]}]}));
        let b = ws(json!({"git": {"url": "u", "ref": "r2"}, "stacks": [{"name": "dev", "config": [{"key": "a",
                "value": "2"}]}]}));
        assert_eq!(revision_hash(&a), revision_hash(&b));
        let c = ws(json!({"local": {"dir": "/p"}, "image": "custom"}));
        assert_ne!(revision_hash(&a), revision_hash(&c));
    }

    #[test]
    fn service_is_headless_with_template_metadata() {
        let s =
            service(&ws(json!({"serviceTemplate": {"metadata": {"labels": {"x": "y"}, "annotations": {"a": "b"}}}})));
        assert_eq!(s.metadata.name.as_deref(), Some("w-workspace"));
        let spec = s.spec.unwrap();
        assert_eq!(spec.cluster_ip.as_deref(), Some("None"));
        assert_eq!(spec.ports.unwrap()[0].port, 50051);
        assert_eq!(s.metadata.labels.unwrap()["x"], "y");
        assert_eq!(s.metadata.annotations.unwrap()["a"], "b");
    }
}
