//! Git sources: credentials into the git environment, a revision resolved to a commit, a commit checked out.

use std::path::Path;

use pko_proto::v1::GitSource;
use tokio::process::Command;

use super::{SourceError, err};
use crate::values::ValueResolver;

/// Credentials for git, resolved from the request's references (the values through `values`, so Secrets are read with
/// the agent's identity) into the git process's environment ([`pko_git::GitAuthEnv`]).
pub(super) struct GitAuthArgs(pko_git::GitAuthEnv);

impl GitAuthArgs {
    pub(super) async fn resolve(g: &GitSource, values: &ValueResolver) -> Result<Self, SourceError> {
        let Some(auth) = &g.auth else { return Ok(Self(pko_git::GitAuthEnv::default())) };
        // the operator exchanges GitHub App credentials for a token; a request still carrying them was
        // not prepared (the private key is not ours to hold)
        if auth.github_app_id.is_some()
            || auth.github_app_installation_id.is_some()
            || auth.github_app_private_key.is_some()
        {
            return Err(err("git credentials: GitHub App credentials reach the agent only as an installation token \
                    (source.git.auth.token); the caller exchanges them"));
        }
        let get = |r: &Option<pko_proto::v1::ValueRef>| {
            let r = r.clone();
            async move {
                match r {
                    Some(r) => values.resolve(&r).await.map(Some).map_err(|e| err(format!("git credentials: {e}"))),
                    None => Ok(None),
                }
            }
        };
        let creds = pko_git::GitCredentials {
            ssh_private_key: get(&auth.ssh_private_key).await?,
            token: get(&auth.token).await?,
            username: get(&auth.username).await?,
            password: get(&auth.password).await?,
        };
        pko_git::GitAuthEnv::new(&creds).map(Self).map_err(err)
    }

    fn command(&self) -> Command {
        self.0.command()
    }
}

/// How long one git command of the agent may take (a clone of a large repository included).
pub const GIT_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(600);

async fn git(auth: &GitAuthArgs, args: &[&str], cwd: Option<&Path>) -> Result<String, SourceError> {
    let mut c = auth.command();
    c.args(args);
    if let Some(d) = cwd {
        c.current_dir(d);
    }
    let what = args.first().copied().unwrap_or("");
    let out = pko_git::run(c, what, GIT_TIMEOUT).await.map_err(err)?;
    if !out.status.success() {
        return Err(err(format!("git {what}: {}", String::from_utf8_lossy(&out.stderr).trim())));
    }
    Ok(String::from_utf8_lossy(&out.stdout).into_owned())
}

/// Refuses a git source whose URL or revision git could read as an option ([`pko_git::validate_url`],
/// [`pko_git::validate_ref`]); the Workspace is tenant input, as is the Stack it may come from.
fn validate_git(g: &GitSource) -> Result<(), SourceError> {
    pko_git::validate_url(&g.url).map_err(|e| err(format!("source.git.url: {e}")))?;
    if !g.revision.is_empty() {
        pko_git::validate_ref("source.git.revision", &g.revision).map_err(err)?;
    }
    Ok(())
}

pub(super) async fn resolve_git_revision(g: &GitSource, auth: &GitAuthArgs) -> Result<String, SourceError> {
    validate_git(g)?;
    let rev = if g.revision.is_empty() { "HEAD" } else { g.revision.as_str() };
    if pko_git::is_sha(rev) {
        return Ok(rev.to_ascii_lowercase());
    }
    // any ref by full or short name, as PKO's operator resolves a branch (an annotated tag: its commit)
    let out = git(auth, &["ls-remote", "--end-of-options", &g.url], None).await?;
    pko_git::pick_ref(&out, rev)
        .filter(|sha| pko_git::is_sha(sha))
        .ok_or_else(|| err(format!("revision {rev:?} not found in {}", g.url)))
}

pub(super) async fn clone(g: &GitSource, sha: &str, auth: &GitAuthArgs, into: &Path) -> Result<(), SourceError> {
    validate_git(g)?;
    if !pko_git::is_sha(sha) {
        return Err(err(format!("revision {sha:?} is not a commit SHA")));
    }
    let dir = into.to_str().ok_or_else(|| err("non UTF-8 cache path"))?;
    git(auth, &["init", "-q", "--", dir], None).await?;
    git(auth, &["remote", "add", "--end-of-options", "origin", &g.url], Some(into)).await?;
    // Fetch exactly the commit (protocol v2 servers allow it); fall back to a full fetch.
    let depth: &[&str] = if g.shallow { &["--depth", "1"] } else { &[] };
    let mut args = vec!["fetch", "-q"];
    args.extend_from_slice(depth);
    args.extend_from_slice(&["--end-of-options", "origin", sha]);
    if git(auth, &args, Some(into)).await.is_err() {
        git(
            auth,
            &[
                "fetch",
                "-q",
                "--end-of-options",
                "origin",
                "+refs/heads/*:refs/remotes/origin/*",
                "+refs/tags/*:refs/tags/*",
            ],
            Some(into),
        )
        .await?;
    }
    git(auth, &["-c", "advice.detachedHead=false", "checkout", "-q", sha], Some(into)).await?;
    // a repository may hold symlinks to anywhere: none may lead out of the checkout
    crate::archive::check_links_inside(into).map_err(|e| err(e.to_string()))?;
    Ok(())
}
