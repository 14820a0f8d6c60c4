//! Saved plans (`pulumi preview --save-plan`, `pulumi up --plan`): their id and size bound, shared by the agent, which
//! saves and runs them, and the operator, which keeps them between the two and names them to the user.

use sha2::{Digest, Sha256};

/// Largest plan an agent returns and the operator keeps: 8 MiB (bytes). A preview whose plan is larger fails,
/// saying so; Pulumi's plans are a few KiB per resource.
pub const MAX_PLAN_BYTES: usize = 8 << 20;

/// Hex digits of a plan id.
pub const PLAN_ID_DIGITS: usize = 16;

/// The id of the plan `bytes`: the first [`PLAN_ID_DIGITS`] lowercase hex digits of their SHA-256 (what
/// `status.plan.id` shows and `pulumi.com/approve-plan` must name). Pure.
pub fn id(bytes: &[u8]) -> String {
    let digest = Sha256::digest(bytes);
    digest.iter().take(PLAN_ID_DIGITS / 2).map(|b| format!("{b:02x}")).collect()
}

/// Whether `s` is shaped like a plan id ([`PLAN_ID_DIGITS`] lowercase hex digits). Pure.
pub fn is_id(s: &str) -> bool {
    s.len() == PLAN_ID_DIGITS && s.bytes().all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_plan_id_is_16_hex_digits_of_its_sha256() {
        let a = id(b"{\"resourcePlans\":{}}");
        assert_eq!(a.len(), PLAN_ID_DIGITS);
        assert!(is_id(&a));
        assert_ne!(a, id(b"{\"resourcePlans\":{\"x\":1}}"), "other bytes, other id");
        assert_eq!(id(b""), "e3b0c44298fc1c14", "SHA-256 of nothing");
        assert!(!is_id("E3B0C44298FC1C14") && !is_id("e3b0") && !is_id("e3b0c44298fc1c1g"));
    }
}
