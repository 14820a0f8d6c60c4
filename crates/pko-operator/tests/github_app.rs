//! GitHub App git credentials (PKO 2.7, `gitAuth.githubApp`) end to end on the bed: a loopback
//! "GitHub API" checks the App JWT (RS256 with the App's public key, `iss` = the App id, at most ten
//! minutes) and answers an installation token; the private git server accepts only that token. A Stack
//! whose App credentials are right deploys from the private repository; one whose App id is wrong
//! stalls `SourceUnavailable` with GitHub's refusal.

mod common;

use std::sync::{Arc, Mutex};

use common::*;
use k8s_openapi::api::core::v1::Secret;
use pko_api::Stack;
use pko_testbed::eventually;
use serde_json::json;

const TOKEN: &str = "ghs_loopbackInstallationToken42";
const APP_ID: &str = "12345";
const INSTALLATION: &str = "678";

fn openssl(args: &[&str], input: Option<&str>) -> String {
    use std::io::Write;
    let mut child = std::process::Command::new("openssl")
        .args(args)
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    child.stdin.take().unwrap().write_all(input.unwrap_or_default().as_bytes()).unwrap();
    let out = child.wait_with_output().unwrap();
    assert!(out.status.success(), "openssl {args:?}");
    String::from_utf8(out.stdout).unwrap()
}

/// A loopback GitHub API: `POST /app/installations/{id}/access_tokens` answers 201 with [`TOKEN`] to a
/// valid App JWT for [`APP_ID`] and [`INSTALLATION`], 401 otherwise (GitHub's message). Returns its
/// base URL and the JWT issuers it saw.
/// The API's state: the key that checks JWTs and the issuers seen.
type ApiState = (Arc<jsonwebtoken::DecodingKey>, Arc<Mutex<Vec<String>>>);

async fn github_api(public_pem: String) -> (String, Arc<Mutex<Vec<String>>>) {
    use axum::extract::{Path, State};
    use axum::http::{HeaderMap, StatusCode};
    let seen = Arc::new(Mutex::new(Vec::new()));
    let key = Arc::new(jsonwebtoken::DecodingKey::from_rsa_pem(public_pem.as_bytes()).unwrap());
    let state = (key, seen.clone());
    let app = axum::Router::new()
        .route(
            "/app/installations/{id}/access_tokens",
            axum::routing::post(
                |State((key, seen)): State<ApiState>, Path(id): Path<String>, headers: HeaderMap| async move {
                    let jwt = headers
                        .get("authorization")
                        .and_then(|v| v.to_str().ok())
                        .and_then(|v| v.strip_prefix("Bearer "))
                        .unwrap_or_default()
                        .to_string();
                    let mut validation = jsonwebtoken::Validation::new(jsonwebtoken::Algorithm::RS256);
                    validation.set_required_spec_claims(&["exp", "iat", "iss"]);
                    let claims =
                        jsonwebtoken::decode::<pko_git::github_app::Claims>(&jwt, &key, &validation).map(|d| d.claims);
                    let refused = |m: &str| {
                        (
                            StatusCode::UNAUTHORIZED,
                            [("content-type", "application/json")],
                            json!({"message": m}).to_string(),
                        )
                    };
                    match claims {
                        Ok(c) => {
                            seen.lock().unwrap().push(c.iss.clone());
                            if c.exp.saturating_sub(c.iat) > 660 {
                                refused("'Expiration time' claim ('exp') is too far in the future")
                            } else if c.iss != APP_ID || id != INSTALLATION {
                                refused("Integration not found")
                            } else {
                                (
                                    StatusCode::CREATED,
                                    [("content-type", "application/json")],
                                    json!({"token": TOKEN, "expires_at": "2026-11-24T06:00:00Z"}).to_string(),
                                )
                            }
                        }
                        Err(_) => refused("A JSON web token could not be decoded"),
                    }
                },
            ),
        )
        .with_state(state);
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}", listener.local_addr().unwrap());
    tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });
    (url, seen)
}

#[tokio::test]
async fn github_app_credentials_buy_an_installation_token_for_the_private_repository() {
    let (client, ns, env) = setup("ghapp").await;
    let private_pem = openssl(&["genrsa", "2048"], None);
    let public_pem = openssl(&["rsa", "-pubout"], Some(&private_pem));
    let (api, seen) = github_api(public_pem).await;
    let root = env.dir().join("git-root");
    std::fs::create_dir_all(&root).unwrap();
    let program = "name: app\nruntime: yaml\nresources:\n  c:\n    type: command:local:Command\n    properties:\n      \
        create: echo via-app\noutputs:\n  out: ${c.stdout}\n";
    let commit = pko_testbed::git::bare_repo_with(&root, "app.git", &[("Pulumi.yaml", program)]);
    let git =
        pko_testbed::git::GitHttpServer::start(&root, "127.0.0.1:0", Some(("git".into(), TOKEN.into()))).await.unwrap();
    passphrase_secret(&ns).await;
    for (name, app_id) in [("app", APP_ID), ("wrong-app", "999")] {
        create(
            &ns.api::<Secret>(),
            json!({"apiVersion": "v1", "kind": "Secret", "metadata": {"name": name},
                   "stringData": {"appID": format!("{app_id}\n"), "installationID": INSTALLATION,
                       "privateKey": private_pem}}),
        )
        .await;
    }
    let _op =
        InProcessOperator::start_with(&client, &env, run_args_with(&env, ns.name(), &["--github-api-url", &api])).await;
    let stacks = ns.api::<Stack>();
    let secret = |name: &str, key: &str| json!({"type": "Secret", "secret": {"name": name, "key": key}});
    for (stack, secret_name) in [("via-app", "app"), ("wrong-app", "wrong-app")] {
        create(
            &stacks,
            json!({"apiVersion": "pulumi.com/v1", "kind": "Stack", "metadata": {"name": stack},
                   "spec": {"stack": stack, "projectRepo": git.url("app.git"), "branch": "main",
                       "backend": env.backend_url(), "envRefs": passphrase_env_refs(),
                            "gitAuth": {"githubApp": {"appID": secret(secret_name, "appID"),
                                "installationID": secret(secret_name, "installationID"),
                                    "privateKey": secret(secret_name, "privateKey")}}}}),
        )
        .await;
    }
    eventually("the App's Stack is Ready", 120, || async { ready(&stacks.get("via-app").await.unwrap()) }).await;
    let st = stacks.get("via-app").await.unwrap().status.unwrap();
    assert_eq!(st.outputs.unwrap()["out"], json!("via-app"));
    assert_eq!(st.last_update.unwrap().last_successful_commit.as_deref(), Some(commit.as_str()));
    // one exchange for the operator's ls-remote, one for the operation's clone (the key stays in the operator)
    assert!(seen.lock().unwrap().iter().filter(|i| *i == APP_ID).count() >= 2, "{:?}", seen.lock().unwrap());
    eventually("the wrong App stalls with GitHub's refusal", 60, || async {
        stalled(&stacks.get("wrong-app").await.unwrap())
            .is_some_and(|(r, m)| r == "SourceUnavailable" && m.contains("returned 401: Integration not found"))
    })
    .await;
    let all = serde_json::to_string(&stacks.list(&Default::default()).await.unwrap()).unwrap()
        + &serde_json::to_string(&ns.api::<pko_api::Update>().list(&Default::default()).await.unwrap()).unwrap();
    assert!(!all.contains(TOKEN) && !all.contains("PRIVATE KEY"), "no token or key in any Stack or Update");
}
