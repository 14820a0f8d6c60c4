//! What a verified delivery says: its event, and for a push the repository (every URL form the host gives), the branch
//! and the new revision, read from each host's payload. Repositories compare normalised, so the `https`, `ssh` and
//! `git` forms of one repository (and a Stack's `projectRepo` in any of them) match. Pure.

use axum::http::HeaderMap;
use pko_api::receiver::ReceiverType;
use serde_json::Value;

/// A push: where, which branch, which commit.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Push {
    /// The repository's URLs as the payload names them (clone, ssh, web).
    pub urls: Vec<String>,
    /// The branch pushed (`refs/heads/<branch>`), when a branch was.
    pub branch: Option<String>,
    /// The commit the branch now points at.
    pub revision: Option<String>,
}

/// The event header of `kind` (`X-GitHub-Event`, …); `None` for the generic types or when absent.
pub fn event(kind: ReceiverType, headers: &HeaderMap) -> Option<String> {
    let header = match kind {
        ReceiverType::Github => "x-github-event",
        ReceiverType::Gitlab => "x-gitlab-event",
        ReceiverType::Bitbucket => "x-event-key",
        ReceiverType::Gitea => "x-gitea-event",
        ReceiverType::Generic | ReceiverType::GenericHmac => return None,
    };
    headers.get(header).and_then(|v| v.to_str().ok()).map(str::to_string)
}

/// The push `body` describes, as `kind` writes it; `None` for the generic types, a payload without a repository, or
/// one that is not JSON.
pub fn push(kind: ReceiverType, body: &[u8]) -> Option<Push> {
    let v: Value = serde_json::from_slice(body).ok()?;
    let text = |p: &str| v.pointer(p).and_then(Value::as_str).map(str::to_string);
    let (urls, git_ref, revision) = match kind {
        ReceiverType::Github | ReceiverType::Gitea => (
            ["/repository/clone_url", "/repository/ssh_url", "/repository/git_url", "/repository/html_url"]
                .iter()
                .filter_map(|p| text(p))
                .collect(),
            text("/ref"),
            text("/after"),
        ),
        ReceiverType::Gitlab => (
            ["/project/git_http_url", "/project/git_ssh_url", "/project/web_url", "/repository/url"]
                .iter()
                .filter_map(|p| text(p))
                .collect(),
            text("/ref"),
            text("/checkout_sha").or_else(|| text("/after")),
        ),
        ReceiverType::Bitbucket => (
            v.pointer("/repository/links/clone")
                .and_then(Value::as_array)
                .map(|a| a.iter().filter_map(|l| l.get("href")?.as_str().map(str::to_string)).collect())
                .unwrap_or_default(),
            text("/changes/0/ref/id").or_else(|| text("/changes/0/refId")),
            text("/changes/0/toHash"),
        ),
        ReceiverType::Generic | ReceiverType::GenericHmac => return None,
    };
    let urls: Vec<String> = urls;
    if urls.is_empty() {
        return None;
    }
    let branch = git_ref.as_deref().and_then(|r| r.strip_prefix("refs/heads/")).map(str::to_string);
    Some(Push { urls, branch, revision })
}

/// `url` as `host/path`: scheme, credentials, port of `ssh`/`git`, `.git` and trailing slashes dropped, the host in
/// lower case; scp-like `git@host:path` taken as `ssh`. Equal for every form of one repository on one host.
pub fn normalize(url: &str) -> String {
    let url = url.trim();
    let rest = match url.split_once("://") {
        Some((_, rest)) => rest.to_string(),
        // scp-like: user@host:path
        None => url.replacen(':', "/", 1),
    };
    let rest = rest.rsplit_once('@').map_or(rest.as_str(), |(_, r)| r).to_string();
    let (host, path) = rest.split_once('/').unwrap_or((rest.as_str(), ""));
    let host = host.split(':').next().unwrap_or(host).to_ascii_lowercase();
    let path = path.trim_end_matches('/');
    let path = path.strip_suffix(".git").unwrap_or(path).trim_end_matches('/');
    format!("{host}/{path}")
}

/// Whether a Stack tracking `branch` of `repo` is what `push` moved (`branch` as the Stack writes it, `main` or
/// `refs/heads/main`).
pub fn moves(push: &Push, repo: &str, branch: &str) -> bool {
    let wanted = branch.strip_prefix("refs/heads/").unwrap_or(branch);
    let repo = normalize(repo);
    push.branch.as_deref() == Some(wanted) && push.urls.iter().any(|u| normalize(u) == repo)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_forms_of_one_repository_are_one() {
        for u in [
            "https://github.com/Acme/infra.git",
            "https://token:x@github.com/Acme/infra",
            "ssh://git@github.com:22/Acme/infra.git",
            "git@github.com:Acme/infra.git",
            "git://GitHub.com/Acme/infra/",
        ] {
            assert_eq!(normalize(u), "github.com/Acme/infra", "{u}");
        }
        assert_ne!(normalize("https://github.com/acme/infra-2"), normalize("https://github.com/acme/infra"));
        assert_ne!(normalize("https://gitlab.com/acme/infra"), normalize("https://github.com/acme/infra"));
    }

    #[test]
    fn each_host_s_push_payload_gives_repository_branch_and_revision() {
        let gh = br#"{"ref":"refs/heads/main","after":"abc","repository":{"clone_url":"https://github.com/a/b.git",
            "ssh_url":"git@github.com:a/b.git"}}"#;
        let p = push(ReceiverType::Github, gh).unwrap();
        assert_eq!((p.branch.as_deref(), p.revision.as_deref()), (Some("main"), Some("abc")));
        assert!(
            moves(&p, "ssh://git@github.com/a/b", "main") && moves(&p, "https://github.com/a/b", "refs/heads/main")
        );
        assert!(!moves(&p, "https://github.com/a/b", "dev") && !moves(&p, "https://github.com/a/c", "main"));
        let gl =
            br#"{"ref":"refs/heads/dev","checkout_sha":"def","project":{"git_http_url":"https://gitlab.com/a/b.git"}}"#;
        let p = push(ReceiverType::Gitlab, gl).unwrap();
        assert!(moves(&p, "git@gitlab.com:a/b.git", "dev") && p.revision.as_deref() == Some("def"));
        let bb = br#"{"repository":{"links":{"clone":[{"href":"ssh://git@bb.example:7999/p/r.git"}]}},
            "changes":[{"ref":{"id":"refs/heads/main"},"toHash":"123"}]}"#;
        let p = push(ReceiverType::Bitbucket, bb).unwrap();
        assert!(moves(&p, "https://bb.example/p/r", "main") && p.revision.as_deref() == Some("123"));
        let tag = br#"{"ref":"refs/tags/v1","repository":{"clone_url":"https://github.com/a/b.git"}}"#;
        assert_eq!(push(ReceiverType::Github, tag).unwrap().branch, None, "a tag moves no branch");
        assert_eq!(push(ReceiverType::Generic, gh), None);
        assert_eq!(push(ReceiverType::Github, b"not json"), None);
        assert_eq!(push(ReceiverType::Github, br#"{"zen":"ping"}"#), None);
    }
}
