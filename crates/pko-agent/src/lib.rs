//! The workspace agent (`pko-agent`): a tonic gRPC service (`pko.agent.v1.Agent`) that runs the real Pulumi CLI for a
//! pool of stacks.
//!
//! - [`service`]: the RPCs (Run, Attach, Cancel, Status, PulumiVersion, WhoAmI) and shutdown;
//! - [`operation`]: per-operation event logs that clients follow from the first event;
//! - [`runner`]: one operation, step by step; [`pulumi`]: the CLI's command lines and error mapping;
//! - [`source`]: git, artifact, local and project-info sources in a size-bounded cache; [`archive`]: safe, bounded
//!   extraction of hostile tarballs;
//! - [`values`]: Secret/ConfigMap/env/file references; [`auth`]: TokenReview + SubjectAccessReview;
//! - [`sandbox`]: per-operation directories, so nothing of one operation reaches the next on a pooled agent;
//!   [`trees`]: dependency trees shared read-only between them, verified before each use; [`supervise`]: every process
//!   of an operation ends with it and with its agent;
//! - [`mask`]: secrets never leave the agent unmasked; [`locks`]: stale backend locks of dead holders; [`sidecars`]:
//!   truncated `file://` attribute sidecars a killed `pulumi` leaves.
#![forbid(unsafe_code)]

pub mod archive;
pub mod auth;
pub mod convert;
pub mod locks;
pub mod mask;
pub mod operation;
pub mod output;
pub mod pulumi;
pub mod runner;
pub mod sandbox;
pub mod seed;
pub mod service;
pub mod sidecars;
pub mod source;
pub mod stack_cache;
pub mod supervise;
pub mod trees;
pub mod values;
