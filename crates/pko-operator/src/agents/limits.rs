//! Concurrency limits per workspace class ([`super::class`]): operations whose Workspaces share a class compete for the
//! same agents, so at most `limit` of them run at once. A worker that finds its class full does not wait (that would
//! hold a worker, as PKO's blocked reconciles do): it defers the job, and the worker offers it again a second later.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

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
        let mut running = self.limits.running.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        if let Some(n) = running.get_mut(&self.class) {
            *n -= 1;
            metrics::gauge!(crate::metric_names::OPERATIONS_RUNNING, "class" => self.class.clone()).set(*n as f64);
            crate::load::set_running(&self.class, *n);
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
        let mut running = self.running.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        let n = running.entry(class.to_string()).or_default();
        if *n >= self.limit {
            return None;
        }
        *n += 1;
        metrics::gauge!(crate::metric_names::OPERATIONS_RUNNING, "class" => class.to_string()).set(*n as f64);
        crate::load::set_running(class, *n);
        Some(ClassPermit { limits: self.clone(), class: class.to_string() })
    }

    /// Most operations of one class at once.
    pub fn limit(&self) -> usize {
        self.limit
    }

    /// Operations of `class` running now.
    pub fn running(&self, class: &str) -> usize {
        self.running.lock().unwrap_or_else(std::sync::PoisonError::into_inner).get(class).copied().unwrap_or(0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

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
