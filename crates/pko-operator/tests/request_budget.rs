//! The API request budget of an operation (issue "Be light on the API server"): every request the
//! operator's client sends, by verb and resource, over 50 operations of one in-process replica — 10
//! Program Stacks created (10 `up`s), then 4 rounds of a config change of each (40 `up`s). Counted
//! where the operator sends them (a counting layer under its `kube::Client`), so the bed's other
//! traffic and the test's own requests are not in it; WATCHes (long-lived, one per kind) are left out.
//! The test prints the table per operation and fails when an operation costs more than [`BUDGET`]
//! requests — lowered with each cut, so a cut cannot regress. A second table counts 10 more operations
//! that change no spec (a `pulumi.com/reconciliation-request` of each Stack, as `kubectl pko sync`
//! sends): those need no Workspace write, and fail above [`SYNC_BUDGET`].

mod common;

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use common::*;
use pko_api::Stack;
use pko_testbed::{eventually, testbed};
use serde_json::json;

/// Stacks, and rounds of a change of each after their first `up`.
const STACKS: usize = 10;
const ROUNDS: usize = 4;
const OPERATIONS: f64 = (STACKS * (ROUNDS + 1)) as f64;

/// Requests per operation, all told (the issue's target is 10). Measured 2026-11-26: 26.40 before the
/// Stack controller read its own writes through its cache, 20.12 after, 14.22 after the Stack,
/// Update and outputs reads, the mirrored queue wait, event series and unchanged Workspace applies
/// were cut, 13.18 after Secrets were read only when changed (`docs/architecture.md`, "The request
/// budget of an operation").
const BUDGET: f64 = 14.0;

/// Requests per operation of a sync request (no spec change), all told: 10.60 measured, 9.60 after
/// Secrets were read only when changed.
const SYNC_BUDGET: f64 = 10.5;

/// Requests counted by `(verb, resource[/subresource])`.
type Counts = Arc<Mutex<BTreeMap<(String, String), f64>>>;

/// The verb and resource of a request as the API server names them: `GET` of one object, `LIST` or
/// `WATCH` of many, `POST`, `PUT`, `PATCH` (`APPLY` for server-side apply), `DELETE`. Pure.
fn classify(method: &http::Method, uri: &http::Uri, content_type: Option<&str>) -> (String, String) {
    let segments: Vec<&str> = uri.path().trim_matches('/').split('/').collect();
    // /api/v1/... or /apis/<group>/<version>/...; then [namespaces/<ns>/]<resource>[/<name>[/<sub>]]
    let rest: &[&str] = if segments.first() == Some(&"api") {
        segments.get(2..).unwrap_or_default()
    } else {
        segments.get(3..).unwrap_or_default()
    };
    let rest = match rest {
        ["namespaces", _ns, more @ ..] if !more.is_empty() => more,
        other => other,
    };
    let resource = match rest {
        [r] | [r, _] => r.to_string(),
        [r, _, sub, ..] => format!("{r}/{sub}"),
        [] => "?".into(),
    };
    let named = rest.len() >= 2;
    let watch = uri.query().is_some_and(|q| q.split('&').any(|kv| kv == "watch=true" || kv == "watch=1"));
    let verb = match *method {
        http::Method::GET if watch => "WATCH",
        http::Method::GET if named => "GET",
        http::Method::GET => "LIST",
        http::Method::PATCH if content_type.is_some_and(|c| c.contains("apply-patch")) => "APPLY",
        ref m => m.as_str(),
    };
    (verb.to_string(), resource)
}

/// A client of the bed whose every request is counted into `counts`, and every answer `409 Conflict`
/// (a write refused as decided on a stale copy) into `counts` as `("REFUSED", "409")`.
async fn counting_client(counts: Counts) -> kube::Client {
    let config = testbed().config().await.unwrap();
    let sent = counts.clone();
    let requests = tower::util::MapRequestLayer::new(move |req: http::Request<kube::client::Body>| {
        let ct = req.headers().get(http::header::CONTENT_TYPE).and_then(|v| v.to_str().ok());
        let key = classify(req.method(), req.uri(), ct);
        *sent.lock().unwrap().entry(key).or_default() += 1.0;
        req
    });
    let answers = tower::util::MapResponseLayer::new(move |res: http::Response<_>| {
        if res.status() == http::StatusCode::CONFLICT {
            *counts.lock().unwrap().entry(("REFUSED".into(), "409".into())).or_default() += 1.0;
        }
        res
    });
    kube::client::ClientBuilder::try_from(config)
        .unwrap()
        .with_layer(&tower::ServiceBuilder::new().layer(requests).layer(answers))
        .build()
}

fn delta(
    after: &BTreeMap<(String, String), f64>,
    before: &BTreeMap<(String, String), f64>,
) -> BTreeMap<(String, String), f64> {
    after
        .iter()
        .map(|(k, v)| (k.clone(), v - before.get(k).copied().unwrap_or(0.0)))
        .filter(|(_, v)| *v != 0.0)
        .collect()
}

/// Waits until every Stack is Ready at generation `generation` with its last update at it.
async fn all_ready_at(stacks: &kube::Api<Stack>, generation: i64) {
    eventually(&format!("all {STACKS} Stacks Ready at generation {generation}"), 300, || async {
        let all = stacks.list(&Default::default()).await.unwrap().items;
        all.len() == STACKS
            && all.iter().all(|s| {
                ready(s)
                    && s.status.as_ref().and_then(|st| st.last_update.as_ref()).and_then(|l| l.generation)
                        == Some(generation)
            })
    })
    .await;
}

#[test]
fn requests_are_classified_as_the_api_server_names_them() {
    let c = |m: http::Method, u: &str, ct: Option<&str>| classify(&m, &u.parse().unwrap(), ct);
    let s = |a: &str, b: &str| (a.to_string(), b.to_string());
    assert_eq!(c(http::Method::GET, "/apis/pulumi.com/v1/namespaces/n/stacks/web", None), s("GET", "stacks"));
    assert_eq!(
        c(http::Method::GET, "/apis/pulumi.com/v1/namespaces/n/stacks?labelSelector=x", None),
        s("LIST", "stacks")
    );
    assert_eq!(
        c(http::Method::GET, "/apis/pulumi.com/v1/stacks?watch=true&resourceVersion=5", None),
        s("WATCH", "stacks")
    );
    assert_eq!(
        c(
            http::Method::PATCH,
            "/apis/pulumi.com/v1/namespaces/n/stacks/web/status?fieldManager=x",
            Some("application/apply-patch+yaml")
        ),
        s("APPLY", "stacks/status")
    );
    assert_eq!(
        c(
            http::Method::PATCH,
            "/apis/auto.pulumi.com/v1alpha1/namespaces/n/updates/u",
            Some("application/merge-patch+json")
        ),
        s("PATCH", "updates")
    );
    assert_eq!(
        c(http::Method::POST, "/api/v1/namespaces/n/serviceaccounts/sa/token", None),
        s("POST", "serviceaccounts/token")
    );
    assert_eq!(c(http::Method::GET, "/api/v1/namespaces/n", None), s("GET", "namespaces"));
    assert_eq!(c(http::Method::POST, "/api/v1/namespaces/n/secrets", None), s("POST", "secrets"));
}

#[tokio::test]
async fn an_operation_costs_at_most_the_budget_in_api_requests() {
    let (_client, ns, env) = setup("budget").await;
    passphrase_and_program(
        &ns,
        json!({"resources": {"r": {"type": "command:local:Command",
        "properties": {"create": "echo ${n}"}}}, "config": {"n": {"type": "string"}}}),
    )
    .await;
    let counts: Counts = Arc::default();
    let operator_client = counting_client(counts.clone()).await;
    let op = InProcessOperator::start(&operator_client, &env, ns.name()).await;
    let stacks = ns.api::<Stack>();
    // from the first Stack on: the start's initial LISTs are the replica's, not an operation's
    let before = counts.lock().unwrap().clone();
    let t0 = Instant::now();
    for i in 0..STACKS {
        prog_stack(&ns, &env, &format!("s{i}"), json!({"n": "0"})).await;
    }
    all_ready_at(&stacks, 1).await;
    for round in 1..=ROUNDS {
        for i in 0..STACKS {
            let mut s = stacks.get(&format!("s{i}")).await.unwrap();
            s.spec.config = Some(serde_json::from_value(json!({"n": round.to_string()})).unwrap());
            stacks.replace(&format!("s{i}"), &Default::default(), &s).await.unwrap();
        }
        all_ready_at(&stacks, 1 + round as i64).await;
    }
    // the last status writes and finalizer releases of the last round
    tokio::time::sleep(Duration::from_secs(3)).await;
    let run = delta(&counts.lock().unwrap(), &before);
    let run_s = t0.elapsed().as_secs_f64();
    let refused = run.get(&("REFUSED".to_string(), "409".to_string())).copied().unwrap_or_default() / OPERATIONS;
    let total = table(
        &format!("API requests per operation ({OPERATIONS} operations in {run_s:.1} s"),
        &run,
        OPERATIONS,
        BUDGET,
    );
    println!("writes refused with 409 Conflict: {refused:.2} per operation");
    // a pass that decides on its cache waits for the cache to catch up with its own writes instead
    // of sending a pinned write the API server refuses (measured at 1,000 Stacks before that wait:
    // 0.92 refused per new Stack)
    assert!(
        refused <= 0.1,
        "{refused:.2} writes per operation refused with 409: decisions on copies the cache had not caught up"
    );
    assert!(total <= BUDGET, "an operation costs {total:.2} API requests, over the budget of {BUDGET}");
    assert!(
        total >= 5.0,
        "an operation makes at least its writes (Update created, its status twice, the Stack's status, the outputs \
            Secret)"
    );
    // the hot path reads its Stacks, Updates and Secrets from the caches (measured 0.26 of 50
    // operations' GETs and first LISTs together, each Secret read once; before the cuts 11.6)
    let hot = ["stacks", "updates", "secrets"];
    let reads: f64 = run
        .iter()
        .filter(|((verb, r), _)| (verb == "GET" || verb == "LIST") && hot.contains(&r.as_str()))
        .map(|(_, n)| n / OPERATIONS)
        .sum();
    assert!(
        reads <= 0.5,
        "{reads:.2} reads of Stacks, Updates and Secrets per operation: the hot path reads from the caches"
    );

    // operations that change no spec: a sync request of each Stack
    let before = counts.lock().unwrap().clone();
    let last = |s: &Stack| s.status.as_ref().and_then(|st| st.last_update.as_ref()).and_then(|l| l.name.clone());
    let firsts: Vec<Option<String>> = stacks.list(&Default::default()).await.unwrap().items.iter().map(last).collect();
    for i in 0..STACKS {
        let patch = json!({"metadata": {"annotations": {"pulumi.com/reconciliation-request": "budget-sync"}}});
        stacks
            .patch(&format!("s{i}"), &kube::api::PatchParams::default(), &kube::api::Patch::Merge(&patch))
            .await
            .unwrap();
    }
    eventually("every Stack ran its sync request", 300, || async {
        let all = stacks.list(&Default::default()).await.unwrap().items;
        all.iter().all(|s| ready(s) && !firsts.contains(&last(s)))
    })
    .await;
    tokio::time::sleep(Duration::from_secs(3)).await;
    let run = delta(&counts.lock().unwrap(), &before);
    op.stop().await;
    let total = table(
        &format!("API requests per sync-request operation ({STACKS} operations"),
        &run,
        STACKS as f64,
        SYNC_BUDGET,
    );
    assert!(total <= SYNC_BUDGET, "a sync request costs {total:.2} API requests, over the budget of {SYNC_BUDGET}");
    assert!(
        !run.keys().any(|(verb, resource)| verb == "APPLY" && resource == "workspaces"),
        "an unchanged Workspace is not applied again: {run:?}"
    );
    assert!(
        !run.keys().any(|(verb, resource)| verb == "GET" && resource == "secrets"),
        "an unchanged Secret is not read again: {run:?}"
    );
}

/// Prints the per-operation table of `run` (`operations` operations; WATCHes and the count of refusals left out) under
/// `title`;
/// returns the total per operation.
fn table(title: &str, run: &BTreeMap<(String, String), f64>, operations: f64, budget: f64) -> f64 {
    let mut per_op: Vec<(String, String, f64)> = run
        .iter()
        .filter(|((verb, _), _)| verb != "WATCH" && verb != "REFUSED")
        .map(|((verb, resource), n)| (verb.clone(), resource.clone(), n / operations))
        .collect();
    per_op.sort_by(|a, b| b.2.total_cmp(&a.2));
    let total: f64 = per_op.iter().map(|r| r.2).sum();
    eprintln!("{title}, one replica; as its client sent them, WATCHes left out):");
    for (verb, resource, n) in &per_op {
        eprintln!("  {verb:<7} {resource:<28} {n:>6.2}");
    }
    eprintln!("  total                                {total:>6.2}   (budget {budget})");
    total
}
