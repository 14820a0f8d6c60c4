//! What each Stack's pass last applied as its Workspace from this replica, so that a pass whose Workspace would not
//! change skips the apply (a server-side apply that changes nothing still costs a request; every update and every drift
//! check made one). The skip needs three facts: the Workspace this pass builds is the one last applied (a fingerprint
//! of it), the informer's cached Workspace is the very object that apply wrote or a later one with the same spec (same
//! uid and `generation`: nobody changed its spec since, and the cache has caught up), and the labels, annotations and
//! owner references applied are still on it (their changes do not move `generation`). Anything else — a restart
//! (nothing recorded), a spec edited by hand, a Workspace deleted or reclaimed, the cache behind — applies as before.

use std::collections::HashMap;
use std::hash::{Hash, Hasher};
use std::sync::{Mutex, MutexGuard, PoisonError};

use pko_api::Workspace;

/// The last Workspace applied per Stack `(namespace, name)`.
#[derive(Debug, Default)]
pub struct AppliedWorkspaces(Mutex<HashMap<(String, String), Applied>>);

/// One applied Workspace: the fingerprint of what was applied, and the object the apply returned.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Applied {
    fingerprint: u64,
    uid: String,
    generation: i64,
    /// The epoch of the Stack's shard the apply was made at.
    epoch: i64,
}

/// A fingerprint of the Workspace a pass would apply (its JSON form, hashed). Pure.
pub fn fingerprint(desired: &Workspace) -> u64 {
    let mut h = std::collections::hash_map::DefaultHasher::new();
    serde_json::to_string(desired).unwrap_or_default().hash(&mut h);
    h.finish()
}

/// Whether `cached` still carries the labels, annotations and owner references of `desired`. Pure.
pub fn metadata_kept(desired: &Workspace, cached: &Workspace) -> bool {
    let has_all = |want: &Option<std::collections::BTreeMap<String, String>>,
                   got: &Option<std::collections::BTreeMap<String, String>>| {
        want.iter().flatten().all(|(k, v)| got.as_ref().and_then(|g| g.get(k)) == Some(v))
    };
    has_all(&desired.metadata.labels, &cached.metadata.labels)
        && has_all(&desired.metadata.annotations, &cached.metadata.annotations)
        && desired
            .metadata
            .owner_references
            .as_ref()
            .is_none_or(|o| cached.metadata.owner_references.as_ref() == Some(o))
}

impl AppliedWorkspaces {
    fn map(&self) -> MutexGuard<'_, HashMap<(String, String), Applied>> {
        self.0.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// The cached Workspace of Stack `ns/name`, its shard held at `epoch`, when applying `desired` would change nothing
    /// (the rules in the module's documentation; an apply recorded at another epoch says nothing: the shard's holders
    /// in between may have applied); `None`: apply.
    pub fn unchanged(
        &self,
        ns: &str,
        name: &str,
        desired: &Workspace,
        cached: Option<&Workspace>,
        epoch: i64,
    ) -> Option<Workspace> {
        let cached = cached?;
        let applied = self.map().get(&(ns.to_string(), name.to_string())).filter(|a| a.epoch == epoch).cloned()?;
        let same_object = cached.metadata.uid.as_deref() == Some(applied.uid.as_str())
            && cached.metadata.generation == Some(applied.generation);
        (same_object
            && cached.metadata.deletion_timestamp.is_none()
            && applied.fingerprint == fingerprint(desired)
            && metadata_kept(desired, cached))
        .then(|| cached.clone())
    }

    /// Records that `desired` was applied to Stack `ns/name`'s Workspace, its shard held at `epoch`, which the apply
    /// returned as `written`.
    pub fn record(&self, ns: &str, name: &str, desired: &Workspace, written: &Workspace, epoch: i64) {
        let (Some(uid), Some(generation)) = (written.metadata.uid.clone(), written.metadata.generation) else { return };
        self.map().insert(
            (ns.to_string(), name.to_string()),
            Applied { fingerprint: fingerprint(desired), uid, generation, epoch },
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::BTreeMap;

    fn ws(uid: &str, generation: i64, image: &str) -> Workspace {
        let mut w = Workspace::new("web", Default::default());
        w.metadata.uid = Some(uid.into());
        w.metadata.generation = Some(generation);
        w.metadata.labels = Some(BTreeMap::from([("pulumi.com/stack-name".to_string(), "web".to_string())]));
        w.spec.image = Some(image.into());
        w
    }

    #[test]
    fn an_apply_is_skipped_only_when_nothing_would_change() {
        let applied = AppliedWorkspaces::default();
        let desired = ws("", 0, "pulumi:1");
        let written = ws("u-1", 3, "pulumi:1");
        assert!(
            applied.unchanged("a", "web", &desired, Some(&written), 1).is_none(),
            "nothing recorded (a restart): apply"
        );
        applied.record("a", "web", &desired, &written, 1);
        assert!(
            applied.unchanged("a", "web", &desired, Some(&written), 1).is_some(),
            "the same Workspace, cached as written: skip"
        );
        assert!(
            applied.unchanged("a", "web", &desired, None, 1).is_none(),
            "not cached (deleted, or the cache is behind): apply"
        );
        assert!(
            applied.unchanged("a", "web", &ws("", 0, "pulumi:2"), Some(&written), 1).is_none(),
            "a new spec: apply"
        );
        assert!(
            applied.unchanged("a", "web", &desired, Some(&ws("u-1", 4, "pulumi:1")), 1).is_none(),
            "edited by someone since: apply"
        );
        assert!(
            applied.unchanged("a", "web", &desired, Some(&ws("u-2", 3, "pulumi:1")), 1).is_none(),
            "a new object (recreated): apply"
        );
        let mut stripped = written.clone();
        stripped.metadata.labels = None;
        assert!(
            applied.unchanged("a", "web", &desired, Some(&stripped), 1).is_none(),
            "its label removed by hand: apply"
        );
        assert!(applied.unchanged("b", "web", &desired, Some(&written), 1).is_none(), "another namespace's Stack");
        assert!(
            applied.unchanged("a", "web", &desired, Some(&written), 2).is_none(),
            "applied before the shard was lost: apply"
        );
    }
}
