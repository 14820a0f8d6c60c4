//! The Stack controller (PKO `stack_controller.go`): finalizer, source resolution, the generated
//! Workspace, Updates created one at a time and absorbed when complete, status with PKO's conditions.
//! The decisions are the pure [`super::plan`] and [`super::build`]; this module is the I/O around them.

use std::sync::Arc;
use std::time::Duration;

use futures::StreamExt;
use k8s_openapi::api::core::v1::Secret;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::OwnerReference;
use kube::api::{Api, ApiResource, DynamicObject, GroupVersionKind, ObjectMeta, Patch, PatchParams, PostParams};
use kube::runtime::controller::Action;
use kube::runtime::reflector::ObjectRef;
use kube::runtime::{Controller, watcher};
use kube::{Resource, ResourceExt};
use pko_api::constants::{RECONCILE_REQUEST_ANNOTATION, STACK_FINALIZER, STACK_NAME_LABEL, event_reason as ev, field_manager, stack_condition as sc};
use pko_api::stack::{CurrentStackUpdate, StackStatus, StackUpdateState, StackUpdateStateMessage};
use pko_api::{Program, Stack, Update, UpdateType, Workspace};
use serde_json::json;

use super::build::{self, ResolvedSource};
use super::conditions;
use super::plan::{self, Sync};
use super::prerequisites;
use crate::context::Context;
use crate::k8s::{self, Severity};

/// Errors of a Stack reconcile (API errors; everything else becomes a condition).
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// API server error.
    #[error("{0}")]
    Kube(#[from] kube::Error),
}

/// Runs the Stack controller until shutdown.
pub async fn run(ctx: Arc<Context>) {
    controller(ctx).1.await
}

/// The Stack controller and its cache (which the metrics endpoint reads): run the future until
/// shutdown.
pub fn controller(ctx: Arc<Context>) -> (kube::runtime::reflector::Store<Stack>, impl std::future::Future<Output = ()> + Send) {
    let client = ctx.client.clone();
    let stacks: Api<Stack> = Api::all(client.clone());
    let controller = Controller::new(stacks, watcher::Config::default()).with_config(ctx.controller_config());
    let store = controller.store();
    let cache = store.clone();
    let by_label = |labels: Option<&std::collections::BTreeMap<String, String>>, ns: Option<String>| {
        labels.and_then(|l| l.get(STACK_NAME_LABEL)).map(|n| ObjectRef::<Stack>::new(n).within(&ns.unwrap_or_default()))
    };
    let run = controller
        .watches(Api::<Update>::all(client.clone()), watcher::Config::default().labels(STACK_NAME_LABEL), move |u: Update| {
            by_label(u.metadata.labels.as_ref(), u.metadata.namespace.clone())
        })
        .watches(Api::<Workspace>::all(client.clone()), watcher::Config::default().labels(STACK_NAME_LABEL), move |w: Workspace| {
            by_label(w.metadata.labels.as_ref(), w.metadata.namespace.clone())
        })
        .watches(Api::<Stack>::all(client.clone()), watcher::Config::default(), {
            let store = store.clone();
            move |s: Stack| {
                let (ns, name) = (s.namespace().unwrap_or_default(), s.name_any());
                let all = store.state();
                prerequisites::dependents(all.iter().map(|s| &**s), &ns, &name).into_iter().map(ObjectRef::from_obj).collect::<Vec<_>>()
            }
        })
        .watches(Api::<Program>::all(client.clone()), watcher::Config::default(), move |p: Program| {
            let (ns, name) = (p.namespace().unwrap_or_default(), p.name_any());
            store
                .state()
                .into_iter()
                .filter(|s| s.namespace().as_deref() == Some(ns.as_str()) && s.spec.program_ref.as_ref().is_some_and(|r| r.name == name))
                .map(|s| ObjectRef::from_obj(&*s))
                .collect::<Vec<_>>()
        })
        .graceful_shutdown_on(ctx.shutdown.clone().cancelled_owned())
        .run(
            reconcile,
            |_s, e, _c| {
                tracing::warn!(error = %e, "stack reconcile failed");
                Action::requeue(Duration::from_secs(5))
            },
            ctx,
        )
        .for_each(|_| async {});
    (cache, run)
}

async fn write_status(api: &Api<Stack>, name: &str, st: &StackStatus) -> Result<(), kube::Error> {
    k8s::apply_status(api, name, field_manager::STACK_STATUS, st).await
}

async fn set_finalizers(api: &Api<Stack>, stack: &Stack, add: bool) -> Result<(), kube::Error> {
    let mut f: Vec<String> = stack.finalizers().to_vec();
    if add {
        f.push(STACK_FINALIZER.into());
    } else {
        f.retain(|x| x != STACK_FINALIZER);
    }
    let patch = json!({"metadata": {"finalizers": f, "resourceVersion": stack.resource_version()}});
    api.patch(&stack.name_any(), &PatchParams::default(), &Patch::Merge(&patch)).await?;
    Ok(())
}

enum Resolved {
    Ok(ResolvedSource),
    Stalled(&'static str, String),
}

/// Why the Stack's git credentials could not be had: the API failed (the reconcile is retried), or the
/// spec names a Secret or key that is not there (the Stack is Stalled `SpecInvalid` with this text).
enum CredentialError {
    Kube(kube::Error),
    Invalid(String),
}

impl From<kube::Error> for CredentialError {
    fn from(e: kube::Error) -> Self {
        Self::Kube(e)
    }
}

/// The Stack's git credentials as Secret key references ([`build::git_auth`]), reading which keys the
/// deprecated `gitAuthSecret` holds.
async fn git_auth_refs(ctx: &Context, ns: &str, spec: &pko_api::StackSpec) -> Result<Option<pko_api::workspace::GitAuth>, CredentialError> {
    let keys = match (&spec.git_auth, &spec.git_auth_secret) {
        (None, Some(name)) => match Api::<Secret>::namespaced(ctx.client.clone(), ns).get_opt(name).await? {
            Some(s) => Some(s.data.unwrap_or_default().into_keys().chain(s.string_data.unwrap_or_default().into_keys()).collect()),
            None => return Err(CredentialError::Invalid(format!("spec.gitAuthSecret: Secret {name} not found"))),
        },
        _ => None,
    };
    Ok(build::git_auth(spec, keys.as_ref()))
}

/// The value of the Secret key `sel` (none: no selector), from `secrets` (the Secrets of the Stack's
/// namespace read so far, by name; a Secret is read once).
async fn secret_value(
    api: &Api<Secret>,
    secrets: &mut std::collections::BTreeMap<String, Option<Secret>>,
    sel: &Option<k8s_openapi::api::core::v1::SecretKeySelector>,
) -> Result<Option<String>, CredentialError> {
    let Some(sel) = sel else { return Ok(None) };
    if !secrets.contains_key(&sel.name) {
        secrets.insert(sel.name.clone(), api.get_opt(&sel.name).await?);
    }
    let secret = secrets[&sel.name].as_ref().ok_or_else(|| CredentialError::Invalid(format!("git credentials: Secret {} not found", sel.name)))?;
    let bytes = secret
        .data
        .as_ref()
        .and_then(|d| d.get(&sel.key))
        .map(|b| b.0.clone())
        .or_else(|| secret.string_data.as_ref().and_then(|d| d.get(&sel.key)).map(|s| s.clone().into_bytes()))
        .ok_or_else(|| CredentialError::Invalid(format!("git credentials: Secret {} has no key {}", sel.name, sel.key)))?;
    String::from_utf8(bytes).map(Some).map_err(|_| CredentialError::Invalid(format!("git credentials: key {} of Secret {} is not UTF-8", sel.key, sel.name)))
}

/// The values behind `auth`, read with the operator's identity for its own `ls-remote` (PKO resolves
/// git auth in the operator too).
async fn git_credentials(ctx: &Context, ns: &str, auth: Option<&pko_api::workspace::GitAuth>) -> Result<pko_git::GitCredentials, CredentialError> {
    let Some(auth) = auth else { return Ok(Default::default()) };
    let api: Api<Secret> = Api::namespaced(ctx.client.clone(), ns);
    let mut secrets = std::collections::BTreeMap::new();
    Ok(pko_git::GitCredentials {
        ssh_private_key: secret_value(&api, &mut secrets, &auth.ssh_private_key).await?,
        token: secret_value(&api, &mut secrets, &auth.token).await?,
        username: secret_value(&api, &mut secrets, &auth.username).await?,
        password: secret_value(&api, &mut secrets, &auth.password).await?,
    })
}

/// The git source of a Stack with `projectRepo`: the commit (given, or its branch resolved with
/// `ls-remote` and the Stack's credentials) and the credentials for the Workspace.
async fn resolve_git(ctx: &Context, ns: &str, spec: &pko_api::StackSpec, repo: &str) -> Result<Resolved, CredentialError> {
    // tenant input never reaches git as an option (docs/security.md)
    pko_git::validate_url(repo).map_err(|e| CredentialError::Invalid(format!("spec.projectRepo: {e}")))?;
    for (field, value) in [("spec.branch", &spec.branch), ("spec.commit", &spec.commit)] {
        if let Some(v) = value.as_deref().filter(|v| !v.is_empty()) {
            pko_git::validate_ref(field, v).map_err(CredentialError::Invalid)?;
        }
    }
    let auth = git_auth_refs(ctx, ns, spec).await?.map(Box::new);
    if let Some(c) = spec.commit.as_ref().filter(|c| !c.is_empty()) {
        return Ok(Resolved::Ok(ResolvedSource::Git { url: repo.to_string(), commit: c.clone(), auth }));
    }
    let creds = git_credentials(ctx, ns, auth.as_deref()).await?;
    let branch = spec.branch.clone().unwrap_or_default();
    Ok(match pko_git::ls_remote(repo, &branch, &creds).await {
        Ok(sha) => Resolved::Ok(ResolvedSource::Git { url: repo.to_string(), commit: sha, auth }),
        Err(e) => Resolved::Stalled(sc::SOURCE_UNAVAILABLE, format!("resolving branch {branch} of {repo}: {e}")),
    })
}

async fn resolve(ctx: &Context, stack: &Stack, deleting: bool) -> Result<Resolved, Error> {
    let ns = stack.namespace().unwrap_or_default();
    let spec = &stack.spec;
    let cached = stack.status.as_ref().and_then(|s| s.project_info.clone());
    // destroy from state when the source may be gone (PKO 2.8, #1222)
    if deleting && spec.run_program != Some(true) && cached.is_some() {
        return Ok(Resolved::Ok(ResolvedSource::ProjectInfo(cached.unwrap_or_default())));
    }
    if let Some(p) = &spec.program_ref {
        let program = Api::<Program>::namespaced(ctx.client.clone(), &ns).get_opt(&p.name).await?;
        return Ok(match program.and_then(|p| p.status).and_then(|s| s.artifact) {
            Some(a) => Resolved::Ok(ResolvedSource::Artifact { url: a.url, digest: a.digest.unwrap_or_default(), revision: a.revision.unwrap_or_default(), dir: None }),
            None => Resolved::Stalled(sc::SOURCE_UNAVAILABLE, format!("program {} has no artifact yet", p.name)),
        });
    }
    if let Some(repo) = &spec.project_repo {
        return match resolve_git(ctx, &ns, spec, repo).await {
            Ok(r) => Ok(r),
            Err(CredentialError::Invalid(e)) => Ok(Resolved::Stalled(sc::SPEC_INVALID, e)),
            Err(CredentialError::Kube(e)) => Err(e.into()),
        };
    }
    if let Some(f) = &spec.flux_source {
        let (group, version) = f.source_ref.api_version.rsplit_once('/').unwrap_or(("", &f.source_ref.api_version));
        let ar = ApiResource::from_gvk(&GroupVersionKind::gvk(group, version, &f.source_ref.kind));
        let obj = Api::<DynamicObject>::namespaced_with(ctx.client.clone(), &ns, &ar).get_opt(&f.source_ref.name).await;
        let artifact = obj.ok().flatten().and_then(|o| o.data.get("status").and_then(|s| s.get("artifact")).cloned());
        return Ok(match artifact {
            Some(a) if a["url"].is_string() && a["digest"].is_string() => Resolved::Ok(ResolvedSource::Artifact {
                url: a["url"].as_str().unwrap_or_default().into(),
                digest: a["digest"].as_str().unwrap_or_default().into(),
                revision: a["revision"].as_str().unwrap_or_default().into(),
                dir: f.dir.clone(),
            }),
            _ => Resolved::Stalled(sc::SOURCE_UNAVAILABLE, format!("{} {} has no status.artifact", f.source_ref.kind, f.source_ref.name)),
        });
    }
    Ok(match cached {
        Some(p) if deleting => Resolved::Ok(ResolvedSource::ProjectInfo(p)),
        _ => Resolved::Stalled(sc::SPEC_INVALID, "no source: set spec.projectRepo, spec.fluxSource or spec.programRef".into()),
    })
}

/// `workspaceReclaimPolicy: Delete` and the last update succeeded: the Workspace (and its agent) can go
/// until the next sync recreates it (PKO §2.7; a failed Stack keeps its Workspace for debugging, #826).
fn ready_and_reclaimable(stack: &Stack, st: &StackStatus) -> bool {
    stack.spec.workspace_reclaim_policy == Some(pko_api::stack::WorkspaceReclaimPolicy::Delete)
        && st.current_update.is_none()
        && st.last_update.as_ref().is_some_and(|l| l.state == Some(StackUpdateStateMessage::Succeeded))
}

/// Deletes the Stack's Workspace if it exists, with PKO's `WorkspaceDeleted` event.
async fn reclaim_workspace(ctx: &Context, stack: &Stack) -> Result<(), kube::Error> {
    let ns = stack.namespace().unwrap_or_default();
    let workspaces: Api<Workspace> = Api::namespaced(ctx.client.clone(), &ns);
    match workspaces.get_opt(&stack.name_any()).await? {
        Some(ws) if ws.metadata.deletion_timestamp.is_none() => {
            workspaces.delete(&stack.name_any(), &kube::api::DeleteParams::background()).await?;
            k8s::publish(&ctx.events.stack, stack, Severity::Normal, ev::WORKSPACE_DELETED, "Deleted the workspace (workspaceReclaimPolicy: Delete)".into()).await;
        }
        _ => {}
    }
    Ok(())
}

/// An Update of Stack `name` that is not complete yet (read from the API server, not a cache).
async fn in_flight_update(updates: &Api<Update>, name: &str) -> Result<Option<Update>, kube::Error> {
    let lp = kube::api::ListParams::default().labels(&format!("{STACK_NAME_LABEL}={name}"));
    Ok(updates.list(&lp).await?.items.into_iter().find(|u| !u.is_complete() && u.metadata.deletion_timestamp.is_none()))
}

/// Whether namespace `ns` is being deleted.
async fn namespace_terminating(ctx: &Context, ns: &str) -> Result<bool, kube::Error> {
    let namespace = Api::<k8s_openapi::api::core::v1::Namespace>::all(ctx.client.clone()).get_opt(ns).await?;
    Ok(namespace.is_some_and(|n| n.metadata.deletion_timestamp.is_some()))
}

/// The Stalled `NamespaceTerminating` message: why the destroy cannot run and how to let the Stack go.
fn namespace_terminating_message(ns: &str, name: &str) -> String {
    format!(
        "namespace {ns} is being deleted, so the destroy of this Stack (destroyOnFinalize) cannot run: no Workspace or Update can be created in it. \
         Either destroy the stack's resources yourself and remove the finalizer with \
         `kubectl -n {ns} patch stack {name} --type=json -p '[{{\"op\":\"remove\",\"path\":\"/metadata/finalizers\"}}]'`, \
         or apply a Stack with the same spec in another namespace to destroy them."
    )
}

/// PKO's "waiting for workspace readiness", followed by why the Workspace is not Ready when it says
/// (e.g. `: ConnectionFailed: serviceaccounts "deployer" not found`), so a Stack never waits silently.
fn workspace_wait_message(ws: &Workspace) -> String {
    match ws.not_ready_reason() {
        Some(c) => format!("{}: {}: {}", sc::WAITING_FOR_WORKSPACE_MESSAGE, c.reason, c.message),
        None => sc::WAITING_FOR_WORKSPACE_MESSAGE.to_string(),
    }
}

/// Text of the `StackUpdateConflictDetected` event: the lock holder's message and what happens next
/// (a retry after the cooldown, or the stall once the retry limit is reached).
fn conflict_message(last: Option<&StackUpdateState>, max_backoff_seconds: Option<i64>) -> String {
    let failures = last.and_then(|l| l.failures).unwrap_or(0);
    let cause = last.and_then(|l| l.message.clone()).unwrap_or_default();
    let next = if failures >= sc::MAX_UPDATE_FAILURES {
        "retry limit reached: the Stack is Stalled until the lock is gone and a sync is requested".to_string()
    } else {
        format!("retrying in {} s", plan::cooldown(failures, max_backoff_seconds).as_secs())
    };
    format!("Another update holds the stack lock ({cause}); {next}. A lock left by a dead process is cleared with `pulumi cancel`.")
}

/// Start of the `SpecInvalid` message when the API server refused the generated Workspace.
const REFUSED_WORKSPACE: &str = "spec.workspaceTemplate: the API server refused the Workspace";
/// Start of the `SpecInvalid` message when the API server refused the generated Update.
const REFUSED_UPDATE: &str = "spec.updateTemplate: the API server refused the Update";

/// Whether API error `e` on a generated object is a refusal of its content (HTTP 400 or 422: the
/// templates made it invalid), and the condition message: `<what>: <API message>`.
fn refusal(what: &str, e: &kube::Error) -> (bool, String) {
    match e {
        kube::Error::Api(s) if s.code == 400 || s.code == 422 => (true, format!("{what}: {}", s.message)),
        other => (false, format!("{what}: {other}")),
    }
}

/// Whether the Stack is Stalled because the API server refused a generated object of this generation.
fn refused_this_generation(conds: &[k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition], generation: Option<i64>) -> bool {
    conds.iter().any(|c| {
        c.type_ == sc::STALLED
            && c.status == "True"
            && c.reason == sc::SPEC_INVALID
            && c.observed_generation == generation
            && (c.message.starts_with(REFUSED_WORKSPACE) || c.message.starts_with(REFUSED_UPDATE))
    })
}

/// One reconcile of a Stack.
pub async fn reconcile(stack: Arc<Stack>, ctx: Arc<Context>) -> Result<Action, Error> {
    let ns = stack.namespace().unwrap_or_default();
    let name = stack.name_any();
    if !ctx.ownership.owns(&ns, &name) {
        return Ok(Action::await_change());
    }
    let api: Api<Stack> = Api::namespaced(ctx.client.clone(), &ns);
    // Decide on the Stack as stored, not as cached: the watch cache can lag behind our own status write
    // (`currentUpdate`), and a decision on the stale copy would start a second Update.
    let Some(stack) = api.get_opt(&name).await? else { return Ok(Action::await_change()) };
    let stack = Arc::new(stack);
    let deleting = stack.meta().deletion_timestamp.is_some();
    let has_finalizer = stack.finalizers().iter().any(|f| f == STACK_FINALIZER);
    if !deleting && !has_finalizer {
        set_finalizers(&api, &stack, true).await?;
        return Ok(Action::await_change());
    }
    if deleting && !has_finalizer {
        return Ok(Action::await_change());
    }
    let generation = stack.meta().generation;
    let request = stack.annotations().get(RECONCILE_REQUEST_ANNOTATION).cloned();
    let mut st = stack.status.clone().unwrap_or_default();
    st.observed_generation = generation;
    st.observed_reconcile_request = request.clone();
    let mut conds = st.conditions.clone().unwrap_or_default();
    let t = pko_api::conditions::now();
    let updates: Api<Update> = Api::namespaced(ctx.client.clone(), &ns);

    // 3. the current update: wait for it, absorb it, or heal a dangling reference (PKO #1292)
    if let Some(cur) = st.current_update.clone() {
        match updates.get_opt(cur.name.as_deref().unwrap_or_default()).await? {
            None => st.current_update = None,
            Some(u) if !u.is_complete() => {
                conditions::mark_reconciling(&mut conds, sc::STACK_PROCESSING, sc::STACK_BEING_PROCESSED_MESSAGE, generation, &t);
                st.conditions = Some(conds);
                write_status(&api, &name, &st).await?;
                return Ok(Action::requeue(Duration::from_secs(30)));
            }
            Some(u) => {
                let ok = u.succeeded();
                let prev = st.last_update.clone().unwrap_or_default();
                let same_request = prev.generation == cur.generation && prev.reconcile_request == cur.reconcile_request && prev.state == Some(StackUpdateStateMessage::Failed);
                let us = u.status.clone().unwrap_or_default();
                st.last_update = Some(StackUpdateState {
                    generation: cur.generation,
                    reconcile_request: cur.reconcile_request.clone(),
                    name: u.metadata.name.clone(),
                    update_type: u.spec.update_type,
                    state: Some(if ok { StackUpdateStateMessage::Succeeded } else { StackUpdateStateMessage::Failed }),
                    message: us.message.clone(),
                    last_attempted_commit: cur.commit.clone(),
                    last_successful_commit: if ok { cur.commit.clone() } else { prev.last_successful_commit.clone() },
                    permalink: us.permalink.clone(),
                    last_resync_time: Some(t.clone()),
                    failures: Some(if ok {
                        0
                    } else if same_request {
                        prev.failures.unwrap_or(0) + 1
                    } else {
                        0
                    }),
                });
                if ok {
                    if let Some(pi) = us.project_info.clone() {
                        st.project_info = Some(pi);
                    }
                    if let Some(secret) = us.outputs.as_deref()
                        && let Some(s) = Api::<Secret>::namespaced(ctx.client.clone(), &ns).get_opt(secret).await?
                    {
                        st.outputs = Some(crate::outputs::stack_outputs(&s));
                    }
                }
                st.current_update = None;
                st.conditions = Some(conds.clone());
                write_status(&api, &name, &st).await?;
                if ok {
                    k8s::publish(&ctx.events.stack, &*stack, Severity::Normal, ev::STACK_CREATED, "Successfully updated stack".into()).await;
                } else {
                    let msg = format!("Failed to update Stack: {}", us.message.clone().unwrap_or_default());
                    k8s::publish(&ctx.events.stack, &*stack, Severity::Warning, ev::STACK_UPDATE_FAILURE, msg).await;
                    if u.failed_reason() == Some(pko_api::constants::update_condition::UPDATE_CONFLICT) {
                        let msg = conflict_message(st.last_update.as_ref(), stack.spec.retry_max_backoff_duration_seconds);
                        k8s::publish(&ctx.events.stack, &*stack, Severity::Warning, ev::STACK_UPDATE_CONFLICT_DETECTED, msg).await;
                    }
                }
                // release the Update now that its result is recorded
                let f: Vec<String> = u.finalizers().iter().filter(|f| *f != STACK_FINALIZER).cloned().collect();
                updates.patch(&u.name_any(), &PatchParams::default(), &Patch::Merge(json!({"metadata": {"finalizers": f}}))).await?;
            }
        }
    }

    // 4. deletion without destroy: not asked for, or nothing ever ran (PKO: no prior update)
    if deleting && (stack.spec.destroy_on_finalize != Some(true) || stack.spec.preview == Some(true) || (st.last_update.is_none() && st.current_update.is_none())) {
        set_finalizers(&api, &stack, false).await?;
        return Ok(Action::await_change());
    }
    // a destroy cannot run in a terminating namespace (no Workspace or Update can be created there)
    if deleting && namespace_terminating(&ctx, &ns).await? {
        conditions::mark_stalled(&mut conds, sc::NAMESPACE_TERMINATING, &namespace_terminating_message(&ns, &name), generation, &t);
        st.conditions = Some(conds);
        write_status(&api, &name, &st).await?;
        return Ok(Action::requeue(Duration::from_secs(30)));
    }

    // 5–6. source and validation
    let source = match resolve(&ctx, &stack, deleting).await? {
        Resolved::Ok(s) => s,
        Resolved::Stalled(reason, msg) => {
            conditions::mark_stalled(&mut conds, reason, &msg, generation, &t);
            st.conditions = Some(conds);
            write_status(&api, &name, &st).await?;
            return Ok(Action::requeue(Duration::from_secs(30)));
        }
    };
    if let Err(e) = pko_api::validation::validate_stack_spec(&stack.spec, &ns) {
        k8s::publish(&ctx.events.stack, &*stack, Severity::Warning, ev::STACK_CONFIG_INVALID, e.to_string()).await;
        conditions::mark_stalled(&mut conds, sc::SPEC_INVALID, &e.to_string(), generation, &t);
        st.conditions = Some(conds);
        write_status(&api, &name, &st).await?;
        return Ok(Action::await_change());
    }
    // a template the API server refused stays refused for this generation: no retry loop (a spec change
    // — a new generation — tries again)
    if refused_this_generation(&conds, generation) {
        return Ok(Action::await_change());
    }
    let revision = source.revision();

    // 7. in sync?
    let checked = Stack { status: Some(st.clone()), ..(*stack).clone() };
    let reason = match plan::decide(&checked, &revision, t.0, stack.spec.branch.is_some(), deleting) {
        Sync::Synced { conditions: c, requeue_after } => {
            match c {
                plan::Conditions::Ready => conditions::mark_ready(&mut conds, generation, &t),
                plan::Conditions::Reconciling(r, m) => conditions::mark_reconciling(&mut conds, r, &m, generation, &t),
                plan::Conditions::Stalled(r, m) => conditions::mark_stalled(&mut conds, r, &m, generation, &t),
            }
            st.conditions = Some(conds);
            write_status(&api, &name, &st).await?;
            if deleting && st.last_update.as_ref().is_some_and(|l| l.update_type == Some(UpdateType::Destroy) && l.state == Some(StackUpdateStateMessage::Succeeded)) {
                set_finalizers(&api, &stack, false).await?;
                return Ok(Action::await_change());
            }
            if !deleting && ready_and_reclaimable(&stack, &st) {
                reclaim_workspace(&ctx, &stack).await?;
            }
            return Ok(requeue_after.map(Action::requeue).unwrap_or_else(Action::await_change));
        }
        Sync::NeedsUpdate { reason } => reason,
    };

    // 8. prerequisites (not while deleting: a missing prerequisite never blocks a destroy, PKO #751)
    if !deleting && let Some(prereqs) = stack.spec.prerequisites.as_ref().filter(|p| !p.is_empty()) {
        let mut found = std::collections::BTreeMap::new();
        for p in prereqs {
            if let Some(s) = api.get_opt(&p.name).await? {
                found.insert(p.name.clone(), s);
            }
        }
        if let prerequisites::Verdict::NotSatisfied { message, resync } = prerequisites::check(prereqs, &found, t.0) {
            for (prereq, value) in resync {
                let patch = json!({"apiVersion": "pulumi.com/v1", "kind": "Stack", "metadata": {"name": prereq, "annotations": {RECONCILE_REQUEST_ANNOTATION: value}}});
                api.patch(&prereq, &PatchParams::apply(field_manager::PREREQUISITE_REQUEST).force(), &Patch::Apply(&patch)).await?;
            }
            conditions::mark_reconciling(&mut conds, sc::PREREQUISITE_NOT_SATISFIED, &message, generation, &t);
            st.conditions = Some(conds);
            write_status(&api, &name, &st).await?;
            // woken by the prerequisites' changes (see `run`); the requeue only covers a missed event
            return Ok(Action::requeue(Duration::from_secs(300)));
        }
    }

    // 9. the Workspace, and wait for it
    let owner = stack.controller_owner_ref(&()).expect("stack has a uid");
    let mut ws_meta = ObjectMeta {
        name: Some(name.clone()),
        namespace: Some(ns.clone()),
        labels: Some(build::stack_labels(&name)),
        owner_references: Some(vec![owner.clone()]),
        ..Default::default()
    };
    if let Some(m) = stack.spec.workspace_template.as_ref().and_then(|t| t.metadata.clone()) {
        ws_meta.labels.get_or_insert_with(Default::default).extend(m.labels.unwrap_or_default());
        ws_meta.annotations = m.annotations;
    }
    let ws = Workspace { metadata: ws_meta, spec: build::workspace_spec(&stack.spec, &source), status: None };
    let ws = match Api::<Workspace>::namespaced(ctx.client.clone(), &ns).patch(&name, &PatchParams::apply(field_manager::OPERATOR).force(), &Patch::Apply(&ws)).await {
        Ok(ws) => ws,
        Err(e) => {
            let (stall, msg) = refusal(REFUSED_WORKSPACE, &e);
            if stall {
                conditions::mark_stalled(&mut conds, sc::SPEC_INVALID, &msg, generation, &t);
            } else {
                conditions::mark_reconciling(&mut conds, sc::STACK_PROCESSING, &msg, generation, &t);
            }
            st.conditions = Some(conds);
            write_status(&api, &name, &st).await?;
            return if stall { Ok(Action::await_change()) } else { Err(e.into()) };
        }
    };
    if !ws.is_ready() {
        conditions::mark_reconciling(&mut conds, sc::STACK_PROCESSING, &workspace_wait_message(&ws), generation, &t);
        st.conditions = Some(conds);
        write_status(&api, &name, &st).await?;
        return Ok(Action::requeue(Duration::from_secs(5)));
    }

    // 10. the Update: currentUpdate first, then the object — unless one is already in flight (a write
    // this reconcile could not see, or another replica's before a shard moved): then follow that one
    if let Some(running) = in_flight_update(&updates, &name).await? {
        tracing::info!(stack = %format!("{ns}/{name}"), update = %running.name_any(), "an update is already in flight; following it");
        st.current_update = Some(CurrentStackUpdate { generation, reconcile_request: request, name: running.metadata.name.clone(), commit: Some(revision) });
        conditions::mark_reconciling(&mut conds, sc::STACK_PROCESSING, sc::STACK_BEING_PROCESSED_MESSAGE, generation, &t);
        st.conditions = Some(conds);
        write_status(&api, &name, &st).await?;
        return Ok(Action::requeue(Duration::from_secs(30)));
    }
    let update_name = build::update_name(&name, generation, request.as_deref(), &revision, deleting, st.last_update.as_ref());
    st.current_update = Some(CurrentStackUpdate { generation, reconcile_request: request, name: Some(update_name.clone()), commit: Some(revision) });
    conditions::mark_reconciling(&mut conds, sc::STACK_PROCESSING, sc::STACK_BEING_PROCESSED_MESSAGE, generation, &t);
    st.conditions = Some(conds);
    write_status(&api, &name, &st).await?;
    let ws_owner = OwnerReference { controller: Some(true), ..ws.controller_owner_ref(&()).expect("workspace uid") };
    let stack_owner = OwnerReference { controller: Some(false), block_owner_deletion: Some(true), ..owner };
    let mut labels = build::stack_labels(&name);
    let mut annotations = std::collections::BTreeMap::new();
    if let Some(m) = stack.spec.update_template.as_ref().and_then(|t| t.metadata.clone()) {
        labels.extend(m.labels.unwrap_or_default());
        annotations.extend(m.annotations.unwrap_or_default());
    }
    let update = Update {
        metadata: ObjectMeta {
            name: Some(update_name.clone()),
            namespace: Some(ns.clone()),
            labels: Some(labels),
            annotations: (!annotations.is_empty()).then_some(annotations),
            owner_references: Some(vec![ws_owner, stack_owner]),
            finalizers: Some(vec![STACK_FINALIZER.into()]),
            ..Default::default()
        },
        spec: build::update_spec(&stack.spec, &name, deleting, &reason),
        status: None,
    };
    match updates.create(&PostParams::default(), &update).await {
        Ok(_) => {}
        // created by an earlier pass whose reconcile ended before this point: follow it
        Err(kube::Error::Api(s)) if s.code == 409 => return Ok(Action::requeue(Duration::from_secs(30))),
        Err(e) => {
            let (stall, msg) = refusal(REFUSED_UPDATE, &e);
            if stall {
                // one write undoes currentUpdate and says why; it stays so until the spec changes
                st.current_update = None;
                let mut conds = st.conditions.clone().unwrap_or_default();
                conditions::mark_stalled(&mut conds, sc::SPEC_INVALID, &msg, generation, &t);
                st.conditions = Some(conds);
                write_status(&api, &name, &st).await?;
                return Ok(Action::await_change());
            }
            // anything else is retried by the error policy: currentUpdate stays as written (the next pass
            // heals the dangling name and writes the same one again — no change, so no watch event)
            k8s::publish(&ctx.events.stack, &*stack, Severity::Warning, ev::STACK_UPDATE_FAILURE, msg).await;
            return Err(e.into());
        }
    }
    tracing::info!(stack = %format!("{ns}/{name}"), update = %update_name, %reason, "stack update started");
    k8s::publish(&ctx.events.stack, &*stack, Severity::Normal, ev::STACK_UPDATE_DETECTED, reason).await;
    Ok(Action::requeue(Duration::from_secs(30)))
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;

    fn failed(failures: i64) -> StackUpdateState {
        StackUpdateState { failures: Some(failures), message: Some("the stack is currently locked by 1 lock(s)".into()), ..Default::default() }
    }

    #[test]
    fn only_a_succeeded_stack_with_the_delete_policy_reclaims_its_workspace() {
        use pko_api::stack::WorkspaceReclaimPolicy;
        let mut stack = Stack::new("s", pko_api::StackSpec { stack: "dev".into(), ..Default::default() });
        let ok = StackStatus { last_update: Some(StackUpdateState { state: Some(StackUpdateStateMessage::Succeeded), ..Default::default() }), ..Default::default() };
        assert!(!ready_and_reclaimable(&stack, &ok), "Retain is the default");
        stack.spec.workspace_reclaim_policy = Some(WorkspaceReclaimPolicy::Delete);
        assert!(ready_and_reclaimable(&stack, &ok));
        let failed = StackStatus { last_update: Some(failed(0)), ..Default::default() };
        assert!(!ready_and_reclaimable(&stack, &failed), "a failed Stack keeps its Workspace for debugging");
        let running = StackStatus { current_update: Some(Default::default()), ..ok };
        assert!(!ready_and_reclaimable(&stack, &running));
    }

    #[test]
    fn a_waiting_stack_says_why_its_workspace_is_not_ready() {
        use k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition;
        let mut ws = Workspace::new("w", Default::default());
        assert_eq!(workspace_wait_message(&ws), "waiting for workspace readiness");
        ws.status = Some(pko_api::workspace::WorkspaceStatus {
            conditions: Some(vec![Condition {
                type_: "Ready".into(),
                status: "False".into(),
                reason: "ConnectionFailed".into(),
                message: "serviceaccounts \"deployer\" not found".into(),
                observed_generation: None,
                last_transition_time: Time(k8s_openapi::jiff::Timestamp::UNIX_EPOCH),
            }]),
            ..Default::default()
        });
        assert_eq!(workspace_wait_message(&ws), "waiting for workspace readiness: ConnectionFailed: serviceaccounts \"deployer\" not found");
    }

    #[test]
    fn namespace_terminating_message_says_how_to_let_go() {
        let m = namespace_terminating_message("team-a", "web");
        assert!(m.contains("namespace team-a is being deleted"), "{m}");
        assert!(m.contains("kubectl -n team-a patch stack web"), "{m}");
        assert!(m.contains(r#""path":"/metadata/finalizers""#), "{m}");
    }

    #[test]
    fn a_refused_template_stalls_for_its_generation_only() {
        use k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition;
        let api = |code: u16| kube::Error::Api(kube::core::Status::failure("metadata.labels: Invalid value: \"bad!\"", "Invalid").with_code(code).boxed());
        let (stall, msg) = refusal(REFUSED_UPDATE, &api(422));
        assert!(stall && msg.starts_with("spec.updateTemplate: the API server refused the Update: metadata.labels"), "{msg}");
        assert!(!refusal(REFUSED_UPDATE, &api(500)).0, "a server error is retried");
        let stalled = |message: &str, generation: i64| Condition {
            type_: sc::STALLED.into(),
            status: "True".into(),
            reason: sc::SPEC_INVALID.into(),
            message: message.into(),
            observed_generation: Some(generation),
            last_transition_time: Time(k8s_openapi::jiff::Timestamp::UNIX_EPOCH),
        };
        assert!(refused_this_generation(&[stalled(&msg, 3)], Some(3)));
        assert!(!refused_this_generation(&[stalled(&msg, 3)], Some(4)), "a new generation tries again");
        assert!(!refused_this_generation(&[stalled("spec.envRefs.X: bad", 3)], Some(3)), "other stalls are decided afresh");
    }

    #[test]
    fn conflict_message_names_the_lock_and_the_next_step() {
        let first = conflict_message(Some(&failed(0)), None);
        assert!(first.contains("currently locked by 1 lock(s)"), "{first}");
        assert!(first.contains("retrying in 10 s"), "{first}");
        assert!(conflict_message(Some(&failed(1)), Some(5)).contains("retrying in 5 s"));
        let last = conflict_message(Some(&failed(3)), None);
        assert!(last.contains("retry limit reached"), "{last}");
    }
}
