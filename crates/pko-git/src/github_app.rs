//! GitHub App git credentials (PKO 2.7, `gitAuth.githubApp`): the App's id and RSA private key sign a JWT (RS256, `iss`
//! = the App id, issued 60 s in the past for clock skew, expiring after 10 min, as GitHub requires), which buys a
//! one-hour installation token from `POST {api}/app/installations/{installation}/access_tokens` (HTTP 201, `{"token":
//! …}`). The token is then used as a personal access token (basic auth, user `git`), as PKO does.
//!
//! PKO calls `https://api.github.com` only; ours takes the API base URL (GitHub Enterprise Server:
//! `https://<host>/api/v3`), the operator's `--github-api-url`.

use std::time::{Duration, SystemTime, UNIX_EPOCH};

/// GitHub's public API (PKO's fixed URL; the default of `--github-api-url`).
pub const DEFAULT_API_URL: &str = "https://api.github.com";

/// The claims of an App JWT.
#[derive(Debug, serde::Serialize, serde::Deserialize, PartialEq, Eq)]
pub struct Claims {
    /// Issued at, seconds since the epoch (60 s in the past).
    pub iat: u64,
    /// Expiry, seconds since the epoch (10 min after now).
    pub exp: u64,
    /// The App id.
    pub iss: String,
}

/// Why no installation token was had. Never carries the key or a token.
#[derive(Debug, thiserror::Error)]
pub enum GitHubAppError {
    /// The App id or the installation id is not a number.
    #[error("GitHub App {0} {1:?} is not a number")]
    NotANumber(&'static str, String),
    /// The private key is not an RSA key in PEM (PKCS#1 or PKCS#8).
    #[error("GitHub App private key: {0}")]
    Key(String),
    /// The API could not be reached.
    #[error("GitHub API {0}: {1}")]
    Request(String, String),
    /// The API answered something other than 201 with a token.
    #[error("GitHub API {0} returned {1}: {2}")]
    Refused(String, u16, String),
}

/// The signed App JWT of `app_id` with `private_key_pem` at `now` (seconds since the epoch). Pure.
///
/// Errors: [`GitHubAppError::Key`].
pub fn app_jwt(app_id: &str, private_key_pem: &str, now: u64) -> Result<String, GitHubAppError> {
    let key = jsonwebtoken::EncodingKey::from_rsa_pem(private_key_pem.as_bytes())
        .map_err(|e| GitHubAppError::Key(e.to_string()))?;
    let claims = Claims { iat: now.saturating_sub(60), exp: now + 600, iss: app_id.to_string() };
    jsonwebtoken::encode(&jsonwebtoken::Header::new(jsonwebtoken::Algorithm::RS256), &claims, &key)
        .map_err(|e| GitHubAppError::Key(e.to_string()))
}

/// Exchanges the App's credentials for an installation token at `api_url` (no trailing slash needed). Ids are trimmed
/// (Secrets often end in a newline).
///
/// Errors: [`GitHubAppError`]: a non-numeric id, a bad key, no answer (30 s), or a refusal (the status and GitHub's
/// message).
pub async fn installation_token(
    api_url: &str,
    app_id: &str,
    installation_id: &str,
    private_key_pem: &str,
) -> Result<String, GitHubAppError> {
    let (app_id, installation_id) = (app_id.trim(), installation_id.trim());
    if app_id.is_empty() || !app_id.chars().all(|c| c.is_ascii_digit()) {
        return Err(GitHubAppError::NotANumber("appID", app_id.into()));
    }
    if installation_id.is_empty() || !installation_id.chars().all(|c| c.is_ascii_digit()) {
        return Err(GitHubAppError::NotANumber("installationID", installation_id.into()));
    }
    let now = SystemTime::now().duration_since(UNIX_EPOCH).map(|d| d.as_secs()).unwrap_or(0);
    let jwt = app_jwt(app_id, private_key_pem, now)?;
    let url = format!("{}/app/installations/{installation_id}/access_tokens", api_url.trim_end_matches('/'));
    let client = reqwest::Client::builder()
        .timeout(Duration::from_secs(30))
        .build()
        .map_err(|e| GitHubAppError::Request(url.clone(), e.to_string()))?;
    let resp = client
        .post(&url)
        .bearer_auth(jwt)
        .header("Accept", "application/vnd.github+json")
        .header("X-GitHub-Api-Version", "2022-11-28")
        .header("User-Agent", "pko-operator")
        .send()
        .await
        .map_err(|e| GitHubAppError::Request(url.clone(), e.to_string()))?;
    let status = resp.status().as_u16();
    let body = resp.text().await.map_err(|e| GitHubAppError::Request(url.clone(), e.to_string()))?;
    let token = serde_json::from_str::<serde_json::Value>(&body)
        .ok()
        .and_then(|v| v.get("token").and_then(|t| t.as_str()).map(str::to_string));
    match token {
        Some(t) if status == 201 && !t.is_empty() => Ok(t),
        _ => {
            // GitHub's error body is `{"message": …}`; a token never appears in a refusal
            let message = serde_json::from_str::<serde_json::Value>(&body)
                .ok()
                .and_then(|v| v.get("message").and_then(|m| m.as_str()).map(str::to_string));
            Err(GitHubAppError::Refused(url, status, message.unwrap_or_else(|| "no token in the answer".into())))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ids_must_be_numbers_and_keys_rsa_pem() {
        let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
        let e = rt.block_on(installation_token("http://127.0.0.1:9", "abc", "1", "")).unwrap_err();
        assert_eq!(e.to_string(), "GitHub App appID \"abc\" is not a number");
        let e = rt.block_on(installation_token("http://127.0.0.1:9", "12\n", " x", "")).unwrap_err();
        assert_eq!(e.to_string(), "GitHub App installationID \"x\" is not a number");
        assert!(matches!(app_jwt("1", "not a key", 0), Err(GitHubAppError::Key(_))));
    }
}
