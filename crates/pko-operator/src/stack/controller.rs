//! The Stack controller (PKO `stack_controller.go`): its watches, and the I/O the reconcile steps
//! ([`super::reconcile`]) call — source resolution (Program, git `ls-remote` with the Stack's
//! credentials, Flux sources), finalizer and status writes, and the messages PKO's conditions carry.

use std::sync::Arc;

use k8s_openapi::api::core::v1::Secret;
use kube::ResourceExt;
use kube::api::{Api, DynamicObject, Patch, PatchParams};
use kube::runtime::Controller;
use kube::runtime::reflector::{ObjectRef, Store};
use pko_api::constants::{STACK_FINALIZER, STACK_NAME_LABEL, event_reason as ev, field_manager, stack_condition as sc};
use pko_api::stack::{StackStatus, StackUpdateState, StackUpdateStateMessage};
use pko_api::{Program, Stack, Update, Workspace};
use serde_json::json;

use super::build::{self, ResolvedSource};
use super::plan;
use super::prerequisites;
use crate::context::Context;
use crate::informer::Informers;
use crate::k8s::{self, Severity};

/// The Stack controller and its cache (which the metrics endpoint reads), watching through
/// `informers`: Stacks (itself, and the Stacks whose prerequisites a change may satisfy), the
/// Updates, Workspaces and Programs that wake a Stack, and the Flux sources Stacks refer to
/// ([`super::flux`]). Run the future until shutdown.
pub fn controller(ctx: Arc<Context>, informers: &mut Informers) -> (Store<Stack>, impl std::future::Future<Output = ()> + Send + 'static) {
    let state = Arc::new(super::reconcile::StackController { ctx: ctx.clone(), updates: informers.updates().store(), programs: informers.programs().store() });
    let store = informers.stacks().store();
    let controller = Controller::for_stream(informers.stacks().objects(), store.clone());
    let by_label = |labels: Option<&std::collections::BTreeMap<String, String>>, ns: Option<String>| {
        labels.and_then(|l| l.get(STACK_NAME_LABEL)).map(|n| ObjectRef::<Stack>::new(n).within(&ns.unwrap_or_default()))
    };
    let dependents = store.clone();
    let by_program = store.clone();
    let controller = controller
        .watches_stream(informers.updates().objects(), move |u: Update| by_label(u.metadata.labels.as_ref(), u.metadata.namespace.clone()))
        .watches_stream(informers.workspaces().objects(), move |w: Workspace| by_label(w.metadata.labels.as_ref(), w.metadata.namespace.clone()))
        .watches_stream(informers.stacks().objects(), move |s: Stack| {
            let (ns, name) = (s.namespace().unwrap_or_default(), s.name_any());
            dependents.state_filter(|s| prerequisites::depends_on(s, &ns, &name)).iter().map(|s| ObjectRef::from_obj(&**s)).collect::<Vec<_>>()
        })
        .watches_stream(informers.programs().objects(), move |p: Program| {
            let (ns, name) = (p.namespace().unwrap_or_default(), p.name_any());
            by_program
                .state_filter(|s| s.namespace().as_deref() == Some(ns.as_str()) && s.spec.program_ref.as_ref().is_some_and(|r| r.name == name))
                .iter()
                .map(|s| ObjectRef::from_obj(&**s))
                .collect::<Vec<_>>()
        });
    // Flux sources: a new artifact revision reconciles the Stacks that refer to it
    let (flux_tx, flux_rx) = tokio::sync::mpsc::channel(1024);
    let flux = super::flux::run(informers.client().clone(), informers.scope().clone(), informers.stacks().subscribe(), store.clone(), flux_tx);
    let controller = controller.reconcile_on(tokio_stream::wrappers::ReceiverStream::new(flux_rx));
    let run = async move {
        let own = ctx.clone();
        tokio::select! {
            () = k8s::run_controller(controller, own.running(), "stack", super::reconcile::reconcile, state) => {}
            () = async { flux.await; std::future::pending::<()>().await } => {}
        }
    };
    (store, run)
}

pub(super) async fn write_status(api: &Api<Stack>, name: &str, st: &StackStatus) -> Result<(), kube::Error> {
    k8s::apply_status(api, name, field_manager::STACK_STATUS, st).await
}

/// Adds (`add`) or removes the Stack finalizer with a JSON patch whose `test` operations pin the
/// finalizer list as read (kube-runtime's `finalizer` pattern): another controller's finalizer is never
/// clobbered, and a status write of the same pass (which moves `resourceVersion`) is no conflict.
pub(super) async fn set_finalizers(api: &Api<Stack>, stack: &Stack, add: bool) -> Result<(), kube::Error> {
    let patch = finalizer_patch(stack.finalizers(), add);
    if patch.is_empty() {
        return Ok(());
    }
    let patch: json_patch::Patch = serde_json::from_value(serde_json::Value::Array(patch)).map_err(kube::Error::SerdeError)?;
    api.patch(&stack.name_any(), &PatchParams::default(), &Patch::<()>::Json(patch)).await?;
    Ok(())
}

/// The JSON patch operations that add or remove [`STACK_FINALIZER`] given the current list (empty: nothing
/// to do). Pure.
fn finalizer_patch(current: &[String], add: bool) -> Vec<serde_json::Value> {
    let at = current.iter().position(|f| f == STACK_FINALIZER);
    match (add, at) {
        (true, Some(_)) | (false, None) => Vec::new(),
        (true, None) if current.is_empty() => {
            vec![json!({"op": "test", "path": "/metadata/finalizers", "value": null}), json!({"op": "add", "path": "/metadata/finalizers", "value": [STACK_FINALIZER]})]
        }
        (true, None) => {
            vec![json!({"op": "test", "path": "/metadata/finalizers", "value": current}), json!({"op": "add", "path": "/metadata/finalizers/-", "value": STACK_FINALIZER})]
        }
        (false, Some(i)) => {
            vec![json!({"op": "test", "path": format!("/metadata/finalizers/{i}"), "value": STACK_FINALIZER}), json!({"op": "remove", "path": format!("/metadata/finalizers/{i}")})]
        }
    }
}

/// A source at a revision, or why the Stack stalls.
pub(super) enum Resolved {
    /// The source.
    Source(ResolvedSource),
    /// The Stalled reason and message.
    Stalled(&'static str, String),
}

/// Why the Stack's git credentials could not be had: the API failed (the reconcile is retried), or the
/// spec names a Secret or key that is not there (the Stack is Stalled `SpecInvalid` with this text).
enum CredentialError {
    Kube(kube::Error),
    Invalid(String),
    /// The GitHub App token exchange failed: Stalled `SourceUnavailable`, tried again in 30 s.
    Unavailable(String),
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
            None => return Err(CredentialError::Invalid(format!("unable to get secret {ns}/{name}: secrets {name:?} not found (spec.gitAuthSecret)"))),
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
    ns: &str,
    sel: &Option<k8s_openapi::api::core::v1::SecretKeySelector>,
) -> Result<Option<String>, CredentialError> {
    let Some(sel) = sel else { return Ok(None) };
    if !secrets.contains_key(&sel.name) {
        secrets.insert(sel.name.clone(), api.get_opt(&sel.name).await?);
    }
    // PKO's text (`resolveGitAuth`), then ours
    let secret = secrets[&sel.name]
        .as_ref()
        .ok_or_else(|| CredentialError::Invalid(format!("unable to get secret {ns}/{name}: secrets {name:?} not found (git credentials)", name = sel.name)))?;
    let bytes = secret
        .data
        .as_ref()
        .and_then(|d| d.get(&sel.key))
        .map(|b| b.0.clone())
        .or_else(|| secret.string_data.as_ref().and_then(|d| d.get(&sel.key)).map(|s| s.clone().into_bytes()))
        .ok_or_else(|| CredentialError::Invalid(format!("git credentials: Secret {} has no key {}", sel.name, sel.key)))?;
    String::from_utf8(bytes).map(Some).map_err(|_| CredentialError::Invalid(format!("git credentials: key {} of Secret {} is not UTF-8", sel.key, sel.name)))
}

/// Every Secret key `auth` names exists (read with the operator's identity, each Secret once).
///
/// Errors: [`CredentialError::Invalid`] naming the first missing Secret or key.
async fn check_credentials(ctx: &Context, ns: &str, auth: Option<&pko_api::workspace::GitAuth>) -> Result<(), CredentialError> {
    let Some(auth) = auth else { return Ok(()) };
    let api: Api<Secret> = Api::namespaced(ctx.client.clone(), ns);
    let mut secrets = std::collections::BTreeMap::new();
    let app = auth.github_app.as_ref();
    for sel in [&auth.token, &auth.ssh_private_key, &auth.username, &auth.password] {
        secret_value(&api, &mut secrets, ns, sel).await?;
    }
    for sel in [app.map(|a| &a.app_id), app.map(|a| &a.installation_id), app.map(|a| &a.private_key)].into_iter().flatten() {
        secret_value(&api, &mut secrets, ns, sel).await?;
    }
    Ok(())
}

/// The values behind `auth`, read with the operator's identity for its own `ls-remote` (PKO resolves
/// git auth in the operator too).
async fn git_credentials(ctx: &Context, ns: &str, auth: Option<&pko_api::workspace::GitAuth>) -> Result<pko_git::GitCredentials, CredentialError> {
    let Some(auth) = auth else { return Ok(Default::default()) };
    let api: Api<Secret> = Api::namespaced(ctx.client.clone(), ns);
    let mut secrets = std::collections::BTreeMap::new();
    // a GitHub App's credentials buy an installation token, used as a personal access token (PKO)
    let mut token = secret_value(&api, &mut secrets, ns, &auth.token).await?;
    if let Some(app) = &auth.github_app {
        let app_id = secret_value(&api, &mut secrets, ns, &app.app_id).await?.unwrap_or_default();
        let installation = secret_value(&api, &mut secrets, ns, &app.installation_id).await?.unwrap_or_default();
        let key = secret_value(&api, &mut secrets, ns, &app.private_key).await?.unwrap_or_default();
        let exchanged = pko_git::github_app::installation_token(&ctx.github_api_url, &app_id, &installation, &key).await;
        token = Some(exchanged.map_err(|e| match e {
            pko_git::github_app::GitHubAppError::NotANumber(..) | pko_git::github_app::GitHubAppError::Key(_) => CredentialError::Invalid(format!("spec.gitAuth.githubApp: {e}")),
            _ => CredentialError::Unavailable(format!("spec.gitAuth.githubApp: {e}")),
        })?);
    }
    Ok(pko_git::GitCredentials {
        ssh_private_key: secret_value(&api, &mut secrets, ns, &auth.ssh_private_key).await?,
        token,
        username: secret_value(&api, &mut secrets, ns, &auth.username).await?,
        password: secret_value(&api, &mut secrets, ns, &auth.password).await?,
    })
}

/// What is wrong with the commit and branch of a Stack with `projectRepo`, in PKO's words
/// (`git.go` `NewGitSource`): neither set, or both. Pure.
fn git_ref_error(spec: &pko_api::StackSpec) -> Option<&'static str> {
    let set = |v: &Option<String>| v.as_deref().is_some_and(|v| !v.is_empty());
    match (set(&spec.commit), set(&spec.branch)) {
        (false, false) => Some(r#"missing "commit" or "branch""#),
        (true, true) => Some(r#"only one of "commit" or "branch" should be specified"#),
        _ => None,
    }
}

/// The git source of a Stack with `projectRepo`: the commit (given, or its branch resolved with
/// `ls-remote` and the Stack's credentials) and the credentials for the Workspace.
async fn resolve_git(ctx: &Context, ns: &str, spec: &pko_api::StackSpec, repo: &str) -> Result<Resolved, CredentialError> {
    // tenant input never reaches git as an option (docs/security.md)
    // PKO's text (`NewGitSource`: `parsing "<url>": invalid Git URL`), then what is wrong
    pko_git::validate_url(repo).map_err(|e| CredentialError::Invalid(format!("parsing {repo:?}: invalid Git URL: spec.projectRepo: {e}")))?;
    // PKO's `NewGitSource` checks and texts (admission accepts these specs, as PKO's CRD does)
    if let Some(e) = git_ref_error(spec) {
        return Err(CredentialError::Invalid(e.into()));
    }
    for (field, value) in [("spec.branch", &spec.branch), ("spec.commit", &spec.commit)] {
        if let Some(v) = value.as_deref().filter(|v| !v.is_empty()) {
            pko_git::validate_ref(field, v).map_err(CredentialError::Invalid)?;
        }
    }
    let auth = git_auth_refs(ctx, ns, spec).await?.map(Box::new);
    if let Some(c) = spec.commit.as_ref().filter(|c| !c.is_empty()) {
        // PKO reads the credentials whatever the ref: a missing Secret or key stalls the Stack before
        // any Workspace or Update exists (no exchange: a pinned commit needs no GitHub App token here)
        check_credentials(ctx, ns, auth.as_deref()).await?;
        return Ok(Resolved::Source(ResolvedSource::Git { url: repo.to_string(), commit: c.clone(), auth }));
    }
    let creds = git_credentials(ctx, ns, auth.as_deref()).await?;
    let branch = spec.branch.clone().unwrap_or_default();
    Ok(match pko_git::ls_remote(repo, &branch, &creds).await {
        Ok(sha) => Resolved::Source(ResolvedSource::Git { url: repo.to_string(), commit: sha, auth }),
        Err(e) => Resolved::Stalled(sc::SOURCE_UNAVAILABLE, format!("resolving branch {branch} of {repo}: {e}")),
    })
}

/// The source of `stack` at a revision (git resolved with `ls-remote`, a Flux artifact, a Program's
/// artifact), or why it stalls. A Program is read from the Program informer's cache `programs` when
/// it is there with an artifact (a newer artifact wakes the Stack again through the Program's watch);
/// otherwise, as at a start before that cache has listed, from the API server.
///
/// Errors: an API read failed.
pub(super) async fn resolve(ctx: &Context, programs: &Store<Program>, stack: &Stack, deleting: bool) -> Result<Resolved, kube::Error> {
    let ns = stack.namespace().unwrap_or_default();
    let spec = &stack.spec;
    let cached = stack.status.as_ref().and_then(|s| s.project_info.clone());
    // destroy from state when the source may be gone (PKO 2.8, #1222)
    if deleting && spec.run_program != Some(true) && cached.is_some() {
        return Ok(Resolved::Source(ResolvedSource::ProjectInfo(cached.unwrap_or_default())));
    }
    // PKO's precedence when several are set: git, then Flux, then a Program
    if let Some(repo) = &spec.project_repo {
        return match resolve_git(ctx, &ns, spec, repo).await {
            Ok(r) => Ok(r),
            Err(CredentialError::Invalid(e)) => Ok(Resolved::Stalled(sc::SPEC_INVALID, e)),
            Err(CredentialError::Unavailable(e)) => Ok(Resolved::Stalled(sc::SOURCE_UNAVAILABLE, e)),
            Err(CredentialError::Kube(e)) => Err(e),
        };
    }
    if let Some(f) = &spec.flux_source {
        let ar = super::flux::SourceKind::of(&f.source_ref).api_resource();
        let (kind, name) = (&f.source_ref.kind, &f.source_ref.name);
        return Ok(match Api::<DynamicObject>::namespaced_with(ctx.client.clone(), &ns, &ar).get_opt(name).await {
            // PKO's text, then the API server's answer
            Ok(None) => Resolved::Stalled(sc::SOURCE_UNAVAILABLE, format!("could not resolve sourceRef: {} {name:?} not found", ar.plural)),
            Err(e) => Resolved::Stalled(sc::SOURCE_UNAVAILABLE, format!("could not resolve sourceRef: {kind} {name}: {e}")),
            Ok(Some(o)) => flux_artifact(o.data.get("status").and_then(|s| s.get("artifact")), kind, name, f.dir.clone()),
        });
    }
    if let Some(p) = &spec.program_ref {
        let has_artifact = |p: &Program| p.status.as_ref().is_some_and(|s| s.artifact.is_some());
        let program = k8s::cached_or_get(programs, &Api::namespaced(ctx.client.clone(), &ns), &p.name, has_artifact).await?;
        // PKO's texts (`errProgramNotFound`, "Program has no artifact"), then which Program
        return Ok(match program.map(|p| p.status.and_then(|s| s.artifact)) {
            Some(Some(a)) => Resolved::Source(ResolvedSource::Artifact { url: a.url, digest: a.digest.unwrap_or_default(), revision: a.revision.unwrap_or_default(), dir: None }),
            Some(None) => Resolved::Stalled(sc::SOURCE_UNAVAILABLE, format!("Program has no artifact (program {} has no status.artifact yet)", p.name)),
            None => Resolved::Stalled(sc::SOURCE_UNAVAILABLE, format!("unable to retrieve program for stack (program {} not found)", p.name)),
        });
    }
    Ok(match cached {
        Some(p) if deleting => Resolved::Source(ResolvedSource::ProjectInfo(p)),
        _ if ResolvedSource::template_has_source(spec) => Resolved::Source(ResolvedSource::Template),
        _ => Resolved::Stalled(sc::SPEC_INVALID, NO_SOURCE.into()),
    })
}

/// The source of a Stack from the `status.artifact` of its Flux source `kind`/`name` (none: the source
/// has no artifact yet → Stalled `SourceUnavailable`, as PKO's "Flux source has no artifact"). An
/// artifact without `digest` stalls too, saying so: this operator verifies every download (PKO fetches
/// such an artifact unverified; source-controller has written a digest since Flux 2.0). Pure.
fn flux_artifact(artifact: Option<&serde_json::Value>, kind: &str, name: &str, dir: Option<String>) -> Resolved {
    let field = |a: &serde_json::Value, k: &str| a.get(k).and_then(|v| v.as_str()).filter(|v| !v.is_empty()).map(str::to_string);
    match artifact {
        // as PKO: an artifact without a digest is downloaded unverified (source-controller has written
        // digests since Flux 2.0; other producers may not)
        Some(a) => match field(a, "url") {
            Some(url) => {
                Resolved::Source(ResolvedSource::Artifact { url, digest: field(a, "digest").unwrap_or_default(), revision: field(a, "revision").unwrap_or_default(), dir })
            }
            None => Resolved::Stalled(sc::SOURCE_UNAVAILABLE, format!("{kind} {name} has an artifact without a url")),
        },
        None => Resolved::Stalled(sc::SOURCE_UNAVAILABLE, format!("Flux source has no artifact ({kind} {name} has no status.artifact)")),
    }
}

/// The `SpecInvalid` message of a Stack with no source at all (PKO would create a Workspace that
/// cannot run; ours says what to set instead).
pub(super) const NO_SOURCE: &str =
    "no source: set spec.projectRepo, spec.fluxSource or spec.programRef, or a source in spec.workspaceTemplate.spec (local.dir for a program in the image)";

/// `workspaceReclaimPolicy: Delete` and the last update succeeded: the Workspace (and its agent) can go
/// until the next sync recreates it (PKO §2.7; a failed Stack keeps its Workspace for debugging, #826).
pub(super) fn ready_and_reclaimable(stack: &Stack, st: &StackStatus) -> bool {
    stack.spec.workspace_reclaim_policy == Some(pko_api::stack::WorkspaceReclaimPolicy::Delete)
        && st.current_update.is_none()
        && st.last_update.as_ref().is_some_and(|l| l.state == Some(StackUpdateStateMessage::Succeeded))
}

/// Deletes the Stack's Workspace if it exists, with PKO's `WorkspaceDeleted` event.
pub(super) async fn reclaim_workspace(ctx: &Context, stack: &Stack) -> Result<(), kube::Error> {
    let ns = stack.namespace().unwrap_or_default();
    let workspaces: Api<Workspace> = Api::namespaced(ctx.client.clone(), &ns);
    match workspaces.get_opt(&stack.name_any()).await? {
        Some(ws) if ws.metadata.deletion_timestamp.is_none() => {
            workspaces.delete(&stack.name_any(), &kube::api::DeleteParams::background()).await?;
            k8s::publish(&ctx.events.stack, stack, Severity::Normal, ev::WORKSPACE_DELETED, "Workspace deleted per reclaim policy".into()).await;
        }
        _ => {}
    }
    Ok(())
}

/// The name of an Update of Stack `ns/name` that is not complete yet, read from the Update informer's
/// cache `updates`; `None` when there is none.
///
/// The Stack's `status.currentUpdate`, read fresh by each pass and written before its Update is created,
/// is what keeps one Update per Stack; this is the second guard, for a race across a shard move (an
/// Update created by the replica that held the shard, whose status write this pass could not see).
/// The cache can lag the API server by a watch event, which only narrows that guard for the moment an
/// Update is being created; a LIST of the namespace's Updates here made creating N Updates in one
/// namespace cost O(N²) (it stalled the 10k-Stack load test at ~2,100 Stacks).
pub(super) fn in_flight_update(updates: &Store<Update>, ns: &str, name: &str) -> Option<String> {
    updates.find(|u| in_flight_for(u, ns, name)).map(|u| u.name_any())
}

/// Whether `u` is an Update of Stack `ns/name` (its namespace and [`STACK_NAME_LABEL`]) that is neither
/// complete nor being deleted. Pure.
pub(super) fn in_flight_for(u: &Update, ns: &str, name: &str) -> bool {
    u.metadata.namespace.as_deref() == Some(ns)
        && u.metadata.labels.as_ref().and_then(|l| l.get(STACK_NAME_LABEL)).is_some_and(|n| n == name)
        && !u.is_complete()
        && u.metadata.deletion_timestamp.is_none()
}

/// Whether namespace `ns` is being deleted.
pub(super) async fn namespace_terminating(ctx: &Context, ns: &str) -> Result<bool, kube::Error> {
    let namespace = Api::<k8s_openapi::api::core::v1::Namespace>::all(ctx.client.clone()).get_opt(ns).await?;
    Ok(namespace.is_some_and(|n| n.metadata.deletion_timestamp.is_some()))
}

/// The Stalled `NamespaceTerminating` message: why the destroy cannot run and how to let the Stack go.
pub(super) fn namespace_terminating_message(ns: &str, name: &str) -> String {
    format!(
        "namespace {ns} is being deleted, so the destroy of this Stack (destroyOnFinalize) cannot run: no Workspace or Update can be created in it. \
         Either destroy the stack's resources yourself and remove the finalizer with \
         `kubectl -n {ns} patch stack {name} --type=json -p '[{{\"op\":\"remove\",\"path\":\"/metadata/finalizers\"}}]'`, \
         or apply a Stack with the same spec in another namespace to destroy them."
    )
}

/// PKO's "waiting for workspace readiness", followed by why the Workspace is not Ready when it says
/// (e.g. `: ConnectionFailed: serviceaccounts "deployer" not found`), so a Stack never waits silently.
pub(super) fn workspace_wait_message(ws: &Workspace) -> String {
    match ws.not_ready_reason() {
        Some(c) => format!("{}: {}: {}", sc::WAITING_FOR_WORKSPACE_MESSAGE, c.reason, c.message),
        None => sc::WAITING_FOR_WORKSPACE_MESSAGE.to_string(),
    }
}

/// Text of the `StackUpdateConflictDetected` event: the lock holder's message and what happens next
/// (a retry after the cooldown, or the stall once the retry limit is reached).
pub(super) fn conflict_message(last: Option<&StackUpdateState>, max_backoff_seconds: Option<i64>) -> String {
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
pub(super) const REFUSED_WORKSPACE: &str = "spec.workspaceTemplate: the API server refused the Workspace";
/// Start of the `SpecInvalid` message when the API server refused the generated Update.
pub(super) const REFUSED_UPDATE: &str = "spec.updateTemplate: the API server refused the Update";

/// Whether API error `e` on a generated object is a refusal of its content (HTTP 400 or 422: the
/// templates made it invalid), and the condition message: `<what>: <API message>`.
pub(super) fn refusal(what: &str, e: &kube::Error) -> (bool, String) {
    match e {
        kube::Error::Api(s) if s.code == 400 || s.code == 422 => (true, format!("{what}: {}", s.message)),
        other => (false, format!("{what}: {other}")),
    }
}

/// Whether the Stack is Stalled because the API server refused a generated object of this generation.
pub(super) fn refused_this_generation(conds: &[k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition], generation: Option<i64>) -> bool {
    conds.iter().any(|c| {
        c.type_ == sc::STALLED
            && c.status == "True"
            && c.reason == sc::SPEC_INVALID
            && c.observed_generation == generation
            && (c.message.starts_with(REFUSED_WORKSPACE) || c.message.starts_with(REFUSED_UPDATE))
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;

    #[test]
    fn flux_artifacts_need_a_url_and_may_lack_a_digest() {
        let stalled = |r: Resolved| match r {
            Resolved::Stalled(reason, message) => (reason, message),
            Resolved::Source(_) => panic!("expected a stall"),
        };
        let ok = json!({"url": "http://sc/a.tar.gz", "digest": "sha256:ab", "revision": "main@sha1:1"});
        match flux_artifact(Some(&ok), "GitRepository", "infra", Some("app".into())) {
            Resolved::Source(ResolvedSource::Artifact { url, digest, revision, dir }) => {
                assert_eq!((url.as_str(), digest.as_str(), revision.as_str(), dir.as_deref()), ("http://sc/a.tar.gz", "sha256:ab", "main@sha1:1", Some("app")));
            }
            _ => panic!("expected the artifact"),
        }
        assert_eq!(
            stalled(flux_artifact(None, "GitRepository", "infra", None)),
            (sc::SOURCE_UNAVAILABLE, "Flux source has no artifact (GitRepository infra has no status.artifact)".to_string())
        );
        // as PKO: no digest, downloaded unverified
        match flux_artifact(Some(&json!({"url": "http://sc/a.tar.gz", "digest": "", "revision": "r1"})), "Bucket", "b", None) {
            Resolved::Source(ResolvedSource::Artifact { digest, revision, .. }) => assert_eq!((digest.as_str(), revision.as_str()), ("", "r1")),
            _ => panic!("an artifact without a digest is used"),
        }
        assert!(stalled(flux_artifact(Some(&json!({"digest": "sha256:ab"})), "Bucket", "b", None)).1.contains("without a url"));
    }

    #[test]
    fn an_update_is_in_flight_for_its_own_stack_until_complete_or_deleted() {
        let update = |ns: &str, stack: Option<&str>, complete: bool, deleting: bool| {
            let mut u: Update = serde_json::from_value(json!({
                "apiVersion": "auto.pulumi.com/v1alpha1", "kind": "Update",
                "metadata": {"name": "u", "namespace": ns},
                "spec": {},
                "status": {"conditions": [{"type": "Complete", "status": if complete { "True" } else { "False" }, "reason": "r", "message": "", "lastTransitionTime": "2026-11-24T00:00:00Z"}]},
            }))
            .unwrap();
            if let Some(s) = stack {
                u.metadata.labels = Some([(STACK_NAME_LABEL.to_string(), s.to_string())].into());
            }
            if deleting {
                u.metadata.deletion_timestamp = Some(Time(k8s_openapi::jiff::Timestamp::UNIX_EPOCH));
            }
            u
        };
        assert!(in_flight_for(&update("a", Some("web"), false, false), "a", "web"));
        assert!(!in_flight_for(&update("b", Some("web"), false, false), "a", "web"), "another namespace's Stack of that name");
        assert!(!in_flight_for(&update("a", Some("api"), false, false), "a", "web"), "another Stack's");
        assert!(!in_flight_for(&update("a", None, false, false), "a", "web"), "no Stack's");
        assert!(!in_flight_for(&update("a", Some("web"), true, false), "a", "web"), "complete");
        assert!(!in_flight_for(&update("a", Some("web"), false, true), "a", "web"), "being deleted");
    }

    #[test]
    fn git_refs_are_judged_in_pkos_words() {
        let spec = |v: serde_json::Value| serde_json::from_value::<pko_api::StackSpec>(v).unwrap();
        assert_eq!(git_ref_error(&spec(json!({"stack": "dev", "projectRepo": "https://g/r"}))), Some(r#"missing "commit" or "branch""#));
        assert_eq!(
            git_ref_error(&spec(json!({"stack": "dev", "projectRepo": "https://g/r", "commit": "a", "branch": "main"}))),
            Some(r#"only one of "commit" or "branch" should be specified"#)
        );
        assert_eq!(git_ref_error(&spec(json!({"stack": "dev", "projectRepo": "https://g/r", "commit": "", "branch": "main"}))), None, "empty is unset");
        assert_eq!(git_ref_error(&spec(json!({"stack": "dev", "projectRepo": "https://g/r", "commit": "a"}))), None);
    }

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
    fn finalizer_patches_test_the_list_they_change() {
        let f = |v: &[&str]| v.iter().map(|s| s.to_string()).collect::<Vec<_>>();
        assert!(finalizer_patch(&f(&[STACK_FINALIZER]), true).is_empty());
        assert!(finalizer_patch(&f(&["other"]), false).is_empty());
        let add_first = finalizer_patch(&[], true);
        assert_eq!(add_first[0], json!({"op": "test", "path": "/metadata/finalizers", "value": null}));
        let add = finalizer_patch(&f(&["other"]), true);
        assert_eq!(add[0]["value"], json!(["other"]));
        assert_eq!(add[1], json!({"op": "add", "path": "/metadata/finalizers/-", "value": STACK_FINALIZER}));
        let remove = finalizer_patch(&f(&["other", STACK_FINALIZER]), false);
        assert_eq!(remove[0], json!({"op": "test", "path": "/metadata/finalizers/1", "value": STACK_FINALIZER}));
        assert_eq!(remove[1], json!({"op": "remove", "path": "/metadata/finalizers/1"}));
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
