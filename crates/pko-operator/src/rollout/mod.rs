//! StackRollouts (`pulumi.com/v1alpha1`, ours): one source change rolled out to the Stacks it concerns in ordered
//! steps. The rollout controller ([`controller`]: the holder of the rollout's shard) reads the governed Stacks and
//! writes the rollout's status — the revision, the step, the admitted Stacks — computed by [`plan`] (pure); each
//! Stack's controller reads that status from its cache and holds a new revision its rollout has not admitted
//! (`crate::stack::rollout_hold`). They meet only through the two objects' status.

pub mod controller;
pub mod plan;
