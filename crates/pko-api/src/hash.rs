//! Short names from content, written once: the lowercase hex of the first bytes of a SHA-256 digest, as object names
//! (`<stack>-<8 hex>`), classes, revision annotations and Flux artifact digests use it.

use sha2::{Digest, Sha256};

/// The first `bytes` bytes (at most 32) of the SHA-256 digest of `data`, as lowercase hex (two characters a byte).
/// Pure.
pub fn sha256_hex(data: impl AsRef<[u8]>, bytes: usize) -> String {
    let digest = Sha256::digest(data.as_ref());
    hex::encode(&digest[..bytes.min(digest.len())])
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_digest_is_cut_to_its_first_bytes() {
        let full = sha256_hex("abc", 32);
        assert_eq!(full, "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad");
        assert_eq!(sha256_hex("abc", 4), "ba7816bf");
        assert_eq!(sha256_hex("abc", 99), full, "at most the whole digest");
    }
}
