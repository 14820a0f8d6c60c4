//! The source model of a Stack ([`ResolvedSource`], its git credentials as Secret references [`git_auth`]) and its
//! resolution for a pass (PKO `stack_controller.go`): a Program's artifact, a git branch resolved with `ls-remote` and
//! the Stack's credentials (Secrets, SSH keys, GitHub App), a Flux source's `status.artifact`, or the Workspace
//! template's own source; or why the Stack stalls.

use k8s_openapi::api::core::v1::Secret;
use kube::ResourceExt;
use kube::api::{Api, DynamicObject};
use kube::runtime::reflector::Store;
use pko_api::constants::stack_condition as sc;
use pko_api::{Program, Stack};

use crate::context::Context;
use crate::k8s;
use k8s_openapi::api::core::v1::SecretKeySelector;
use pko_api::shared::ResourceRef;
use pko_api::stack::StackSpec;
use pko_api::workspace::{GitAuth, ProjectInfo};

/// Where the program of a Stack comes from, resolved to a revision.
#[derive(Debug, Clone, PartialEq)]
pub enum ResolvedSource {
    /// A git repository at a commit.
    Git {
        /// Repository URL.
        url: String,
        /// Commit SHA.
        commit: String,
        /// Credentials as Secret key references ([`git_auth`]).
        auth: Option<Box<GitAuth>>,
    },
    /// A Flux-style artifact (a Program's or a Flux source's).
    Artifact {
        /// Tarball URL.
        url: String,
        /// `sha256:<hex>`.
        digest: String,
        /// Revision string (the Program generation, or the Flux artifact revision).
        revision: String,
        /// Directory in the artifact.
        dir: Option<String>,
    },
    /// No source: destroy from state with a synthesised project.
    ProjectInfo(ProjectInfo),
    /// No source in the Stack: the Workspace template's own (`workspaceTemplate.spec.local`, a program baked into the
    /// image — PKO's `examples/custom-source`), or none at all (PKO's source-less Workspace, whose pod's init
    /// container puts the program in `/share/workspace`); its revision is empty, as PKO's commit is for a Stack without
    /// a source.
    Template,
}

impl ResolvedSource {
    /// The revision recorded as `lastAttemptedCommit`/`lastSuccessfulCommit`.
    pub fn revision(&self) -> String {
        match self {
            ResolvedSource::Git { commit, .. } => commit.clone(),
            ResolvedSource::Artifact { revision, .. } => revision.clone(),
            ResolvedSource::ProjectInfo(p) => format!("project:{}", p.name.clone().unwrap_or_default()),
            ResolvedSource::Template => String::new(),
        }
    }
}

pub(crate) fn secret_key(name: &str, key: &str) -> SecretKeySelector {
    SecretKeySelector { name: name.into(), key: key.into(), optional: None }
}

fn secret_selector(r: &ResourceRef) -> Option<SecretKeySelector> {
    r.secret.as_ref().map(|s| secret_key(&s.name, &s.key))
}

/// Git credentials of a Stack as Secret key references (the Workspace's `git.auth`): from `gitAuth`, or else from the
/// deprecated `gitAuthSecret`, whose Secret holds the keys `auth_secret_keys` (PKO's precedence: `sshPrivateKey` (+
/// `password`) > `accessToken` > `username` + `password`). `None`: no credentials. `gitAuth.githubApp` is carried as
/// Secret references too; the operator exchanges it for an installation token for each operation (`update::values`).
pub fn git_auth(spec: &StackSpec, auth_secret_keys: Option<&std::collections::BTreeSet<String>>) -> Option<GitAuth> {
    if let Some(a) = &spec.git_auth {
        return Some(GitAuth {
            ssh_private_key: a.ssh_auth.as_ref().and_then(|s| secret_selector(&s.ssh_private_key)),
            password: a
                .ssh_auth
                .as_ref()
                .and_then(|s| s.password.as_ref())
                .and_then(secret_selector)
                .or_else(|| a.basic_auth.as_ref().and_then(|b| secret_selector(&b.password))),
            token: a.access_token.as_ref().and_then(secret_selector),
            username: a.basic_auth.as_ref().and_then(|b| secret_selector(&b.user_name)),
            github_app: a.github_app.as_ref().map(|g| pko_api::workspace::GitHubAppSecretAuth {
                app_id: secret_selector(&g.app_id),
                installation_id: secret_selector(&g.installation_id),
                private_key: secret_selector(&g.private_key),
            }),
        });
    }
    let (name, keys) = (spec.git_auth_secret.as_ref()?, auth_secret_keys?);
    let sel = |k: &str| keys.contains(k).then(|| secret_key(name, k));
    if keys.contains("sshPrivateKey") {
        Some(GitAuth { ssh_private_key: sel("sshPrivateKey"), password: sel("password"), ..Default::default() })
    } else if keys.contains("accessToken") {
        Some(GitAuth { token: sel("accessToken"), ..Default::default() })
    } else if keys.contains("username") && keys.contains("password") {
        Some(GitAuth { username: sel("username"), password: sel("password"), ..Default::default() })
    } else {
        None
    }
}

/// A source at a revision, or why the Stack stalls.
pub(super) enum Resolved {
    /// The source.
    Source(ResolvedSource),
    /// The Stalled reason and message.
    Stalled(&'static str, String),
}

/// Why the Stack's git credentials could not be had: the API failed (the reconcile is retried), or the spec names a
/// Secret or key that is not there (the Stack is Stalled `SpecInvalid` with this text).
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

/// The Stack's git credentials as Secret key references ([`git_auth`]), reading which keys the deprecated
/// `gitAuthSecret` holds.
async fn git_auth_refs(
    ctx: &Context,
    ns: &str,
    spec: &pko_api::StackSpec,
) -> Result<Option<pko_api::workspace::GitAuth>, CredentialError> {
    let keys = match (&spec.git_auth, &spec.git_auth_secret) {
        (None, Some(name)) => match Api::<Secret>::namespaced(ctx.client.clone(), ns).get_opt(name).await? {
            Some(s) => Some(
                s.data.unwrap_or_default().into_keys().chain(s.string_data.unwrap_or_default().into_keys()).collect(),
            ),
            None => {
                return Err(CredentialError::Invalid(format!(
                    "unable to get secret {ns}/{name}: secrets {name:?} not found (spec.gitAuthSecret)"
                )));
            }
        },
        _ => None,
    };
    Ok(git_auth(spec, keys.as_ref()))
}

/// The value of the Secret key `sel` (none: no selector), from `secrets` (the Secrets of the Stack's namespace read so
/// far, by name; a Secret is read once).
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
    let secret = secrets[&sel.name].as_ref().ok_or_else(|| {
        CredentialError::Invalid(format!(
            "unable to get secret {ns}/{name}: secrets {name:?} not found (git credentials)",
            name = sel.name
        ))
    })?;
    let bytes = secret
        .data
        .as_ref()
        .and_then(|d| d.get(&sel.key))
        .map(|b| b.0.clone())
        .or_else(|| secret.string_data.as_ref().and_then(|d| d.get(&sel.key)).map(|s| s.clone().into_bytes()))
        .ok_or_else(|| {
            CredentialError::Invalid(format!("git credentials: Secret {} has no key {}", sel.name, sel.key))
        })?;
    String::from_utf8(bytes).map(Some).map_err(|_| {
        CredentialError::Invalid(format!("git credentials: key {} of Secret {} is not UTF-8", sel.key, sel.name))
    })
}

/// Every Secret key `auth` names exists (read with the operator's identity, each Secret once).
///
/// Errors: [`CredentialError::Invalid`] naming the first missing Secret or key.
async fn check_credentials(
    ctx: &Context,
    ns: &str,
    auth: Option<&pko_api::workspace::GitAuth>,
) -> Result<(), CredentialError> {
    let Some(auth) = auth else { return Ok(()) };
    let api: Api<Secret> = Api::namespaced(ctx.client.clone(), ns);
    let mut secrets = std::collections::BTreeMap::new();
    let app = auth.github_app.as_ref();
    for sel in [&auth.token, &auth.ssh_private_key, &auth.username, &auth.password] {
        secret_value(&api, &mut secrets, ns, sel).await?;
    }
    for sel in
        [app.map(|a| &a.app_id), app.map(|a| &a.installation_id), app.map(|a| &a.private_key)].into_iter().flatten()
    {
        secret_value(&api, &mut secrets, ns, sel).await?;
    }
    Ok(())
}

/// The values behind `auth`, read with the operator's identity for its own `ls-remote` (PKO resolves git auth in the
/// operator too).
async fn git_credentials(
    ctx: &Context,
    ns: &str,
    auth: Option<&pko_api::workspace::GitAuth>,
) -> Result<pko_git::GitCredentials, CredentialError> {
    let Some(auth) = auth else { return Ok(Default::default()) };
    let api: Api<Secret> = Api::namespaced(ctx.client.clone(), ns);
    let mut secrets = std::collections::BTreeMap::new();
    // a GitHub App's credentials buy an installation token, used as a personal access token (PKO)
    let mut token = secret_value(&api, &mut secrets, ns, &auth.token).await?;
    if let Some(app) = &auth.github_app {
        let app_id = secret_value(&api, &mut secrets, ns, &app.app_id).await?.unwrap_or_default();
        let installation = secret_value(&api, &mut secrets, ns, &app.installation_id).await?.unwrap_or_default();
        let key = secret_value(&api, &mut secrets, ns, &app.private_key).await?.unwrap_or_default();
        let exchanged =
            pko_git::github_app::installation_token(&ctx.github_api_url, &app_id, &installation, &key).await;
        token = Some(exchanged.map_err(|e| match e {
            pko_git::github_app::GitHubAppError::NotANumber(..) | pko_git::github_app::GitHubAppError::Key(_) => {
                CredentialError::Invalid(format!("spec.gitAuth.githubApp: {e}"))
            }
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

/// What is wrong with the commit and branch of a Stack with `projectRepo`, in PKO's words (`git.go` `NewGitSource`):
/// neither set, or both. Pure.
fn git_ref_error(spec: &pko_api::StackSpec) -> Option<&'static str> {
    let set = |v: &Option<String>| v.as_deref().is_some_and(|v| !v.is_empty());
    match (set(&spec.commit), set(&spec.branch)) {
        (false, false) => Some(r#"missing "commit" or "branch""#),
        (true, true) => Some(r#"only one of "commit" or "branch" should be specified"#),
        _ => None,
    }
}

/// The git source of a Stack with `projectRepo`: the commit (given, or its branch resolved with `ls-remote` and the
/// Stack's credentials) and the credentials for the Workspace.
async fn resolve_git(
    ctx: &Context,
    ns: &str,
    spec: &pko_api::StackSpec,
    repo: &str,
) -> Result<Resolved, CredentialError> {
    // tenant input never reaches git as an option (docs/security.md)
    // PKO's text (`NewGitSource`: `parsing "<url>": invalid Git URL`), then what is wrong
    pko_git::validate_url(repo)
        .map_err(|e| CredentialError::Invalid(format!("parsing {repo:?}: invalid Git URL: spec.projectRepo: {e}")))?;
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
    Ok(match ctx.git_heads.head(ns, repo, &branch, &creds).await {
        Ok(sha) => Resolved::Source(ResolvedSource::Git { url: repo.to_string(), commit: sha, auth }),
        Err(e) => Resolved::Stalled(sc::SOURCE_UNAVAILABLE, format!("resolving branch {branch} of {repo}: {e}")),
    })
}

/// Whether `spec` has a git source: any of PKO's inlined `GitSource` fields is set (`projectRepo`, `gitAuthSecret`,
/// `gitAuth`, `repoDir`, `commit`, `branch`, `shallow`) — Go allocates the embedded struct when any of them is in the
/// object, and PKO then takes the Stack for a git Stack. Pure.
pub fn git_source_given(spec: &StackSpec) -> bool {
    spec.project_repo.is_some()
        || spec.git_auth_secret.is_some()
        || spec.git_auth.is_some()
        || spec.repo_dir.is_some()
        || spec.commit.is_some()
        || spec.branch.is_some()
        || spec.shallow.is_some()
}

/// The source of `stack` at a revision (git resolved with `ls-remote`, a Flux artifact, a Program's artifact), or why
/// it stalls. A Program is read from the Program informer's cache `programs` when it is there with an artifact (a newer
/// artifact wakes the Stack again through the Program's watch); otherwise, as at a start before that cache has listed,
/// from the API server.
///
/// Errors: an API read failed.
pub(super) async fn resolve(
    ctx: &Context,
    programs: &Store<Program>,
    stack: &Stack,
    deleting: bool,
) -> Result<Resolved, kube::Error> {
    let ns = stack.namespace().unwrap_or_default();
    let spec = &stack.spec;
    let cached = stack.status.as_ref().and_then(|s| s.project_info.clone());
    // destroy from state when the source may be gone (PKO 2.8, #1222)
    if deleting && spec.run_program != Some(true) && cached.is_some() {
        return Ok(Resolved::Source(ResolvedSource::ProjectInfo(cached.unwrap_or_default())));
    }
    // PKO's precedence when several are set: git, then Flux, then a Program
    if git_source_given(spec) {
        // PKO's `NewGitSource` text: git fields without a repository create nothing
        let Some(repo) = spec.project_repo.as_deref().filter(|r| !r.is_empty()) else {
            return Ok(Resolved::Stalled(sc::SPEC_INVALID, r#"missing "projectRepo""#.into()));
        };
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
            Ok(None) => Resolved::Stalled(
                sc::SOURCE_UNAVAILABLE,
                format!("could not resolve sourceRef: {} {name:?} not found", ar.plural),
            ),
            Err(e) => {
                Resolved::Stalled(sc::SOURCE_UNAVAILABLE, format!("could not resolve sourceRef: {kind} {name}: {e}"))
            }
            Ok(Some(o)) => {
                flux_artifact(o.data.get("status").and_then(|s| s.get("artifact")), kind, name, f.dir.clone())
            }
        });
    }
    if let Some(p) = &spec.program_ref {
        let has_artifact = |p: &Program| p.status.as_ref().is_some_and(|s| s.artifact.is_some());
        let program =
            k8s::cached_or_get(programs, &Api::namespaced(ctx.client.clone(), &ns), &p.name, has_artifact).await?;
        // PKO's texts (`errProgramNotFound`, "Program has no artifact"), then which Program
        return Ok(match program.map(|p| p.status.and_then(|s| s.artifact)) {
            Some(Some(a)) => Resolved::Source(ResolvedSource::Artifact {
                url: a.url,
                digest: a.digest.unwrap_or_default(),
                revision: a.revision.unwrap_or_default(),
                dir: None,
            }),
            Some(None) => Resolved::Stalled(
                sc::SOURCE_UNAVAILABLE,
                format!("Program has no artifact (program {} has no status.artifact yet)", p.name),
            ),
            None => Resolved::Stalled(
                sc::SOURCE_UNAVAILABLE,
                format!("unable to retrieve program for stack (program {} not found)", p.name),
            ),
        });
    }
    Ok(match cached {
        Some(p) if deleting => Resolved::Source(ResolvedSource::ProjectInfo(p)),
        // the template's own source, or none at all: PKO's "fetch the source yourself" Stack, whose
        // Workspace pod gets its program from an init container (the Stack waits for its readiness)
        _ => Resolved::Source(ResolvedSource::Template),
    })
}

/// The source of a Stack from the `status.artifact` of its Flux source `kind`/`name` (none: the source has no artifact
/// yet → Stalled `SourceUnavailable`, as PKO's "Flux source has no artifact"). An artifact without `digest` stalls
/// too, saying so: this operator verifies every download (PKO fetches such an artifact unverified; source-controller
/// has written a digest since Flux 2.0). Pure.
fn flux_artifact(artifact: Option<&serde_json::Value>, kind: &str, name: &str, dir: Option<String>) -> Resolved {
    let field = |a: &serde_json::Value, k: &str| {
        a.get(k).and_then(|v| v.as_str()).filter(|v| !v.is_empty()).map(str::to_string)
    };
    match artifact {
        // as PKO: an artifact without a digest is downloaded unverified (source-controller has written
        // digests since Flux 2.0; other producers may not)
        Some(a) => match field(a, "url") {
            Some(url) => Resolved::Source(ResolvedSource::Artifact {
                url,
                digest: field(a, "digest").unwrap_or_default(),
                revision: field(a, "revision").unwrap_or_default(),
                dir,
            }),
            None => Resolved::Stalled(sc::SOURCE_UNAVAILABLE, format!("{kind} {name} has an artifact without a url")),
        },
        None => Resolved::Stalled(
            sc::SOURCE_UNAVAILABLE,
            format!("Flux source has no artifact ({kind} {name} has no status.artifact)"),
        ),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn git_auth_secret_follows_pko_precedence() {
        let spec = |v: serde_json::Value| serde_json::from_value::<pko_api::StackSpec>(v).unwrap();
        let s = spec(json!({"stack": "dev", "gitAuthSecret": "creds"}));
        let keys = |k: &[&str]| k.iter().map(|x| x.to_string()).collect::<std::collections::BTreeSet<_>>();
        let ssh = git_auth(&s, Some(&keys(&["sshPrivateKey", "password", "accessToken"]))).unwrap();
        assert_eq!(
            (ssh.ssh_private_key.unwrap().key, ssh.password.unwrap().key, ssh.token),
            ("sshPrivateKey".into(), "password".into(), None)
        );
        let tok = git_auth(&s, Some(&keys(&["accessToken", "username", "password"]))).unwrap();
        assert_eq!((tok.token.unwrap().name, tok.username), ("creds".into(), None));
        let basic = git_auth(&s, Some(&keys(&["username", "password"]))).unwrap();
        assert_eq!((basic.username.unwrap().key, basic.password.unwrap().key), ("username".into(), "password".into()));
        assert_eq!(git_auth(&s, Some(&keys(&["username"]))), None, "a user name alone is no credential");
        assert_eq!(git_auth(&spec(json!({"stack": "dev"})), None), None);
    }

    #[test]
    fn any_git_field_makes_a_git_stack_as_in_pko() {
        let spec = |v: serde_json::Value| serde_json::from_value::<pko_api::StackSpec>(v).unwrap();
        assert!(!git_source_given(&spec(json!({"stack": "dev"}))), "no source fields: source-less, as before");
        assert!(!git_source_given(&spec(json!({"stack": "dev", "programRef": {"name": "p"}}))));
        for field in [json!({"branch": "main", "repoDir": "app"}), json!({"commit": "abc"}), json!({"repoDir": "app"})]
        {
            let mut v = json!({"stack": "dev"});
            v.as_object_mut().unwrap().extend(field.as_object().unwrap().clone());
            assert!(git_source_given(&spec(v.clone())), "{v}: a git Stack without projectRepo (stalled, PKO)");
        }
    }

    #[test]
    fn flux_artifacts_need_a_url_and_may_lack_a_digest() {
        let stalled = |r: Resolved| match r {
            Resolved::Stalled(reason, message) => (reason, message),
            Resolved::Source(_) => panic!("expected a stall"),
        };
        let ok = json!({"url": "http://sc/a.tar.gz", "digest": "sha256:ab", "revision": "main@sha1:1"});
        match flux_artifact(Some(&ok), "GitRepository", "infra", Some("app".into())) {
            Resolved::Source(ResolvedSource::Artifact { url, digest, revision, dir }) => {
                assert_eq!(
                    (url.as_str(), digest.as_str(), revision.as_str(), dir.as_deref()),
                    ("http://sc/a.tar.gz", "sha256:ab", "main@sha1:1", Some("app"))
                );
            }
            _ => panic!("expected the artifact"),
        }
        assert_eq!(
            stalled(flux_artifact(None, "GitRepository", "infra", None)),
            (
                sc::SOURCE_UNAVAILABLE,
                "Flux source has no artifact (GitRepository infra has no status.artifact)".to_string()
            )
        );
        // as PKO: no digest, downloaded unverified
        match flux_artifact(
            Some(&json!({"url": "http://sc/a.tar.gz", "digest": "", "revision": "r1"})),
            "Bucket",
            "b",
            None,
        ) {
            Resolved::Source(ResolvedSource::Artifact { digest, revision, .. }) => {
                assert_eq!((digest.as_str(), revision.as_str()), ("", "r1"))
            }
            _ => panic!("an artifact without a digest is used"),
        }
        assert!(
            stalled(flux_artifact(Some(&json!({"digest": "sha256:ab"})), "Bucket", "b", None))
                .1
                .contains("without a url")
        );
    }

    #[test]
    fn git_refs_are_judged_in_pkos_words() {
        let spec = |v: serde_json::Value| serde_json::from_value::<pko_api::StackSpec>(v).unwrap();
        assert_eq!(
            git_ref_error(&spec(json!({"stack": "dev", "projectRepo": "https://g/r"}))),
            Some(r#"missing "commit" or "branch""#)
        );
        assert_eq!(
            git_ref_error(&spec(
                json!({"stack": "dev", "projectRepo": "https://g/r", "commit": "a", "branch": "main"})
            )),
            Some(r#"only one of "commit" or "branch" should be specified"#)
        );
        assert_eq!(
            git_ref_error(&spec(json!({"stack": "dev", "projectRepo": "https://g/r", "commit": "", "branch": "main"}))),
            None,
            "empty is unset"
        );
        assert_eq!(git_ref_error(&spec(json!({"stack": "dev", "projectRepo": "https://g/r", "commit": "a"}))), None);
    }
}
