//! Is a delivery signed with the Receiver's token? Checked before anything of the body is read, in constant time
//! (HMAC verification and token comparison by `hmac`/`subtle`), per `spec.type`: the header each git host signs with.
//! Pure.

use axum::http::HeaderMap;
use hmac::{Hmac, Mac};
use pko_api::receiver::ReceiverType;
use sha2::Sha256;
use subtle::ConstantTimeEq;

/// Why a delivery is refused (401).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Refused {
    /// The header that carries the signature is missing.
    #[error("no {0} header")]
    Missing(&'static str),
    /// The signature does not match the body and the token.
    #[error("the {0} signature does not match")]
    Mismatch(&'static str),
}

/// Checks `body` and `headers` against `token` as `kind` signs them; `generic` needs nothing but the path.
///
/// Errors: [`Refused`].
pub fn verify(kind: ReceiverType, token: &[u8], headers: &HeaderMap, body: &[u8]) -> Result<(), Refused> {
    match kind {
        ReceiverType::Generic => Ok(()),
        ReceiverType::Github => hmac_header(headers, "x-hub-signature-256", Some("sha256="), token, body),
        ReceiverType::Bitbucket => hmac_header(headers, "x-hub-signature", Some("sha256="), token, body),
        ReceiverType::GenericHmac => hmac_header(headers, "x-signature", Some("sha256="), token, body),
        ReceiverType::Gitea if headers.contains_key("x-gitea-signature") => {
            hmac_header(headers, "x-gitea-signature", None, token, body)
        }
        ReceiverType::Gitea => hmac_header(headers, "x-hub-signature-256", Some("sha256="), token, body),
        ReceiverType::Gitlab => {
            let given = headers.get("x-gitlab-token").ok_or(Refused::Missing("X-Gitlab-Token"))?;
            if bool::from(given.as_bytes().ct_eq(token)) { Ok(()) } else { Err(Refused::Mismatch("X-Gitlab-Token")) }
        }
    }
}

/// `header` holds `prefix` and the hex HMAC-SHA256 of `body` keyed by `token`.
fn hmac_header(
    headers: &HeaderMap,
    header: &'static str,
    prefix: Option<&str>,
    token: &[u8],
    body: &[u8],
) -> Result<(), Refused> {
    let value = headers.get(header).and_then(|v| v.to_str().ok()).ok_or(Refused::Missing(header))?;
    let hex_sig = match prefix {
        Some(p) => value.strip_prefix(p).ok_or(Refused::Mismatch(header))?,
        None => value,
    };
    let sig = hex::decode(hex_sig.trim()).map_err(|_| Refused::Mismatch(header))?;
    let mut mac = Hmac::<Sha256>::new_from_slice(token).map_err(|_| Refused::Mismatch(header))?;
    mac.update(body);
    mac.verify_slice(&sig).map_err(|_| Refused::Mismatch(header))
}

/// The hex HMAC-SHA256 of `body` keyed by `token` (what a git host puts in its signature header). Pure.
pub fn sign(token: &[u8], body: &[u8]) -> String {
    let mut mac = Hmac::<Sha256>::new_from_slice(token).expect("HMAC takes a key of any length");
    mac.update(body);
    hex::encode(mac.finalize().into_bytes())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn headers(pairs: &[(&'static str, &str)]) -> HeaderMap {
        let mut h = HeaderMap::new();
        for (k, v) in pairs {
            h.insert(*k, v.parse().unwrap());
        }
        h
    }

    #[test]
    fn each_host_s_signature_is_checked_and_a_forged_one_refused() {
        let (token, body) = (b"s3cret".as_slice(), br#"{"ref":"refs/heads/main"}"#.as_slice());
        let good = sign(token, body);
        let gh = |sig: &str| verify(ReceiverType::Github, token, &headers(&[("x-hub-signature-256", sig)]), body);
        assert_eq!(gh(&format!("sha256={good}")), Ok(()));
        assert_eq!(gh(&format!("sha256={}", sign(b"other", body))), Err(Refused::Mismatch("x-hub-signature-256")));
        assert_eq!(gh("sha256=zz"), Err(Refused::Mismatch("x-hub-signature-256")));
        assert_eq!(gh(&good), Err(Refused::Mismatch("x-hub-signature-256")), "the prefix is required");
        assert_eq!(
            verify(ReceiverType::Github, token, &HeaderMap::new(), body),
            Err(Refused::Missing("x-hub-signature-256"))
        );
        let gitea = headers(&[("x-gitea-signature", &good)]);
        assert_eq!(verify(ReceiverType::Gitea, token, &gitea, body), Ok(()));
        let hmac = headers(&[("x-signature", &format!("sha256={good}"))]);
        assert_eq!(verify(ReceiverType::GenericHmac, token, &hmac, body), Ok(()));
        assert_eq!(verify(ReceiverType::GenericHmac, token, &hmac, b"tampered"), Err(Refused::Mismatch("x-signature")));
        let gl = |t: &str| verify(ReceiverType::Gitlab, token, &headers(&[("x-gitlab-token", t)]), body);
        assert_eq!(gl("s3cret"), Ok(()));
        assert_eq!(gl("s3cre"), Err(Refused::Mismatch("X-Gitlab-Token")));
        assert_eq!(verify(ReceiverType::Generic, token, &HeaderMap::new(), body), Ok(()));
    }
}
