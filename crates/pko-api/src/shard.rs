//! The shard key of each kind: the name whose `namespace/name` hash places an object in a virtual shard of the fleet.
//! Everything made for a Stack shares the Stack's key, so one replica owns a Stack, its Workspace, its Updates and
//! their outputs; a Workspace or Update made directly (PKO's `auto.pulumi.com` API) is keyed by the Stack or Workspace
//! it names.

use crate::constants::STACK_NAME_LABEL;
use crate::{Program, Stack, Update, Workspace};

/// An object placed in a shard by a name.
pub trait ShardKey {
    /// The name keying the object's shard (with its namespace).
    fn shard_key(&self) -> String;
}

fn stack_label(meta: &k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta) -> Option<String> {
    meta.labels.as_ref()?.get(STACK_NAME_LABEL).cloned()
}

impl ShardKey for Stack {
    /// Its own name.
    fn shard_key(&self) -> String {
        self.metadata.name.clone().unwrap_or_default()
    }
}

impl ShardKey for Program {
    /// Its own name.
    fn shard_key(&self) -> String {
        self.metadata.name.clone().unwrap_or_default()
    }
}

impl ShardKey for Workspace {
    /// Its Stack's name (label `pulumi.com/stack-name`), else its own.
    fn shard_key(&self) -> String {
        stack_label(&self.metadata).unwrap_or_else(|| self.metadata.name.clone().unwrap_or_default())
    }
}

impl ShardKey for Update {
    /// Its Stack's name (label `pulumi.com/stack-name`), else its Workspace's (`spec.workspaceName`), else its own.
    fn shard_key(&self) -> String {
        stack_label(&self.metadata)
            .or_else(|| self.spec.workspace_name.clone().filter(|w| !w.is_empty()))
            .unwrap_or_else(|| self.metadata.name.clone().unwrap_or_default())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn children_share_their_stacks_key() {
        let mut w = Workspace::new("ws", Default::default());
        assert_eq!(w.shard_key(), "ws");
        w.metadata.labels = Some([(STACK_NAME_LABEL.to_string(), "my-stack".to_string())].into());
        assert_eq!(w.shard_key(), "my-stack");
        let mut u = Update::new("u-1", crate::UpdateSpec { workspace_name: Some("ws".into()), ..Default::default() });
        assert_eq!(u.shard_key(), "ws", "a hand-made Update goes with its Workspace");
        u.metadata.labels = w.metadata.labels.clone();
        assert_eq!(u.shard_key(), "my-stack");
    }
}
