//! The production path on the bed's real node: the images (`scripts/images/build.sh`, what `make images`
//! runs) imported into the node's containerd, the operator installed with `helm install` from
//! `deploy/helm/pko` and running in a pod, workspaces in pods of the workspace image, the agent copied in
//! by the `bootstrap` init container and run under tini, Service names resolved by CoreDNS, Services
//! routed by kube-proxy, Pulumi's state on a hostPath volume.
//!
//! One test walks the lifecycle a user meets, in order (each step needs the one before):
//! 1. `helm install` → the operator Deployment is available;
//! 2. a Program Stack with secret config, and a git Stack, converge with their workspaces in pods (tini as
//!    PID 1 reaps orphans); a workspace service account without `system:auth-delegator` makes the
//!    Workspace Ready False `Unauthenticated` (PKO's connection check) until the binding exists;
//! 3. `kubectl delete pod` of a workspace pod during a slow `up`: the agent gets SIGTERM and sends CTRL-C to
//!    Pulumi, its run ends Interrupted at once (not after the grace period), the same Update is handed to
//!    the recreated pod and completes there, the Stack converges, no Pulumi lock is left;
//! 4. `helm upgrade` with changed values during a slow `up` rolls the operator, and the operation is not lost;
//! 5. the Stacks deleted, `helm uninstall` leaves no workload, ClusterRole or Service behind.

mod common;

use std::time::Instant;

use common::cluster::{helm, kubectl, node_test, operator_logs, stack_spec, updates_of, wait_for};
use common::{create, ready, stack_condition};
use k8s_openapi::api::apps::v1::{Deployment, StatefulSet};
use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::api::rbac::v1::ClusterRole;
use kube::api::{Api, DeleteParams, ListParams, Patch, PatchParams};
use pko_api::{Stack, Update};
use pko_testbed::{repo_root, testbed};
use serde_json::json;

fn updates_api(ns: &pko_testbed::TestNamespace) -> Api<Update> {
    ns.api::<Update>()
}

fn failed_update(u: &Update) -> bool {
    common::condition(u, "Complete").is_some_and(|c| c.0 == "True")
        && common::condition(u, "Failed").is_some_and(|c| c.0 == "True")
}

/// Waits for the workspace pod `<stack>-workspace-0` to be Running with its containers ready; returns it.
async fn workspace_pod(pods: &Api<Pod>, stack: &str, secs: u64) -> Pod {
    let name = format!("{stack}-workspace-0");
    let end = Instant::now() + std::time::Duration::from_secs(secs);
    loop {
        let pod = pods.get_opt(&name).await.unwrap();
        if let Some(p) = pod.filter(|p| {
            p.metadata.deletion_timestamp.is_none()
                && p.status
                    .as_ref()
                    .and_then(|s| s.container_statuses.as_ref())
                    .is_some_and(|cs| cs.iter().all(|c| c.ready))
        }) {
            return p;
        }
        assert!(Instant::now() < end, "workspace pod {name} not Running and ready within {secs} s");
        tokio::time::sleep(std::time::Duration::from_millis(250)).await;
    }
}

/// Lock files of the file:// backend under `state_dir` (Pulumi's `.pulumi/locks/<org>/<project>/<stack>/*.json`).
fn locks(state_dir: &std::path::Path) -> Vec<std::path::PathBuf> {
    common::files_under(&state_dir.join(".pulumi/locks"))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_operator_in_a_pod_runs_stacks_in_workspace_pods() {
    let bed = testbed();
    let node = bed.node();
    let bin_dir = common::agent_bin().parent().unwrap().to_path_buf();
    let tag = bed.images(&bin_dir);
    let client = bed.client().await.unwrap();
    pko_testbed::install_crds(&client, pko_api::crds()).await.unwrap();
    let t = node_test(&client, "in-cluster", "pko").await;
    let (ns, op_ns, release, env, state_dir) = (&t.ns, &t.op_ns, &t.release, &t.env, &t.state_dir);

    // -- 1. helm install --
    let chart = repo_root().join("deploy/helm/pko").display().to_string();
    let watch = format!("namespace.watch={{{}}}", ns.name());
    let base_sets =
        ["--set", &watch, "--set", "fullnameOverride=pko-operator", "--set", "terminationGracePeriodSeconds=60"];
    // the chart registers the cluster-wide logs APIService: one left by an interrupted run would refuse the install
    let stale = ["delete", "apiservice", "v1alpha1.logs.pulumi.com", "--ignore-not-found"];
    let _ = testbed().kubectl().args(stale).output();
    let t = Instant::now();
    let mut args =
        vec!["install", release.as_str(), chart.as_str(), "--namespace", op_ns.as_str(), "--wait", "--timeout", "180s"];
    args.extend(base_sets);
    let (ok, _, err) = helm(&args);
    assert!(ok, "helm install: {err}\n{}", operator_logs(op_ns));
    eprintln!("helm install → operator available: {:.1} s", t.elapsed().as_secs_f64());
    let deploys: Api<Deployment> = Api::namespaced(client.clone(), op_ns);
    let d = deploys.get("pko-operator").await.unwrap();
    assert_eq!(d.status.and_then(|s| s.available_replicas), Some(1), "the operator pod is available");
    let op_pods: Api<Pod> = Api::namespaced(client.clone(), op_ns);
    let op_pod = op_pods
        .list(&ListParams::default().labels("app.kubernetes.io/name=pko-operator"))
        .await
        .unwrap()
        .items
        .remove(0);
    assert_eq!(
        op_pod.spec.as_ref().unwrap().node_name.as_deref(),
        Some(node.name.as_str()),
        "the operator runs on the bed's node"
    );
    assert_eq!(
        op_pod.spec.as_ref().unwrap().containers[0].image.as_deref(),
        Some(format!("pko-operator:{tag}").as_str())
    );

    // the workspaces' service account may check the operator's token (PKO's documented requirement)
    kubectl(&[
        "create",
        "clusterrolebinding",
        &format!("{release}-ws-auth"),
        "--clusterrole=system:auth-delegator",
        &format!("--serviceaccount={}:default", ns.name()),
    ]);
    common::passphrase_secret(ns).await;
    create(
        &ns.api::<k8s_openapi::api::core::v1::Secret>(),
        json!({"apiVersion": "v1", "kind": "Secret", "metadata": {"name": "api"},
            "stringData": {"token": "t0ken-Secret-val"}}),
    )
    .await;

    // -- 2. a Program Stack with secret config, and a git Stack, converge in workspace pods --
    create(
        &ns.api::<pko_api::Program>(),
        json!({"apiVersion": "pulumi.com/v1", "kind": "Program", "metadata": {"name": "prog"}, "program": {
            "configuration": {"greeting": {"type": "String"}, "token": {"type": "String"}, "pause": {"type": "String",
                "default": "0"}},
            "resources": {
                "hello": {"type": "command:local:Command",
                    "properties": {"create": "sleep ${pause}; echo ${greeting} from $(hostname)"}},
                "tok": {"type": "command:local:Command", "properties": {"create": "echo ${token}"}},
                // envSecrets (envFrom) and the downward API reach the program in the pod
                "envs": {"type": "command:local:Command",
                    "properties": {"create": "printf '%s:%s:%s' \"$(printenv token | wc -c)\" \"$MY_NS\" \"$MY_IP\""}}
            },
            "outputs": {"said": "${hello.stdout}", "tokenLength": "${tok.stdout}", "envs": "${envs.stdout}"}
        }}),
    )
    .await;
    let stacks = ns.api::<Stack>();
    let t = Instant::now();
    let mut prog_stack = stack_spec(
        "prog-stack",
        tag,
        state_dir,
        json!({"programRef": {"name": "prog"}, "config": {"greeting": "hello"}, "envSecrets": ["api"],
            "secretsRef": {"token": {"type": "Secret", "secret": {"name": "api", "key": "token"}}}}),
    );
    let ws_env = prog_stack["spec"]["workspaceTemplate"]["spec"]["env"].as_array_mut().unwrap();
    ws_env.push(json!({"name": "MY_NS", "valueFrom": {"fieldRef": {"fieldPath": "metadata.namespace"}}}));
    ws_env.push(json!({"name": "MY_IP", "valueFrom": {"fieldRef": {"fieldPath": "status.podIP"}}}));
    create(&stacks, prog_stack).await;
    let pods: Api<Pod> = Api::namespaced(client.clone(), ns.name());
    wait_for("the Program Stack Ready (cold workspace pod)", 180, ns.name(), op_ns, || async {
        stacks.get("prog-stack").await.is_ok_and(|s| ready(&s))
    })
    .await;
    eprintln!("Program Stack apply → Ready, cold workspace pod: {:.1} s", t.elapsed().as_secs_f64());
    let s = stacks.get("prog-stack").await.unwrap();
    let outputs = s.status.as_ref().and_then(|s| s.outputs.clone()).unwrap_or_default();
    assert!(
        outputs
            .get("said")
            .is_some_and(|v| v.as_str().is_some_and(|v| v.contains("hello from prog-stack-workspace-0"))),
        "the program ran in the workspace pod: {outputs:?}"
    );
    let pod = workspace_pod(&pods, "prog-stack", 30).await;
    let pod_ip = pod.status.as_ref().and_then(|s| s.pod_ip.clone()).unwrap_or_default();
    assert_eq!(
        outputs.get("envs"),
        Some(&json!(format!("17:{}:{pod_ip}", ns.name()))),
        "envSecrets and the downward API reached the program"
    );
    let ps = pod.spec.as_ref().unwrap();
    assert_eq!(ps.node_name.as_deref(), Some(node.name.as_str()));
    assert_eq!(
        ps.containers[0].command.clone().unwrap(),
        vec!["/share/tini", "--", "/share/pko-agent"],
        "tini is the workspace container's PID 1"
    );
    // the agent under tini: PID 1 in the container is tini, the agent its child
    let comm =
        kubectl(&["exec", "-n", ns.name(), "prog-stack-workspace-0", "-c", "pulumi", "--", "cat", "/proc/1/comm"]);
    assert_eq!(comm.trim(), "tini");
    // an orphan is reparented to PID 1, which reaps it when it exits: no zombie stays behind
    let zombies = kubectl(&[
        "exec",
        "-n",
        ns.name(),
        "prog-stack-workspace-0",
        "-c",
        "pulumi",
        "--",
        "sh",
        "-c",
        "sh -c 'sleep 0.3 &'; sleep 2; grep -l '^State:.*Z' /proc/[0-9]*/status 2>/dev/null || true",
    ]);
    assert!(zombies.trim().is_empty(), "zombie processes in the workspace container: {zombies}");

    // warm: a config change runs on the same pod
    let uid = pod.metadata.uid.clone();
    let t = Instant::now();
    stacks
        .patch(
            "prog-stack",
            &PatchParams::default(),
            &Patch::Merge(json!({"spec": {"config": {"greeting": "bonjour"}}})),
        )
        .await
        .unwrap();
    wait_for("the Program Stack Ready again (warm workspace pod)", 120, ns.name(), op_ns, || async {
        stacks.get("prog-stack").await.is_ok_and(|s| {
            ready(&s)
                && s.status
                    .as_ref()
                    .and_then(|s| s.outputs.as_ref())
                    .and_then(|o| o.get("said"))
                    .is_some_and(|v| v.as_str().is_some_and(|v| v.contains("bonjour")))
        })
    })
    .await;
    eprintln!("Program Stack change → Ready, warm workspace pod: {:.1} s", t.elapsed().as_secs_f64());
    assert_eq!(pods.get("prog-stack-workspace-0").await.unwrap().metadata.uid, uid, "the same workspace pod ran it");
    // what Pulumi printed, through the API server: the chart's APIService routes to the operator pod; no flags
    let printed = std::sync::Arc::new(std::sync::Mutex::new(String::new()));
    wait_for("kubectl pko logs through the API server", 60, ns.name(), op_ns, || {
        let printed = printed.clone();
        async move {
            let out = std::process::Command::new(common::kubectl_pko_bin())
                .args(["logs", "stack/prog-stack", "-n", ns.name()])
                .env("KUBECONFIG", testbed().kubeconfig())
                .output()
                .unwrap();
            let text = format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
            *printed.lock().unwrap() = text;
            out.status.success()
        }
    })
    .await;
    let printed = printed.lock().unwrap().clone();
    assert!(printed.contains("command:local:Command") && printed.contains("Resources:"), "{printed}");
    assert!(!printed.contains("t0ken-Secret-val"), "the secret is masked: {printed}");
    // the secret config reached the program, and shows only masked
    let s = stacks.get("prog-stack").await.unwrap();
    assert_eq!(
        s.status.as_ref().and_then(|s| s.outputs.as_ref()).and_then(|o| o.get("tokenLength")),
        Some(&json!("[secret]"))
    );
    let status = serde_json::to_string(&s.status).unwrap();
    assert!(!status.contains("t0ken-Secret-val"), "the secret in the status: {status}");

    // a git Stack: the source served on the node's address, fetched by the agent in the pod
    let git_root = env.dir().join("git");
    std::fs::create_dir_all(&git_root).unwrap();
    let repo = pko_testbed::git::bare_repo_with(
        &git_root,
        "proj.git",
        &[(
            "app/Pulumi.yaml",
            "name: gitproj\nruntime: yaml\nresources:\n  c:\n    type: command:local:Command\n    properties:\n      \
                create: echo from-git\noutputs:\n  out: ${c.stdout}\n",
        )],
    );
    let server = pko_testbed::git::GitHttpServer::start(&git_root, &format!("{}:0", node.ip), None).await.unwrap();
    create(
        &stacks,
        stack_spec(
            "git-stack",
            tag,
            state_dir,
            json!({"projectRepo": server.url("proj.git"), "repoDir": "app", "commit": repo}),
        ),
    )
    .await;
    wait_for("the git Stack Ready", 300, ns.name(), op_ns, || async {
        stacks.get("git-stack").await.is_ok_and(|s| ready(&s))
    })
    .await;
    let s = stacks.get("git-stack").await.unwrap();
    assert_eq!(
        s.status.as_ref().and_then(|s| s.outputs.as_ref()).and_then(|o| o.get("out")).and_then(|v| v.as_str()),
        Some("from-git")
    );

    // PKO's "fetch the source yourself": a Stack with no source gets a source-less Workspace, whose
    // pod's own init container puts the program in /share/workspace; the agent runs it there
    let mut bare = stack_spec("bare-stack", tag, state_dir, json!({}));
    let program = "name: bare\nruntime: yaml\nresources:\n  c:\n    type: command:local:Command\n    \
        properties:\n      create: echo from-init-container\noutputs:\n  out: ${c.stdout}\n";
    bare["spec"]["workspaceTemplate"]["spec"]["podTemplate"]["spec"]["initContainers"] = json!([{
        "name": "fetch-source", "image": format!("pko-workspace:{tag}"), "imagePullPolicy": "IfNotPresent",
        "command": ["sh", "-c",
            format!("mkdir -p /share/workspace && printf '{program}' > /share/workspace/Pulumi.yaml")],
        "volumeMounts": [{"name": "share", "mountPath": "/share"}]
    }]);
    create(&stacks, bare).await;
    wait_for("the source-less Stack Ready", 180, ns.name(), op_ns, || async {
        stacks.get("bare-stack").await.is_ok_and(|s| ready(&s))
    })
    .await;
    let s = stacks.get("bare-stack").await.unwrap();
    assert_eq!(
        s.status.as_ref().and_then(|s| s.outputs.as_ref()).and_then(|o| o.get("out")).and_then(|v| v.as_str()),
        Some("from-init-container")
    );
    assert_eq!(
        s.status.as_ref().and_then(|s| s.last_update.as_ref()).and_then(|l| l.last_successful_commit.as_deref()),
        Some(""),
        "PKO's empty commit"
    );
    assert!(
        !ns.api::<pko_api::Workspace>().get("bare-stack").await.unwrap().spec.has_source(),
        "the Workspace has no source"
    );

    // the workspace pods' agents answered the operator's check, which reports their CLI
    let workspaces = ns.api::<pko_api::Workspace>();
    let w = workspaces.get("git-stack").await.unwrap();
    assert_eq!(
        w.status.as_ref().and_then(|s| s.pulumi_version.as_deref()),
        Some(pko_testbed::versions::pulumi().trim_start_matches('v'))
    );

    // PKO's usual setup mistake: a workspace service account without system:auth-delegator. The new
    // pod's agent refuses the operator's check: Workspace Ready False Unauthenticated naming the fix,
    // a ConnectionFailure event, the Stack waiting with that reason; the binding mends it.
    kubectl(&["create", "serviceaccount", "-n", ns.name(), "deployer"]);
    create(
        &stacks,
        stack_spec(
            "unauth-stack",
            tag,
            state_dir,
            json!({"programRef": {"name": "prog"},
        "serviceAccountName": "deployer", "config": {"greeting": "hi"}, "secretsRef": {"token": {"type": "Secret",
            "secret": {"name": "api", "key": "token"}}}}),
        ),
    )
    .await;
    wait_for("the Workspace Unauthenticated", 180, ns.name(), op_ns, || async {
        workspaces.get("unauth-stack").await.is_ok_and(|w| {
            w.status.as_ref().and_then(|s| s.conditions.as_ref()).is_some_and(|cs| {
                cs.iter().any(|c| {
                    c.type_ == "Ready"
                        && c.status == "False"
                        && c.reason == "Unauthenticated"
                        && c.message.contains("system:auth-delegator")
                })
            })
        })
    })
    .await;
    wait_for("the Stack waits with the Workspace's reason", 60, ns.name(), op_ns, || async {
        stacks
            .get("unauth-stack")
            .await
            .is_ok_and(|s| stack_condition(&s, "Reconciling").is_some_and(|c| c.2.contains("Unauthenticated")))
    })
    .await;
    let events = kubectl(&[
        "get",
        "events",
        "-n",
        ns.name(),
        "--field-selector",
        "reason=ConnectionFailure,involvedObject.name=unauth-stack",
        "-o",
        "name",
    ]);
    assert!(!events.trim().is_empty(), "a ConnectionFailure event on the Workspace");
    assert!(
        updates_of(&updates_api(ns), "unauth-stack").await.is_empty(),
        "no Update runs on a Workspace that is not Ready"
    );
    kubectl(&[
        "create",
        "clusterrolebinding",
        &format!("{release}-deployer-auth"),
        "--clusterrole=system:auth-delegator",
        &format!("--serviceaccount={}:deployer", ns.name()),
    ]);
    wait_for("the Stack Ready once the binding exists", 180, ns.name(), op_ns, || async {
        stacks.get("unauth-stack").await.is_ok_and(|s| ready(&s))
    })
    .await;

    // -- 3. a workspace pod deleted during a slow up: SIGTERM → CTRL-C, interrupted, converges after --
    let updates = updates_api(ns);
    let before = updates_of(&updates, "prog-stack").await.len();
    stacks
        .patch(
            "prog-stack",
            &PatchParams::default(),
            &Patch::Merge(json!({"spec": {"config": {"pause": "40", "greeting": "slow"}}})),
        )
        .await
        .unwrap();
    // the `up` is running when its command is (the sleep in the pod)
    wait_for("the slow up running in the workspace pod", 120, ns.name(), op_ns, || async {
        let out = testbed()
            .kubectl()
            .args([
                "exec",
                "-n",
                ns.name(),
                "prog-stack-workspace-0",
                "-c",
                "pulumi",
                "--",
                "sh",
                "-c",
                "ps -eo args 2>/dev/null || cat /proc/[0-9]*/cmdline | tr '\\0' ' '",
            ])
            .output()
            .unwrap();
        String::from_utf8_lossy(&out.stdout).contains("sleep 40")
    })
    .await;
    // the interrupted operation is handed over: the same Update runs again on the new pod and completes
    let (running, _) =
        common::cluster::delete_pod_mid_up(&updates, ns.name(), op_ns, "prog-stack-workspace-0", "prog-stack", before)
            .await;
    let logs = operator_logs(op_ns);
    assert!(
        logs.contains("operation interrupted by agent shutdown") && logs.contains(running.as_str()),
        "the operator saw the agent's Interrupted result:\n{logs}"
    );
    wait_for("the Stack converges after the interruption", 120, ns.name(), op_ns, || async {
        stacks.get("prog-stack").await.is_ok_and(|s| {
            ready(&s)
                && s.status
                    .as_ref()
                    .and_then(|s| s.outputs.as_ref())
                    .and_then(|o| o.get("said"))
                    .is_some_and(|v| v.as_str().is_some_and(|v| v.contains("slow")))
        })
    })
    .await;
    assert!(
        locks(std::path::Path::new(state_dir)).is_empty(),
        "no Pulumi lock left: {:?}",
        locks(std::path::Path::new(state_dir))
    );

    // -- 4. helm upgrade during a slow up: the operator rolls, the operation is not lost --
    let before = updates_of(&updates, "prog-stack").await.len();
    stacks
        .patch(
            "prog-stack",
            &PatchParams::default(),
            &Patch::Merge(json!({"spec": {"config": {"pause": "15", "greeting": "upgraded"}}})),
        )
        .await
        .unwrap();
    wait_for("the next up started", 120, ns.name(), op_ns, || async {
        updates_of(&updates, "prog-stack").await.len() > before
    })
    .await;
    let running = updates_of(&updates, "prog-stack").await.pop().unwrap().metadata.name.unwrap();
    let mut args = vec![
        "upgrade",
        release.as_str(),
        chart.as_str(),
        "--namespace",
        op_ns.as_str(),
        "--wait",
        "--timeout",
        "180s",
        "--set",
        "controller.logLevel=debug",
    ];
    args.extend(base_sets);
    let (ok, _, err) = helm(&args);
    assert!(ok, "helm upgrade: {err}");
    let pods_now: Vec<Pod> = op_pods
        .list(&ListParams::default().labels("app.kubernetes.io/name=pko-operator"))
        .await
        .unwrap()
        .items
        .into_iter()
        .filter(|p| p.metadata.deletion_timestamp.is_none())
        .collect();
    assert!(pods_now.iter().all(|p| p.metadata.uid != op_pod.metadata.uid), "helm upgrade rolled the operator pod");
    // PKO's level names reach the operator as PKO's flag (`--zap-log-level`), as the chart renders them
    let args = pods_now[0].spec.as_ref().unwrap().containers[0].args.clone().unwrap_or_default();
    assert!(args.iter().any(|a| a == "--zap-log-level=debug"), "the new value reached the operator: {args:?}");
    wait_for("the Stack converges on the upgraded operator", 300, ns.name(), op_ns, || async {
        stacks.get("prog-stack").await.is_ok_and(|s| {
            ready(&s)
                && s.status
                    .as_ref()
                    .and_then(|s| s.outputs.as_ref())
                    .and_then(|o| o.get("said"))
                    .is_some_and(|v| v.as_str().is_some_and(|v| v.contains("upgraded")))
        })
    })
    .await;
    assert!(stack_condition(&stacks.get("prog-stack").await.unwrap(), "Stalled").is_none_or(|c| c.0 != "True"));
    let u = updates.get(&running).await.unwrap();
    assert!(
        common::condition(&u, "Complete").is_some_and(|c| c.0 == "True") && !failed_update(&u),
        "the Update running across the upgrade completed: {:?}",
        u.status
    );
    assert_eq!(
        updates_of(&updates, "prog-stack").await.len(),
        before + 1,
        "the new operator followed the running Update instead of starting another"
    );

    // -- 5. Stacks deleted, helm uninstall: nothing left --
    for name in ["prog-stack", "git-stack", "unauth-stack", "bare-stack"] {
        stacks.delete(name, &DeleteParams::default()).await.unwrap();
    }
    wait_for("the Stacks gone (finalizers run by the operator in its pod)", 180, ns.name(), op_ns, || async {
        stacks.list(&ListParams::default()).await.unwrap().items.is_empty()
    })
    .await;
    let (ok, _, err) =
        helm(&["uninstall", release.as_str(), "--namespace", op_ns.as_str(), "--wait", "--timeout", "120s"]);
    assert!(ok, "helm uninstall: {err}");
    let sets: Api<StatefulSet> = Api::namespaced(client.clone(), ns.name());
    wait_for("no workload left", 120, ns.name(), op_ns, || async {
        deploys.list(&ListParams::default()).await.unwrap().items.is_empty()
            && op_pods.list(&ListParams::default()).await.unwrap().items.is_empty()
            && sets.list(&ListParams::default()).await.unwrap().items.is_empty()
            && pods.list(&ListParams::default()).await.unwrap().items.is_empty()
    })
    .await;
    let roles: Api<ClusterRole> = Api::all(client.clone());
    assert!(roles.get_opt("pko-operator").await.unwrap().is_none(), "the ClusterRole is gone");
    let out = kubectl(&["get", "apiservice", "v1alpha1.logs.pulumi.com", "--ignore-not-found", "-o", "name"]);
    assert!(out.trim().is_empty(), "the logs APIService is gone: {out}");
    drop(server);
}
