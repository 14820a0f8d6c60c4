//! Scheduled drift detection end to end on the test bed (PKO's proposed API, #1037): a Python program
//! whose dynamic provider manages a file; the file is changed behind Pulumi's back; the Stack's drift
//! check (`pulumi refresh --preview-only`, through the operator and a real agent) reports the drifted
//! resource in `DriftDetected` and an event without touching it; with `autoRemediate` an `up --refresh`
//! puts the file back and `DriftDetected` turns False.

mod common;

use std::time::Duration;

use common::*;
use kube::api::{Patch, PatchParams};
use pko_api::Stack;
use pko_testbed::eventually;
use serde_json::json;

/// A Python program with a dynamic provider whose `read` reports the file's real content, so a
/// refresh sees a change made behind Pulumi's back.
const PROGRAM: &str = r#"import os
import pulumi
from pulumi.dynamic import CreateResult, DiffResult, ReadResult, Resource, ResourceProvider, UpdateResult


class FileProvider(ResourceProvider):
    def create(self, props):
        with open(props["path"], "w") as f:
            f.write(props["content"])
        return CreateResult(id_=props["path"], outs=props)

    def read(self, id_, props):
        if not os.path.exists(id_):
            return ReadResult(id_=None, outs={})
        with open(id_) as f:
            return ReadResult(id_=id_, outs={**props, "content": f.read()})

    def diff(self, id_, olds, news):
        changed = [k for k in ("path", "content") if olds.get(k) != news.get(k)]
        return DiffResult(changes=bool(changed), replaces=["path"] if "path" in changed else [])

    def update(self, id_, olds, news):
        with open(news["path"], "w") as f:
            f.write(news["content"])
        return UpdateResult(outs=news)

    def delete(self, id_, props):
        if os.path.exists(id_):
            os.remove(id_)


class File(Resource):
    def __init__(self, name, path, content):
        super().__init__(FileProvider(), name, {"path": path, "content": content})


File("managed", pulumi.Config().require("path"), "desired\n")
"#;

fn drift(s: &Stack) -> Option<(String, String, String)> {
    stack_condition(s, "DriftDetected")
}

#[tokio::test]
async fn a_drift_check_reports_a_change_made_behind_pulumis_back_and_auto_remediation_undoes_it() {
    let (client, ns, env) = setup("drift").await;
    let dir = env.dir().join("drifty");
    std::fs::create_dir_all(&dir).unwrap();
    std::fs::write(dir.join("Pulumi.yaml"), "name: drifty\nruntime: python\n").unwrap();
    std::fs::write(dir.join("__main__.py"), PROGRAM).unwrap();
    let managed = env.dir().join("managed.txt");
    passphrase_secret(&ns).await;
    let op = InProcessOperator::start(&client, &env, ns.name()).await;
    let stacks = ns.api::<Stack>();
    create(
        &stacks,
        json!({"apiVersion": "pulumi.com/v1", "kind": "Stack", "metadata": {"name": "drifty"},
               "spec": {"stack": "dev", "backend": env.backend_url(), "envRefs": passphrase_env_refs(),
                        "config": {"path": managed.display().to_string()},
                        "workspaceTemplate": {"spec": {"local": {"dir": dir.display().to_string()}}},
                        // every 2 s (six fields: seconds first), report only
                        "driftDetection": {"schedules": [{"cron": "*/2 * * * * *"}]}}}),
    )
    .await;
    eventually("the Stack is Ready", 240, || async { ready(&stacks.get("drifty").await.unwrap()) }).await;
    assert_eq!(std::fs::read_to_string(&managed).unwrap(), "desired\n");
    let first = stacks.get("drifty").await.unwrap().status.unwrap().last_update.unwrap().name;

    // a check with nothing changed
    eventually("a check finds no drift", 90, || async {
        drift(&stacks.get("drifty").await.unwrap()).is_some_and(|(s, r, _)| s == "False" && r == "NoChanges")
    })
    .await;
    let st = stacks.get("drifty").await.unwrap();
    assert!(ready(&st), "a drift check leaves the Stack Ready");
    let dd = st.status.clone().unwrap().drift_detection.unwrap();
    assert!(
        dd.last_check.is_some() && dd.last_check_update.as_deref().is_some_and(|u| u.starts_with("drifty-drift-")),
        "{dd:?}"
    );

    // changed behind Pulumi's back
    std::fs::write(&managed, "changed\n").unwrap();
    eventually("the drift is reported", 90, || async {
        drift(&stacks.get("drifty").await.unwrap()).is_some_and(|(s, r, _)| s == "True" && r == "Changes")
    })
    .await;
    let st = stacks.get("drifty").await.unwrap();
    let (_, _, message) = drift(&st).unwrap();
    assert!(
        message.starts_with(
            "1 resource(s) drifted: urn:pulumi:dev::drifty::pulumi-python:dynamic:Resource::managed (update: content)"
        ),
        "{message}"
    );
    let drifted = st.status.clone().unwrap().drift_detection.unwrap().drifted_resources.unwrap();
    assert_eq!((drifted.len(), drifted[0].op.as_str()), (1, "update"));
    // the event is published after the status write that sets the condition (effects follow the write)
    let events_api = ns.api::<k8s_openapi::api::events::v1::Event>();
    eventually("a StackDriftDetected event names the resource", 30, || async {
        let events = events_api.list(&Default::default()).await.unwrap().items;
        events.iter().any(|e| {
            e.reason.as_deref() == Some("StackDriftDetected")
                && e.note.as_deref().is_some_and(|n| n.contains("::managed (update: content)"))
        })
    })
    .await;
    // report only: nothing was written, no update ran
    tokio::time::sleep(Duration::from_secs(5)).await;
    assert_eq!(std::fs::read_to_string(&managed).unwrap(), "changed\n", "a drift check never changes anything");
    let st = stacks.get("drifty").await.unwrap();
    assert!(ready(&st));
    assert_eq!(st.status.unwrap().last_update.unwrap().name, first, "a check is not an update");

    // autoRemediate: the next check's drift is remediated with up --refresh
    let patch = json!({"spec": {"driftDetection": {"schedules": [{"cron": "*/2 * * * * *", "autoRemediate": true}]}}});
    stacks.patch("drifty", &PatchParams::default(), &Patch::Merge(&patch)).await.unwrap();
    eventually("the drift is remediated", 180, || async {
        std::fs::read_to_string(&managed).unwrap_or_default() == "desired\n"
            && drift(&stacks.get("drifty").await.unwrap()).is_some_and(|(s, r, m)| {
                s == "False" && r == "NoChanges" && m.starts_with("drift remediated by update")
            })
    })
    .await;
    let st = stacks.get("drifty").await.unwrap();
    assert!(ready(&st));
    let remediation = st.status.unwrap().last_update.unwrap().name.unwrap();
    let u = ns.api::<pko_api::Update>().get(&remediation).await.unwrap();
    assert_eq!(
        (u.spec.update_type, u.spec.refresh),
        (Some(pko_api::UpdateType::Up), Some(true)),
        "a remediation refreshes first"
    );
    assert!(
        u.spec.message.as_deref().is_some_and(|m| m.starts_with("Drift detected: 1 resource(s) drifted")),
        "{:?}",
        u.spec.message
    );
    let metrics = op.metrics().await;
    for line in [
        "pko_drift_checks_total{result=\"changes\"}",
        "pko_drift_checks_total{result=\"no_changes\"}",
        "pko_drift_remediations_total",
    ] {
        assert!(metrics.contains(line), "{line} missing");
    }
}

/// A cron that does not parse says which schedule and why, and the Stack keeps deploying.
#[tokio::test]
async fn an_invalid_schedule_is_reported_and_the_stack_still_deploys() {
    let (client, ns, env) = setup("drift-invalid").await;
    let _op = InProcessOperator::start(&client, &env, ns.name()).await;
    passphrase_and_program(
        &ns,
        json!({"resources": {"c": {"type": "command:local:Command", "properties": {"create": "echo hi"}}}}),
    )
    .await;
    let stacks = ns.api::<Stack>();
    create(
        &stacks,
        json!({"apiVersion": "pulumi.com/v1", "kind": "Stack", "metadata": {"name": "bad-cron"},
               "spec": {"stack": "dev", "programRef": {"name": "prog"}, "backend": env.backend_url(),
                   "envRefs": passphrase_env_refs(),
                        "driftDetection": {"schedules": [{"cron": "@hourly"}, {"cron": "61 * * * *"}]}}}),
    )
    .await;
    eventually("the Stack is Ready and its schedule refused", 120, || async {
        let s = stacks.get("bad-cron").await.unwrap();
        ready(&s) && drift(&s).is_some_and(|(st, r, _)| st == "Unknown" && r == "InvalidSchedule")
    })
    .await;
    let (_, _, message) = drift(&stacks.get("bad-cron").await.unwrap()).unwrap();
    assert!(
        message.starts_with("spec.driftDetection.schedules[1].cron: invalid cron expression \"61 * * * *\""),
        "{message}"
    );
}

/// A schedule that ticks every second (`* * * * * *`) is checked at the floor's pace
/// (`--min-drift-check-interval-seconds`, 5 s here; 60 s by default, PKO's resync floor), the
/// `DriftDetected` condition says so, and only the last check's Update is kept (not one per check until
/// its TTL).
#[tokio::test]
async fn a_schedule_faster_than_the_floor_is_checked_at_its_pace_and_keeps_one_check_update() {
    let (client, ns, env) = setup("drift-floor").await;
    let args = run_args_with(&env, ns.name(), &["--min-drift-check-interval-seconds", "5"]);
    let _op = InProcessOperator::start_with(&client, &env, args).await;
    passphrase_and_program(
        &ns,
        json!({"resources": {"c": {"type": "command:local:Command", "properties": {"create": "echo hi"}}}}),
    )
    .await;
    let stacks = ns.api::<Stack>();
    create(
        &stacks,
        json!({"apiVersion": "pulumi.com/v1", "kind": "Stack", "metadata": {"name": "busy"},
               "spec": {"stack": "dev", "programRef": {"name": "prog"}, "backend": env.backend_url(),
                   "envRefs": passphrase_env_refs(),
                        "driftDetection": {"schedules": [{"cron": "* * * * * *"}]}}}),
    )
    .await;
    eventually("the Stack is Ready and checked once", 120, || async {
        drift(&stacks.get("busy").await.unwrap()).is_some()
    })
    .await;
    let (_, _, message) = drift(&stacks.get("busy").await.unwrap()).unwrap();
    assert!(
        message.contains(
            "spec.driftDetection.schedules[0].cron tick(s) more often than every 5 s: checks run at most once every 5 s"
        ),
        "{message}"
    );
    // watch for 21 s: the checks (each names its Update) and the check Updates that exist at once
    let updates = ns.api::<pko_api::Update>();
    let (mut checks, mut most, mut times) = (std::collections::BTreeSet::new(), 0, Vec::new());
    let t0 = std::time::Instant::now();
    while t0.elapsed() < Duration::from_secs(21) {
        let s = stacks.get("busy").await.unwrap();
        let last = s.status.and_then(|st| st.drift_detection).and_then(|d| d.last_check.zip(d.last_check_update));
        if let Some((at, name)) = last
            && checks.insert(name)
        {
            times.push(at.0);
        }
        let kept = updates
            .list(&Default::default())
            .await
            .unwrap()
            .items
            .iter()
            .filter(|u| u.spec.preview_only == Some(true))
            .count();
        most = most.max(kept);
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    let gaps: Vec<f64> = times.windows(2).map(|w| w[1].duration_since(w[0]).as_secs_f64()).collect();
    eprintln!("{} checks in 21 s, gaps {gaps:?} s, at most {most} check Updates at once", checks.len());
    assert!(checks.len() >= 3, "the schedule keeps being checked: {checks:?}");
    assert!(checks.len() <= 6, "at most one check every 5 s, not one a second: {} checks", checks.len());
    assert!(gaps.iter().all(|g| *g >= 4.9), "checks at least 5 s apart: {gaps:?}");
    assert!(most <= 2, "the last check's Update and the running one, no more: {most}");
}

/// `--max-concurrent-drift-checks 1` and two Stacks due every second: while one checks, the other's
/// due check waits for the fleet-wide slot and its `DriftDetected` message says so (what `kubectl pko
/// status -o wide` shows); both keep being checked, taking turns (the slots' line).
#[tokio::test]
async fn a_check_waiting_for_the_fleet_wide_cap_says_so() {
    let (client, ns, env) = setup("drift-cap").await;
    let args = run_args_with(
        &env,
        ns.name(),
        &["--min-drift-check-interval-seconds", "5", "--max-concurrent-drift-checks", "1"],
    );
    let _op = InProcessOperator::start_with(&client, &env, args).await;
    passphrase_and_program(
        &ns,
        json!({"resources": {"c": {"type": "command:local:Command", "properties": {"create": "echo hi"}}}}),
    )
    .await;
    let stacks = ns.api::<Stack>();
    for name in ["one", "two"] {
        create(
            &stacks,
            json!({"apiVersion": "pulumi.com/v1", "kind": "Stack", "metadata": {"name": name},
                   "spec": {"stack": name, "programRef": {"name": "prog"}, "backend": env.backend_url(),
                       "envRefs": passphrase_env_refs(),
                            "driftDetection": {"schedules": [{"cron": "* * * * * *"}]}}}),
        )
        .await;
    }
    eventually("a due check says it waits for the drift-check slot", 120, || async {
        let all = stacks.list(&Default::default()).await.unwrap().items;
        all.iter().any(|s| drift(s).is_some_and(|(_, _, m)| m.contains("waits for a drift-check slot")))
    })
    .await;
    let last_checks = || async {
        let all = stacks.list(&Default::default()).await.unwrap().items;
        all.iter()
            .filter_map(|s| {
                s.status
                    .as_ref()?
                    .drift_detection
                    .as_ref()?
                    .last_check
                    .as_ref()
                    .map(|t| format!("{:?}={t:?}", s.metadata.name))
            })
            .collect::<Vec<_>>()
    };
    eventually("both Stacks are checked", 120, || async { last_checks().await.len() == 2 }).await;
    // the line: neither Stack, asking again the moment it released, keeps the one slot to itself
    let first = last_checks().await;
    eventually("both Stacks are checked again, taking turns", 120, || async {
        last_checks().await.iter().all(|c| !first.contains(c))
    })
    .await;
}
