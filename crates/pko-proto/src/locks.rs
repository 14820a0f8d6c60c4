//! Backend lock holders as Pulumi's DIY backends (`file://`, `s3://`, `gs://`, `azblob://`) name them in a conflict
//! (`<lock file>: created by <user>@<host> (pid <pid>) at <RFC 3339 time>`, `pkg/backend/diy/lock.go`), and as an agent
//! repeats them in a failed Update's message ([`describe`]): the contract between the agent, which judges holders on
//! its host, and the operator, which judges the others on an unlock request (`pulumi.com/unlock-request`).

/// One lock's holder as a conflict message names it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Holder {
    /// `user@host` as printed (for logs and events; no secret).
    pub who: String,
    /// The host part of [`Holder::who`] (`os.Hostname()` of the holding `pulumi`).
    pub hostname: String,
    /// Process id of the holding `pulumi`.
    pub pid: i32,
    /// When the lock was taken, as printed (RFC 3339, second precision); `None` when not printed.
    pub since: Option<String>,
}

impl std::fmt::Display for Holder {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{} (pid {})", self.who, self.pid)?;
        if let Some(t) = &self.since {
            write!(f, " since {t}")?;
        }
        Ok(())
    }
}

/// The holders named in `text` (a `pulumi` conflict's whole output, or an Update's message); empty when it names none
/// (the Pulumi Cloud's `[409] Conflict` names none).
pub fn holders(text: &str) -> Vec<Holder> {
    text.lines()
        .filter_map(|line| {
            let rest = line.split_once(": created by ")?.1;
            let (who, rest) = rest.split_once(" (pid ")?;
            let (pid, rest) = rest.split_once(')')?;
            let since = rest.trim().strip_prefix("at ").map(|t| t.trim().to_string()).filter(|t| !t.is_empty());
            let hostname = who.rsplit_once('@').map_or(who, |(_, h)| h).to_string();
            Some(Holder { who: who.to_string(), hostname, pid: pid.trim().parse().ok()?, since })
        })
        .collect()
}

/// `holders` one per line as an agent appends them to a conflict's Update message (`lock: created by <who> (pid <pid>)
/// at <time>`), which [`holders`] reads back.
pub fn describe(holders: &[Holder]) -> String {
    holders
        .iter()
        .map(|h| {
            format!(
                "lock: created by {} (pid {}){}",
                h.who,
                h.pid,
                h.since.as_ref().map(|t| format!(" at {t}")).unwrap_or_default()
            )
        })
        .collect::<Vec<_>>()
        .join("\n")
}

#[cfg(test)]
mod tests {
    use super::*;

    const CONFLICT: &str = "error: the stack is currently locked by 2 lock(s). Either wait for the other process(es) \
        to end or delete the lock file with `pulumi cancel`.
  file:///tmp/b/.pulumi/locks/organization/p/dev/1.json: created by root@node-a (pid 4242) at 2026-11-23T11:00:00Z
  file:///tmp/b/.pulumi/locks/organization/p/dev/2.json: created by ci@corp@node-a (pid 77) at 2026-11-23T12:00:00+01:00
";

    #[test]
    fn holders_are_read_from_the_conflict_and_from_their_description() {
        let h = holders(CONFLICT);
        assert_eq!(
            (h[0].who.as_str(), h[0].hostname.as_str(), h[0].pid, h[0].since.as_deref()),
            ("root@node-a", "node-a", 4242, Some("2026-11-23T11:00:00Z"))
        );
        assert_eq!((h[1].who.as_str(), h[1].hostname.as_str(), h[1].pid), ("ci@corp@node-a", "node-a", 77));
        assert_eq!(holders(&describe(&h)), h, "{}", describe(&h));
        assert_eq!(h[0].to_string(), "root@node-a (pid 4242) since 2026-11-23T11:00:00Z");
        assert!(holders("error: [409] Conflict: Another update is currently in progress.").is_empty());
    }
}
