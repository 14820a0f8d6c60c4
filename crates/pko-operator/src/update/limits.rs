//! Concurrency limits per workspace class: operations whose Workspaces share a namespace, service
//! account, image and pod template compete for the same agents, so at most `limit` of them run at once.
//! A worker that finds its class full does not wait (that would hold a worker, as PKO's blocked
//! reconciles do): it defers the job, and the Update's next reconcile queues it again.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use pko_api::Workspace;
use sha2::{Digest, Sha256};

/// The class of a Workspace: namespace, service account (default `default`), image (default: the
/// operator's), pod template and Pulumi log level (an agent's flag), hashed (16 hex characters after
/// the namespace, e.g. `team-a/3f2a…`). Agents of one class are interchangeable
/// ([`crate::workspace::pool`]).
pub fn workspace_class(ws: &Workspace) -> String {
    let s = &ws.spec;
    let key = serde_json::json!([s.service_account_name.as_deref().unwrap_or("default"), s.image, s.pod_template, s.pulumi_log_level.filter(|l| *l > 0)]);
    let hash: String = Sha256::digest(key.to_string()).iter().take(8).map(|b| format!("{b:02x}")).collect();
    format!("{}/{hash}", ws.metadata.namespace.as_deref().unwrap_or_default())
}

/// Running operations per class, at most `limit` each.
#[derive(Debug)]
pub struct ClassLimits {
    limit: usize,
    running: Mutex<HashMap<String, usize>>,
}

/// A slot of a class, given back when dropped.
#[derive(Debug)]
pub struct ClassPermit {
    limits: Arc<ClassLimits>,
    class: String,
}

impl Drop for ClassPermit {
    fn drop(&mut self) {
        let mut running = self.limits.running.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(n) = running.get_mut(&self.class) {
            *n -= 1;
            metrics::gauge!(crate::metrics::names::OPERATIONS_RUNNING, "class" => self.class.clone()).set(*n as f64);
            if *n == 0 {
                running.remove(&self.class);
            }
        }
    }
}

impl ClassLimits {
    /// At most `limit` (at least 1) operations per class.
    pub fn new(limit: usize) -> Arc<Self> {
        Arc::new(Self { limit: limit.max(1), running: Mutex::default() })
    }

    /// A slot of `class`, or `None` when `limit` operations of it run already.
    pub fn try_acquire(self: &Arc<Self>, class: &str) -> Option<ClassPermit> {
        let mut running = self.running.lock().unwrap_or_else(|e| e.into_inner());
        let n = running.entry(class.to_string()).or_default();
        if *n >= self.limit {
            return None;
        }
        *n += 1;
        metrics::gauge!(crate::metrics::names::OPERATIONS_RUNNING, "class" => class.to_string()).set(*n as f64);
        Some(ClassPermit { limits: self.clone(), class: class.to_string() })
    }

    /// Operations of `class` running now.
    pub fn running(&self, class: &str) -> usize {
        self.running.lock().unwrap_or_else(|e| e.into_inner()).get(class).copied().unwrap_or(0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use pko_api::WorkspaceSpec;

    fn ws(ns: &str, name: &str, sa: Option<&str>, image: Option<&str>) -> Workspace {
        let mut w = Workspace::new(name, WorkspaceSpec { service_account_name: sa.map(Into::into), image: image.map(Into::into), ..Default::default() });
        w.metadata.namespace = Some(ns.into());
        w
    }

    #[test]
    fn workspaces_of_one_class_share_it() {
        let a = workspace_class(&ws("team", "a", None, None));
        assert_eq!(a, workspace_class(&ws("team", "b", Some("default"), None)), "the name does not matter; default SA");
        assert!(a.starts_with("team/"));
        assert_ne!(a, workspace_class(&ws("other", "a", None, None)), "namespace");
        assert_ne!(a, workspace_class(&ws("team", "a", Some("deployer"), None)), "service account");
        assert_ne!(a, workspace_class(&ws("team", "a", None, Some("pulumi/pulumi:3"))), "image");
    }

    #[test]
    fn a_full_class_refuses_until_a_permit_is_dropped() {
        let l = ClassLimits::new(2);
        let p1 = l.try_acquire("c").unwrap();
        let _p2 = l.try_acquire("c").unwrap();
        assert!(l.try_acquire("c").is_none());
        assert!(l.try_acquire("d").is_some(), "classes are independent");
        assert_eq!(l.running("c"), 2);
        drop(p1);
        assert_eq!(l.running("c"), 1);
        assert!(l.try_acquire("c").is_some());
    }
}
