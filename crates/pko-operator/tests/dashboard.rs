//! The fleet dashboard (`deploy/dashboards/pko-fleet.json`) against a real Prometheus (Debian's
//! `prometheus` package, installed by the test bed): two replicas over the bed's redis-server run Stacks
//! on a pool small enough to defer jobs and idle out agents; Prometheus scrapes both every second; every
//! PromQL expression of the dashboard must evaluate without error and return at least one series; every
//! alert of the chart's PrometheusRule (`prometheusRule.enabled`, rendered by the bed's `helm` for a
//! fleet) must evaluate without error, and the dashboard ConfigMap must carry the dashboard.

mod common;

use std::time::{Duration, Instant};

use common::*;
use pko_testbed::eventually;
use serde_json::json;

/// Expressions allowed to return no series in a healthy run, and why.
const MAY_BE_EMPTY: &[(&str, &str)] =
    &[("pko_reconcile_errors_total", "a reconcile error is counted when one happens; a healthy run has none")];

/// The chart rendered for a fleet of three with its PrometheusRule and dashboard ConfigMap: the
/// alerts' `(name, expr)` and the ConfigMap's dashboard JSON.
fn chart_alerts() -> (Vec<(String, String)>, serde_json::Value) {
    use serde::Deserialize;
    let chart = concat!(env!("CARGO_MANIFEST_DIR"), "/../../deploy/helm/pko");
    let sets = [
        "prometheusRule.enabled=true",
        "grafanaDashboard.enabled=true",
        "replicaCount=3",
        "redis.url=redis://redis:6379",
    ];
    let mut args =
        vec!["template", "pko", chart, "--namespace", "pko-system", "--api-versions", "monitoring.coreos.com/v1"];
    for s in &sets {
        args.extend(["--set", s]);
    }
    let (ok, out, err) = common::cluster::helm(&args);
    assert!(ok, "helm template: {err}");
    let docs: Vec<serde_json::Value> = serde_yaml_ng::Deserializer::from_str(&out)
        .filter_map(|d| serde_json::Value::deserialize(d).ok())
        .filter(|v| !v.is_null())
        .collect();
    let rule = docs.iter().find(|d| d["kind"] == "PrometheusRule").expect("the PrometheusRule");
    let alerts = rule["spec"]["groups"]
        .as_array()
        .into_iter()
        .flatten()
        .flat_map(|g| g["rules"].as_array().cloned().unwrap_or_default());
    let alerts = alerts
        .map(|r| {
            (r["alert"].as_str().unwrap_or_default().to_string(), r["expr"].as_str().unwrap_or_default().to_string())
        })
        .collect();
    let cm = docs
        .iter()
        .find(|d| d["kind"] == "ConfigMap" && d["metadata"]["labels"]["grafana_dashboard"] == "1")
        .expect("the dashboard ConfigMap");
    (alerts, serde_json::from_str(cm["data"]["pko-fleet.json"].as_str().unwrap()).expect("the dashboard JSON"))
}

fn exprs(dashboard: &serde_json::Value) -> Vec<String> {
    let mut out = Vec::new();
    for p in dashboard["panels"].as_array().into_iter().flatten() {
        for t in p["targets"].as_array().into_iter().flatten() {
            if let Some(e) = t["expr"].as_str() {
                out.push(e.to_string());
            }
        }
    }
    out
}

struct Prometheus(std::process::Child);

impl Drop for Prometheus {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

#[tokio::test]
async fn every_dashboard_expression_evaluates_to_series_on_a_real_prometheus() {
    let dashboard: serde_json::Value = serde_json::from_str(
        &std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/../../deploy/dashboards/pko-fleet.json"))
            .unwrap(),
    )
    .unwrap();
    let exprs = exprs(&dashboard);
    assert!(exprs.len() >= 20, "the dashboard has its panels: {}", exprs.len());
    let (alerts, shipped) = chart_alerts();
    assert_eq!(shipped, dashboard, "the chart ships the dashboard");
    assert!(alerts.len() >= 6 && alerts.iter().any(|(a, _)| a == "PkoShardsUnheld"), "{alerts:?}");

    let (client, ns, env) = setup("dashboard").await;
    passphrase_and_program(
        &ns,
        json!({"resources": {"r": {"type": "command:local:Command",
        "properties": {"create": "sleep 1; echo ${pulumi.stack}"}}}}),
    )
    .await;
    let prefix = pko_testbed::testbed().redis_prefix("dashboard");
    let redis = [
        "--redis-url",
        pko_testbed::testbed().redis_url(),
        "--redis-prefix",
        &prefix,
        "--pool-max-agents",
        "1",
        "--pool-idle-timeout-seconds",
        "2",
    ];
    let mut replicas = Vec::new();
    for r in ["r0", "r1"] {
        replicas.push(
            InProcessOperator::start_with(
                &client,
                &env,
                run_args_with(&env, ns.name(), &fleet_args(ns.name(), r, &redis)),
            )
            .await,
        );
    }
    for i in 0..4 {
        prog_stack(&ns, &env, &format!("s{i}"), json!({})).await;
    }

    // Prometheus scraping both replicas every second
    let dir = env.dir().join("prometheus");
    std::fs::create_dir_all(dir.join("data")).unwrap();
    let targets: Vec<String> = replicas
        .iter()
        .map(|r| r.metrics_url.trim_start_matches("http://").trim_end_matches("/metrics").to_string())
        .collect();
    let config = format!(
        "global: {{scrape_interval: 1s, evaluation_interval: 1s}}\nscrape_configs:\n  - job_name: pko\n    \
            static_configs:\n      - targets: {targets:?}\n"
    );
    std::fs::write(dir.join("prometheus.yml"), config).unwrap();
    let port = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
    let bin = which("prometheus")
        .expect("prometheus (Debian package `prometheus`, installed by scripts/testbed/packages.sh) on PATH");
    let _prometheus = Prometheus(
        std::process::Command::new(bin)
            .arg(format!("--config.file={}", dir.join("prometheus.yml").display()))
            .arg(format!("--storage.tsdb.path={}", dir.join("data").display()))
            .arg(format!("--web.listen-address=127.0.0.1:{port}"))
            .stdout(std::process::Stdio::null())
            .stderr(std::fs::File::create(dir.join("prometheus.log")).unwrap())
            .spawn()
            .expect("start prometheus"),
    );
    let base = format!("http://127.0.0.1:{port}");
    let http = reqwest::Client::new();
    let query = |q: String| {
        let (http, base) = (http.clone(), base.clone());
        async move {
            let text = http
                .get(format!("{base}/api/v1/query"))
                .query(&[("query", q.as_str())])
                .send()
                .await
                .map_err(|e| e.to_string())?
                .text()
                .await
                .map_err(|e| e.to_string())?;
            serde_json::from_str::<serde_json::Value>(&text).map_err(|e| format!("{e}: {text}"))
        }
    };

    let stacks = ns.api::<pko_api::Stack>();
    eventually("every Stack Ready", 180, || async {
        stacks.list(&Default::default()).await.unwrap().items.iter().filter(|s| ready(s)).count() == 4
    })
    .await;
    eventually("both replicas scraped and a pool agent idled out", 60, || async {
        let up = query("sum(up)".into()).await.ok();
        let up = up.as_ref().and_then(|v| v["data"]["result"][0]["value"][1].as_str()).map(str::to_string);
        let stopped = query("pko_pool_agents_stopped_total".into())
            .await
            .ok()
            .is_some_and(|v| v["data"]["result"].as_array().is_some_and(|a| !a.is_empty()));
        up.as_deref() == Some("2") && stopped
    })
    .await;
    // rates need two samples of every series in their window
    tokio::time::sleep(Duration::from_secs(3)).await;

    let t = Instant::now();
    let mut empty = Vec::new();
    for e in &exprs {
        let q = e.replace("$__rate_interval", "30s");
        let v = query(q.clone()).await.unwrap_or_else(|err| panic!("{q}: {err}"));
        assert_eq!(v["status"], "success", "{q}: {v}");
        if v["data"]["result"].as_array().is_none_or(Vec::is_empty) {
            empty.push(q);
        }
    }
    // alerts: each expression evaluates (a healthy run fires none but the fleet's shard count, which
    // the rendered chart sets to its default of 2,048 while this fleet has fewer)
    for (alert, e) in &alerts {
        let v = query(e.clone()).await.unwrap_or_else(|err| panic!("{alert}: {e}: {err}"));
        assert_eq!(v["status"], "success", "{alert}: {e}: {v}");
    }
    let unexpected: Vec<_> = empty.iter().filter(|q| !MAY_BE_EMPTY.iter().any(|(m, _)| q.contains(m))).collect();
    assert!(
        unexpected.is_empty(),
        "expressions with no series (a metric renamed, dropped or never recorded?): {unexpected:#?}"
    );
    eprintln!(
        "{} dashboard expressions and {} alerts evaluated on Prometheus in {:.1} s; empty (allowed): {}",
        exprs.len(),
        alerts.len(),
        t.elapsed().as_secs_f64(),
        empty.len()
    );
    for r in replicas {
        r.stop().await;
    }
}

fn which(bin: &str) -> Option<std::path::PathBuf> {
    std::env::var_os("PATH")
        .into_iter()
        .flat_map(|p| std::env::split_paths(&p).collect::<Vec<_>>())
        .map(|d| d.join(bin))
        .find(|p| p.is_file())
}
