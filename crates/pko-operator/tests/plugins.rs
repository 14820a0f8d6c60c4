//! YAML programs get their provider plugins as PKO's workspaces do: `pulumi install` runs for every
//! runtime (YAML included) with plugin acquisition on, and Pulumi downloads the plugin for real — here
//! from a loopback plugin server, through Pulumi's `PULUMI_PLUGIN_DOWNLOAD_URL_OVERRIDES`. Ambient
//! plugins are ignored in these Stacks, so the deploy can only succeed with the downloaded plugin. A
//! plugin version the server lacks fails the Update with a message naming the plugin, and — as PKO's
//! Workspace lifecycle — stalls the Workspace (`InstallationFailed`, with PKO's `InstallationFailure`
//! event) and the Stack (`WorkspaceFailed`) instead of retrying; once the plugin is served, a sync
//! request deploys and clears the stall (`Initialized`).

mod common;

use std::sync::{Arc, Mutex};

use common::*;
use pko_api::{Stack, Update};
use pko_testbed::eventually;
use serde_json::json;

/// A loopback plugin server: `GET /plugins/<file>` serves `<dir>/<file>` (404 otherwise) and records
/// every path asked for.
struct PluginServer {
    url: String,
    requests: Arc<Mutex<Vec<String>>>,
    task: tokio::task::JoinHandle<()>,
}

impl Drop for PluginServer {
    fn drop(&mut self) {
        self.task.abort();
    }
}

async fn plugin_server(dir: std::path::PathBuf) -> PluginServer {
    use axum::extract::{Path, State};
    use axum::http::StatusCode;
    let requests: Arc<Mutex<Vec<String>>> = Arc::default();
    let state = (dir, requests.clone());
    let app =
        axum::Router::new()
            .route(
                "/plugins/{file}",
                axum::routing::get(
                    |State((dir, seen)): State<(std::path::PathBuf, Arc<Mutex<Vec<String>>>)>,
                     Path(file): Path<String>| async move {
                        seen.lock().unwrap().push(file.clone());
                        match std::fs::read(dir.join(&file)) {
                            Ok(bytes) if !file.contains('/') => Ok(bytes),
                            _ => Err(StatusCode::NOT_FOUND),
                        }
                    },
                ),
            )
            .with_state(state);
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}/plugins", listener.local_addr().unwrap());
    let task = tokio::spawn(async move {
        axum::serve(listener, app).await.unwrap();
    });
    PluginServer { url, requests, task }
}

/// The test bed's `command` provider as a plugin archive, named as Pulumi's plugin download URLs name
/// them: `pulumi-resource-command-v<version>-linux-amd64.tar.gz` holding `pulumi-resource-command`.
fn command_plugin_archive(env: &pko_testbed::PulumiEnv, dir: &std::path::Path, version: &str) -> String {
    let path_var = env.vars().into_iter().find(|(k, _)| k == "PATH").unwrap().1;
    let launcher = std::env::split_paths(&path_var)
        .map(|d| d.join("pulumi-resource-command"))
        .find(|p| p.is_file())
        .expect("the bed's pulumi-resource-command");
    let name = format!("pulumi-resource-command-v{version}-linux-amd64.tar.gz");
    let file = std::fs::File::create(dir.join(&name)).unwrap();
    let mut tar = tar::Builder::new(flate2::write::GzEncoder::new(file, flate2::Compression::default()));
    let body = std::fs::read(&launcher).unwrap();
    let mut header = tar::Header::new_gnu();
    header.set_size(body.len() as u64);
    header.set_mode(0o755);
    header.set_cksum();
    tar.append_data(&mut header, "pulumi-resource-command", body.as_slice()).unwrap();
    tar.into_inner().unwrap().finish().unwrap();
    name
}

/// A Stack of Program `program` whose Pulumi processes ignore plugins on PATH, may download plugins,
/// and download them from `server`.
fn stack(env: &pko_testbed::PulumiEnv, name: &str, program: &str, server: &str) -> serde_json::Value {
    json!({"apiVersion": "pulumi.com/v1", "kind": "Stack", "metadata": {"name": name},
           "spec": {"stack": name, "programRef": {"name": program}, "backend": env.backend_url(),
                    "envRefs": passphrase_env_refs(),
                    "workspaceTemplate": {"spec": {"env": [
                        {"name": "PULUMI_IGNORE_AMBIENT_PLUGINS", "value": "true"},
                        {"name": "PULUMI_DISABLE_AUTOMATIC_PLUGIN_ACQUISITION", "value": "false"},
                        {"name": "PULUMI_PLUGIN_DOWNLOAD_URL_OVERRIDES",
                            "value": format!("^github://api.github.com/pulumi={server}")}]}}}})
}

fn program(name: &str, version: &str) -> serde_json::Value {
    json!({"apiVersion": "pulumi.com/v1", "kind": "Program", "metadata": {"name": name},
           "program": {"resources": {"hello": {"type": "command:local:Command",
               "properties": {"create": "echo plugged in"}, "options": {"version": version}}},
                       "outputs": {"out": "${hello.stdout}"}}})
}

#[tokio::test]
async fn a_yaml_program_downloads_its_plugin_and_a_missing_one_is_named() {
    let (client, ns, env) = setup("plugins").await;
    let served = env.dir().join("plugin-server");
    std::fs::create_dir_all(&served).unwrap();
    let archive = command_plugin_archive(&env, &served, "1.2.1");
    let server = plugin_server(served.clone()).await;
    passphrase_secret(&ns).await;
    create(&ns.api::<pko_api::Program>(), program("served", "1.2.1")).await;
    create(&ns.api::<pko_api::Program>(), program("unserved", "9.9.9")).await;
    let _op = InProcessOperator::start(&client, &env, ns.name()).await;
    let stacks = ns.api::<Stack>();
    create(&stacks, stack(&env, "served", "served", &server.url)).await;
    create(&stacks, stack(&env, "unserved", "unserved", &server.url)).await;
    // PKO's proposed skipInstall (PR #1298): no `pulumi install`; the operation itself meets the plugin
    let mut skipped = stack(&env, "skipped", "unserved", &server.url);
    skipped["spec"]["workspaceTemplate"]["spec"]["skipInstall"] = json!(true);
    create(&stacks, skipped).await;

    eventually("the Stack with a served plugin is Ready", 180, || async {
        ready(&stacks.get("served").await.unwrap())
    })
    .await;
    let st = stacks.get("served").await.unwrap().status.unwrap();
    assert_eq!(st.outputs.unwrap()["out"], json!("plugged in"), "the downloaded plugin ran the command");
    assert!(
        server.requests.lock().unwrap().contains(&archive),
        "the plugin was downloaded from the loopback server: {:?}",
        server.requests.lock().unwrap()
    );

    // the missing version fails its Update, with Pulumi's message naming the plugin and the URL tried
    let missing = "pulumi-resource-command-v9.9.9-linux-amd64.tar.gz";
    eventually("the Stack with a missing plugin has a failed Update", 180, || async {
        let s = stacks.get("unserved").await.unwrap();
        s.status
            .and_then(|st| st.last_update)
            .is_some_and(|l| l.state == Some(pko_api::stack::StackUpdateStateMessage::Failed))
    })
    .await;
    let updates = ns.api::<Update>().list(&Default::default()).await.unwrap().items;
    let failed: Vec<&Update> = updates
        .iter()
        .filter(|u| {
            u.spec.stack_name.as_deref() == Some("unserved") && condition(u, "Failed").is_some_and(|(s, _)| s == "True")
        })
        .collect();
    assert!(!failed.is_empty(), "a failed Update of the unserved Stack");
    let message = failed[0].status.as_ref().and_then(|s| s.message.clone()).unwrap_or_default();
    assert!(message.contains("command-9.9.9") && message.contains(missing), "the failure names the plugin: {message}");
    let last = stacks.get("unserved").await.unwrap().status.unwrap().last_update.unwrap();
    assert!(last.message.unwrap_or_default().contains("command-9.9.9"), "the Stack's lastUpdate names the plugin");
    assert!(server.requests.lock().unwrap().iter().any(|r| r == missing), "the missing plugin was asked for");
    // `pulumi install` ran before the operation, as PKO's install step: the stack was never created
    let state: Vec<_> = files_under(&env.dir().join("state"))
        .into_iter()
        .filter(|p| p.to_string_lossy().contains("unserved") && !p.to_string_lossy().contains("skipped"))
        .collect();
    assert!(state.is_empty(), "the failed install touched no stack: {state:?}");
    assert!(message.starts_with("up failed: pulumi install failed"), "the failure names the step: {message}");

    eventually("the skipInstall Stack has a failed Update", 180, || async {
        let s = stacks.get("skipped").await.unwrap();
        s.status
            .and_then(|st| st.last_update)
            .is_some_and(|l| l.state == Some(pko_api::stack::StackUpdateStateMessage::Failed))
    })
    .await;
    let skipped = stacks.get("skipped").await.unwrap().status.unwrap().last_update.unwrap().message.unwrap_or_default();
    assert!(
        !skipped.contains("pulumi install") && skipped.contains("command-9.9.9"),
        "install skipped, the operation met the missing plugin: {skipped}"
    );
    assert_eq!(
        ns.api::<pko_api::Workspace>().get("skipped").await.unwrap().spec.skip_install,
        Some(true),
        "through the Stack's workspaceTemplate"
    );

    // PKO's Workspace lifecycle: the Workspace is Stalled InstallationFailed (Ready False with that
    // reason), the Stack Stalled WorkspaceFailed "<reason>: <message>", and nothing is retried
    let workspaces = ns.api::<pko_api::Workspace>();
    eventually("the Stack is Stalled WorkspaceFailed", 60, || async {
        stalled(&stacks.get("unserved").await.unwrap()).is_some_and(|(r, _)| r == "WorkspaceFailed")
    })
    .await;
    let (_, stack_message) = stalled(&stacks.get("unserved").await.unwrap()).unwrap();
    assert!(
        stack_message.starts_with("InstallationFailed: pulumi install failed")
            && stack_message.contains("command-9.9.9"),
        "{stack_message}"
    );
    let ws = workspaces.get("unserved").await.unwrap();
    let stall = ws.stalled().expect("the Workspace is Stalled");
    assert_eq!(stall.reason, "InstallationFailed");
    eventually("the Workspace is not Ready, with the stall's reason", 30, || async {
        workspaces
            .get("unserved")
            .await
            .unwrap()
            .not_ready_reason()
            .is_some_and(|c| c.reason == "InstallationFailed" && c.message.contains("command-9.9.9"))
    })
    .await;
    let events = ns.api::<k8s_openapi::api::events::v1::Event>().list(&Default::default()).await.unwrap().items;
    assert!(
        events.iter().any(|e| e.reason.as_deref() == Some("InstallationFailure")
            && e.regarding
                .as_ref()
                .is_some_and(|r| r.kind.as_deref() == Some("Workspace") && r.name.as_deref() == Some("unserved"))
            && e.note.as_deref().is_some_and(|n| n.contains("command-9.9.9"))),
        "PKO's InstallationFailure event on the Workspace"
    );
    // the first retry would come after 10 s (PKO's backoff): none comes, as in PKO
    tokio::time::sleep(std::time::Duration::from_secs(15)).await;
    let tried =
        |updates: &[Update]| updates.iter().filter(|u| u.spec.stack_name.as_deref() == Some("unserved")).count();
    assert_eq!(
        tried(&ns.api::<Update>().list(&Default::default()).await.unwrap().items),
        1,
        "a stalled workspace is not retried"
    );

    // the plugin is served now: the Workspace controller's initialization, tried again every minute
    // while stalled, mends the Workspace (PKO would need a new pod); the Stack deploys
    command_plugin_archive(&env, &served, "9.9.9");
    let request = json!({"metadata": {"annotations": {"pulumi.com/reconciliation-request": "plugin-published"}}});
    stacks.patch("unserved", &kube::api::PatchParams::default(), &kube::api::Patch::Merge(&request)).await.unwrap();
    eventually("the Stack deploys once the plugin is served", 180, || async {
        ready(&stacks.get("unserved").await.unwrap())
    })
    .await;
    eventually("the Workspace's stall is cleared", 30, || async {
        let ws = workspaces.get("unserved").await.unwrap();
        ws.stalled().is_none() && ws.is_ready()
    })
    .await;
    let events = ns.api::<k8s_openapi::api::events::v1::Event>().list(&Default::default()).await.unwrap().items;
    assert!(
        events.iter().any(|e| e.reason.as_deref() == Some("Initialized")
            && e.regarding.as_ref().is_some_and(|r| r.name.as_deref() == Some("unserved"))),
        "PKO's Initialized event"
    );
}
