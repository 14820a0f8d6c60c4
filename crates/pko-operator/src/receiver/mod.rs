//! Receivers (issue 51): push webhooks that reconcile the Stacks a commit concerns within a second, on any replica.
//!
//! - the Receiver controller (`controller.rs`, the Receiver's shard holder) reads the token of `spec.secretRef`,
//!   publishes `status.webhookPath` (`/hook/<sha256(token + name + namespace)>`, Flux's) and `Ready`, or `Stalled`
//!   naming the field;
//! - the hook endpoint (`hook.rs`, every replica, `--webhook-bind-address`): finds the Receiver by path, verifies the
//!   signature (`verify.rs`) before reading the payload (`payload.rs`), selects the Stacks (`select.rs`) and asks
//!   each to sync with PKO's `pulumi.com/reconciliation-request` annotation — a write any replica may make; the
//!   Stack's shard holder reconciles it at once (the 60 s poll of `resyncFrequencySeconds` stays as the fallback).

pub mod controller;
pub mod hook;
pub mod payload;
pub mod select;
pub mod verify;

use sha2::{Digest, Sha256};

/// The key of the token in a Receiver's Secret (Flux's).
pub const TOKEN_KEY: &str = "token";

/// The webhook path of Receiver `namespace/name` with `token`: `/hook/<hex sha256 of token + name + namespace>`
/// (Flux's `notification-controller` computes it the same way). Pure.
pub fn webhook_path(token: &[u8], name: &str, namespace: &str) -> String {
    let mut h = Sha256::new();
    h.update(token);
    h.update(name.as_bytes());
    h.update(namespace.as_bytes());
    format!("/hook/{}", hex::encode(h.finalize()))
}

#[cfg(test)]
mod tests {
    use sha2::Digest;

    #[test]
    fn the_path_is_flux_s_digest_of_token_name_and_namespace() {
        let want = format!("/hook/{}", hex::encode(sha2::Sha256::digest(b"tokenrecvteam")));
        assert_eq!(super::webhook_path(b"token", "recv", "team"), want);
        assert_ne!(super::webhook_path(b"token", "recv", "team"), super::webhook_path(b"token", "recv", "other"));
    }
}
