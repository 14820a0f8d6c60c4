//! The Stack's own cache ([`crate::stack_cache`]) for one operation, opened at most once: before `pulumi install` of
//! a revision the operation prepares (so what the install downloads — Go's modules — lands where the operation's
//! build reads it, not in the operation's `HOME`, which is removed with it), else once the stack is prepared. Closed
//! by the operation's driver whatever the outcome, so a failed step never leaves a Stack's cache held.

use std::collections::BTreeMap;
use std::path::Path;
use std::sync::Mutex;

use crate::operation::Operation;
use crate::stack_cache::{Opened, StackCaches};

/// The Stack's cache key: `<backend> <project> <stack>` (what identifies a Pulumi stack; also the agent's key of the
/// stacks it selected). Pure.
pub(super) fn stack_key(env: &BTreeMap<String, String>, project: &str, stack: &str) -> String {
    format!("{} {project} {stack}", env.get("PULUMI_BACKEND_URL").map(String::as_str).unwrap_or(""))
}

/// The cache an operation holds, if any.
#[derive(Default)]
pub(super) struct CacheSlot {
    opened: Mutex<Option<Opened>>,
}

impl CacheSlot {
    /// The variables of the cache of the Stack `key` that `env` and the agent's own environment do not set: the cache
    /// opened now if the slot holds none (a cache that cannot be opened, or that another operation of the Stack holds,
    /// is done without: the operation runs cold, said on its log). Nothing when the slot holds another key's cache.
    pub(super) fn vars(
        &self,
        caches: Option<&StackCaches>,
        op: &Operation,
        key: &str,
        env: &BTreeMap<String, String>,
    ) -> Vec<(String, String)> {
        let mut slot = self.opened.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        if slot.is_none() {
            *slot = caches.and_then(|c| open(c, op, key));
        }
        match slot.as_ref() {
            Some(o) if o.is_for(key) => o.env_unset(env, |k| std::env::var_os(k).is_some()),
            _ => Vec::new(),
        }
    }

    /// The variables for `pulumi install` in the fetched project `dir` (before it is installed): the cache of the
    /// Stack `stack` of that project.
    pub(super) fn install_vars(
        &self,
        caches: Option<&StackCaches>,
        op: &Operation,
        (dir, stack): (&Path, &str),
        env: &BTreeMap<String, String>,
    ) -> Vec<(String, String)> {
        if caches.is_none() {
            return Vec::new(); // a Workspace's own agent keeps no Stack caches: Pulumi.yaml need not be read
        }
        match crate::pulumi::project_info(dir) {
            Some((project, _)) => self.vars(caches, op, &stack_key(env, &project, stack), env),
            None => Vec::new(),
        }
    }

    /// Ends the operation's use of the cache it holds (sealed for the Stack's next operation).
    pub(super) fn close(self, caches: Option<&StackCaches>, op: &Operation) {
        let opened = self.opened.into_inner().unwrap_or_else(std::sync::PoisonError::into_inner);
        if let (Some(caches), Some(opened)) = (caches, opened)
            && let Err(e) = caches.close(opened)
        {
            tracing::warn!(operation = %op.id, error = %e, "closing the stack's cache");
        }
    }
}

fn open(caches: &StackCaches, op: &Operation, key: &str) -> Option<Opened> {
    let opened = match caches.open(key) {
        Ok(o) => o?,
        Err(e) => {
            op.log(format!("the stack's cache cannot be used ({e}); running without it"));
            return None;
        }
    };
    if opened.discarded > 0 {
        op.log(format!(
            "the stack's cache changed since its last operation ({} entries): emptied, not used",
            opened.discarded
        ));
    }
    Some(opened)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_key_names_backend_project_and_stack() {
        let env = BTreeMap::from([("PULUMI_BACKEND_URL".to_string(), "file:///state".to_string())]);
        assert_eq!(stack_key(&env, "app", "dev"), "file:///state app dev");
        assert_eq!(stack_key(&BTreeMap::new(), "app", "dev"), " app dev");
    }
}
