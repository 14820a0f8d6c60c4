//! StackRollouts end to end on the test bed (issue 52, item 2), with real `pulumi` through the operator and a real
//! agent: six Stacks of one Program in three waves; a new Program generation that fails for one Stack of the second
//! wave rolls out one wave at a time (the first one Stack at a time), halts at the failing step, and the third wave
//! keeps its last good revision and says why; `kubectl pko rollout status` shows the timeline, `abort` ends it.

mod common;

use std::time::Duration;

use common::*;
use kube::api::{Patch, PatchParams};
use pko_api::rollout::RolloutPhase;
use pko_api::{Program, Stack, StackRollout};
use pko_testbed::eventually;
use serde_json::json;

/// The Program's body: one command whose `create` fails, from `v2` on, for a Stack whose `flavor` is `broken`.
fn body(version: &str) -> serde_json::Value {
    let create = if version == "v1" {
        "echo v1 ${flavor}".to_string()
    } else {
        format!("test ${{flavor}} != broken && echo {version} ${{flavor}}")
    };
    json!({"resources": {"c": {"type": "command:local:Command", "properties": {"create": create}}},
           "outputs": {"said": "${c.stdout}"}})
}

fn said(s: &Stack) -> Option<String> {
    s.status.as_ref()?.outputs.as_ref()?.get("said")?.as_str().map(str::to_string)
}

#[tokio::test]
async fn a_new_revision_rolls_out_wave_by_wave_and_a_failing_wave_halts_it() {
    let (client, ns, env) = setup("rollout").await;
    passphrase_secret(&ns).await;
    let programs = ns.api::<Program>();
    create(
        &programs,
        json!({"apiVersion": "pulumi.com/v1", "kind": "Program", "metadata": {"name": "prog"},
               "configuration": {"flavor": {"type": "String"}}, "program": body("v1")}),
    )
    .await;
    let _op = InProcessOperator::start(&client, &env, ns.name()).await;
    let stacks = ns.api::<Stack>();
    let waves = [("a1", "a", "ok"), ("a2", "a", "ok"), ("b1", "b", "ok"), ("b2", "b", "broken"), ("c1", "c", "ok")];
    let all: Vec<(&str, &str, &str)> = waves.iter().copied().chain([("c2", "c", "ok")]).collect();
    for (name, wave, flavor) in &all {
        create(
            &stacks,
            json!({"apiVersion": "pulumi.com/v1", "kind": "Stack",
                   "metadata": {"name": name, "labels": {"app": "web", "wave": wave}},
                   "spec": {"stack": name, "programRef": {"name": "prog"}, "backend": env.backend_url(),
                            "config": {"flavor": flavor}, "envRefs": passphrase_env_refs(),
                            "retryBackoffBaseSeconds": 1, "maxUpdateFailures": 1}}),
        )
        .await;
    }
    eventually("every Stack runs v1", 240, || async {
        let list = stacks.list(&Default::default()).await.unwrap().items;
        list.len() == 6 && list.iter().all(|s| ready(s) && said(s).is_some_and(|t| t.starts_with("v1")))
    })
    .await;
    create(
        &ns.api::<StackRollout>(),
        json!({"apiVersion": "pulumi.com/v1alpha1", "kind": "StackRollout", "metadata": {"name": "waves"},
               "spec": {"selector": {"matchLabels": {"app": "web"}},
                        "steps": [{"matchLabels": {"wave": "a"}, "maxUpdate": 1}, {"matchLabels": {"wave": "b"}}],
                        "failureBudget": 0, "stepDeadlineSeconds": 300}}),
    )
    .await;

    // the operator has it (its caches too) before the change: a rollout made after a change governs the next one
    let rollouts = ns.api::<StackRollout>();
    eventually("the rollout is observed", 30, || async {
        rollouts.get("waves").await.unwrap().status.is_some_and(|s| s.observed_generation.is_some())
    })
    .await;

    // v2: breaks b2
    let patch = json!({"program": body("v2")});
    programs.patch("prog", &PatchParams::default(), &Patch::Merge(&patch)).await.unwrap();
    // the first wave, one Stack at a time: never both a1 and a2 updating
    let mut both_updating = false;
    let deadline = std::time::Instant::now() + Duration::from_secs(300);
    loop {
        let list = stacks.list(&Default::default()).await.unwrap().items;
        let updating = |n: &str| {
            list.iter().any(|s| {
                s.metadata.name.as_deref() == Some(n) && s.status.as_ref().is_some_and(|st| st.current_update.is_some())
            })
        };
        let r = rollouts.get("waves").await.unwrap();
        if updating("a1") && updating("a2") && !both_updating {
            for s in list.iter().filter(|s| s.metadata.name.as_deref().is_some_and(|n| n.starts_with('a'))) {
                let st = s.status.clone().unwrap_or_default();
                eprintln!(
                    "{:?}: current {:?} rollout {:?} last {:?}",
                    s.metadata.name,
                    st.current_update,
                    st.rollout,
                    st.last_update.map(|l| (l.name, l.last_successful_commit))
                );
            }
            eprintln!("rollout: {:?}", r.status);
        }
        both_updating |= updating("a1") && updating("a2");
        if r.status.is_some_and(|s| s.phase == RolloutPhase::Halted) {
            break;
        }
        assert!(std::time::Instant::now() < deadline, "the rollout did not halt at the failing wave within 300 s");
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    assert!(!both_updating, "maxUpdate 1: the first wave updated one Stack at a time");
    let r = rollouts.get("waves").await.unwrap().status.unwrap();
    assert_eq!(r.step, 1, "halted at the second step: {r:?}");
    let why = r.steps[1].halted.clone().unwrap_or_default();
    assert!(why.contains("1 Stack(s) failed") && why.contains("b2"), "{why}");
    assert!(r.steps[0].done_at.is_some() && r.steps[0].stacks == 2, "{r:?}");
    let get = |n: &'static str| {
        let stacks = stacks.clone();
        async move { stacks.get(n).await.unwrap() }
    };
    for n in ["a1", "a2"] {
        assert!(said(&get(n).await).is_some_and(|t| t.starts_with("v2")), "{n} runs v2");
    }
    // admitted with b2, b1's update runs to its end
    eventually("b1 runs v2", 60, || async { said(&get("b1").await).is_some_and(|t| t.starts_with("v2")) }).await;
    // the third wave keeps v1 and says why
    tokio::time::sleep(Duration::from_secs(3)).await;
    for n in ["c1", "c2"] {
        let s = get(n).await;
        assert!(said(&s).is_some_and(|t| t.starts_with("v1")), "{n} keeps its last good revision");
        let (reason, message) = reconciling(&s).unwrap_or_default();
        assert_eq!(reason, "RolloutHeld", "{n}: {message}");
        assert!(message.contains("held by StackRollout waves") && message.contains("Halted"), "{message}");
        let hold = s.status.unwrap().rollout.unwrap();
        assert!(!hold.admitted && hold.name == "waves");
    }
    let out = kubectl_pko(&["rollout", "status", "waves", "-n", ns.name()]);
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(text.contains("Phase:        Halted") && text.contains("HALTED: step 2"), "{text}{out:?}");
    eprintln!("{text}");

    // abort: the held Stacks stay held for this revision
    assert!(kubectl_pko(&["rollout", "abort", "waves", "-n", ns.name()]).status.success());
    eventually("the rollout is aborted", 30, || async {
        rollouts.get("waves").await.unwrap().status.is_some_and(|s| s.phase == RolloutPhase::Aborted)
    })
    .await;
    assert!(said(&get("c1").await).is_some_and(|t| t.starts_with("v1")));

    // v3 fixes it: a new revision rolls out from the first step to the end
    let patch = json!({"program": {"resources": {"c": {"type": "command:local:Command",
        "properties": {"create": "echo v3 ${flavor}"}}}, "outputs": {"said": "${c.stdout}"}}});
    programs.patch("prog", &PatchParams::default(), &Patch::Merge(&patch)).await.unwrap();
    eventually("every Stack runs v3 and the rollout completes", 300, || async {
        let list = stacks.list(&Default::default()).await.unwrap().items;
        let done = list.iter().all(|s| ready(s) && said(s).is_some_and(|t| t.starts_with("v3")));
        done && rollouts.get("waves").await.unwrap().status.is_some_and(|s| s.phase == RolloutPhase::Completed)
    })
    .await;
    let r = rollouts.get("waves").await.unwrap().status.unwrap();
    assert_eq!(r.steps.len(), 3, "{r:?}");
    let order: Vec<_> = r.steps.iter().map(|s| s.started_at.clone().unwrap().0).collect();
    assert!(order.windows(2).all(|w| w[0] <= w[1]), "steps started in order");
}
