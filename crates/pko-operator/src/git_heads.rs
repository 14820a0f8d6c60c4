//! Branch heads of git remotes, one `git ls-remote` shared by every Stack that asks at once (issue 51): a push hook
//! wakes every Stack of a repository together, and each used to run its own `ls-remote` of the same remote (100
//! processes, and 100 requests to the git server, for one push).
//!
//! Contract: a caller gets a listing that **started after it asked** — never an older one — so it sees every push
//! that happened before its reconcile began, exactly as if it had run its own. Callers of one line (namespace,
//! remote, credentials) take turns: while a listing runs, every caller that arrives waits for the next one, which
//! then answers them all; so at most one `ls-remote` of a line runs at a time, and a burst of N callers costs about
//! two. Lines are per namespace and per credentials (their SHA-256, kept in memory only): one tenant's listing, or
//! one set of credentials' access, never answers another's.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use sha2::{Digest, Sha256};

/// How long an idle line is kept: 10 minutes (a Stack polls at least hourly; a line is two counters and a listing).
const LINE_IDLE: Duration = Duration::from_secs(600);

/// The last listing of a line and the ticket its `ls-remote` started at.
type Last = Option<(u64, Result<Arc<str>, String>)>;

/// One line: tickets are handed out in order, to callers as they arrive and to each listing as it starts.
#[derive(Default)]
struct Line {
    tickets: AtomicU64,
    last: tokio::sync::Mutex<Last>,
}

/// The shared branch-head resolver (one per replica, in [`crate::context::Context`]).
#[derive(Clone)]
pub struct GitHeads {
    lines: moka::future::Cache<[u8; 32], Arc<Line>>,
    listings: Arc<AtomicU64>,
}

impl Default for GitHeads {
    fn default() -> Self {
        Self {
            lines: moka::future::Cache::builder().time_to_idle(LINE_IDLE).build(),
            listings: Arc::new(AtomicU64::new(0)),
        }
    }
}

/// The line of `url` read with `creds` from namespace `ns`: a SHA-256 over all three, fields length-prefixed. Pure.
fn line_key(ns: &str, url: &str, creds: &pko_git::GitCredentials) -> [u8; 32] {
    let mut h = Sha256::new();
    let fields = [Some(ns), Some(url), creds.ssh_private_key.as_deref(), creds.token.as_deref()];
    let rest = [creds.username.as_deref(), creds.password.as_deref()];
    for f in fields.iter().chain(rest.iter()) {
        match f {
            Some(v) => {
                h.update((v.len() as u64 + 1).to_be_bytes());
                h.update(v.as_bytes());
            }
            None => h.update(0u64.to_be_bytes()),
        }
    }
    h.finalize().into()
}

/// Whether the last listing of a line, started at ticket `started`, may answer a caller that arrived at ticket
/// `arrived`: only a listing that started after the caller asked. Pure.
fn answers(started: u64, arrived: u64) -> bool {
    started > arrived
}

impl GitHeads {
    /// The commit `branch` of `url` names, read from namespace `ns` with `creds` (as [`pko_git::ls_remote`]), from a
    /// listing that started after this call.
    ///
    /// Errors: as [`pko_git::ls_remote`] (the listing's error is shared by the callers it answers).
    pub async fn head(
        &self,
        ns: &str,
        url: &str,
        branch: &str,
        creds: &pko_git::GitCredentials,
    ) -> Result<String, String> {
        pko_git::validate_ref("branch", branch)?;
        let listing = self.listing(ns, url, creds, || pko_git::ls_remote_listing(url, creds)).await?;
        pko_git::head_of(&listing, url, branch)
    }

    /// How many listings ran (for tests and the load report).
    pub fn listings(&self) -> u64 {
        self.listings.load(Ordering::Relaxed)
    }

    /// A listing of the line that started after this call: the last one if it did, else one run by this caller
    /// with `list` while it holds the line.
    async fn listing<F, Fut>(
        &self,
        ns: &str,
        url: &str,
        creds: &pko_git::GitCredentials,
        list: F,
    ) -> Result<Arc<str>, String>
    where
        F: FnOnce() -> Fut,
        Fut: std::future::Future<Output = Result<String, String>>,
    {
        let line = self.lines.get_with(line_key(ns, url, creds), async { Arc::new(Line::default()) }).await;
        let arrived = line.tickets.fetch_add(1, Ordering::SeqCst);
        let mut last = line.last.lock().await;
        if let Some((started, result)) = last.as_ref()
            && answers(*started, arrived)
        {
            return result.clone();
        }
        let started = line.tickets.fetch_add(1, Ordering::SeqCst);
        self.listings.fetch_add(1, Ordering::Relaxed);
        metrics::counter!(crate::metric_names::GIT_LISTINGS_TOTAL).increment(1);
        let result = list().await.map(Arc::from);
        *last = Some((started, result.clone()));
        result
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_listing_answers_only_callers_that_asked_before_it_started() {
        assert!(answers(5, 4));
        assert!(!answers(5, 5) && !answers(5, 6));
    }

    #[test]
    fn lines_differ_by_namespace_remote_and_credentials() {
        let none = pko_git::GitCredentials::default();
        let token = pko_git::GitCredentials { token: Some("t".into()), ..Default::default() };
        let user = pko_git::GitCredentials { username: Some("t".into()), ..Default::default() };
        let k = line_key("a", "https://g/r", &none);
        assert_eq!(k, line_key("a", "https://g/r", &none));
        assert_ne!(k, line_key("b", "https://g/r", &none));
        assert_ne!(k, line_key("a", "https://g/s", &none));
        assert_ne!(line_key("a", "https://g/r", &token), line_key("a", "https://g/r", &user));
        assert_ne!(line_key("ab", "c", &none), line_key("a", "bc", &none), "fields are length-prefixed");
    }

    #[tokio::test]
    async fn a_burst_of_callers_shares_listings_and_none_gets_one_older_than_its_call() {
        let heads = GitHeads::default();
        let none = pko_git::GitCredentials::default();
        let version = Arc::new(AtomicU64::new(0));
        let call = |heads: GitHeads, version: Arc<AtomicU64>| async move {
            let asked = version.load(Ordering::SeqCst);
            let v = version.clone();
            let got = heads
                .listing("ns", "https://g/r", &pko_git::GitCredentials::default(), || async move {
                    let seen = v.load(Ordering::SeqCst); // what the remote holds when the listing starts
                    tokio::time::sleep(Duration::from_millis(20)).await;
                    Ok(seen.to_string())
                })
                .await
                .unwrap();
            (asked, got.parse::<u64>().unwrap())
        };
        let mut tasks = Vec::new();
        for i in 0..50 {
            if i % 10 == 0 {
                version.fetch_add(1, Ordering::SeqCst); // a push
            }
            tasks.push(tokio::spawn(call(heads.clone(), version.clone())));
            tokio::time::sleep(Duration::from_millis(2)).await;
        }
        for t in tasks {
            let (asked, got) = t.await.unwrap();
            assert!(got >= asked, "a caller that asked at version {asked} got a listing of {got}");
        }
        let runs = heads.listings();
        assert!((2..=10).contains(&runs), "50 callers over ~100 ms of 20 ms listings: {runs} listings");
        let other = heads.listing("other", "https://g/r", &none, || async { Ok("x".to_string()) }).await.unwrap();
        assert_eq!(&*other, "x", "another namespace's line is its own");
    }
}
