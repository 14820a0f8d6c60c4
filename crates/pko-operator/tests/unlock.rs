//! `kubectl pko unlock` against the real API server, agent and `pulumi` (issue "Operate it"): a Stack
//! stuck on a backend lock whose holder ran on another host. A holder the operator cannot know dead (a
//! laptop) is refused, named, and its lock kept; a holder that was one of the operator's agent pods and
//! is gone (a pool pod scaled away) is released through the agent (`pulumi cancel`), recorded in an
//! event, and the Stack's next update succeeds.

mod common;

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use common::*;
use pko_api::{Stack, Update};
use pko_testbed::eventually;
use serde_json::json;

/// The lock directory of stack `stack` in the `file://` backend under `state`: its project found from
/// the stack's state file (`.pulumi/stacks/<project>/<stack>.json`).
fn lock_dir(state: &Path, stack: &str) -> PathBuf {
    let stacks = state.join(".pulumi").join("stacks");
    let project = std::fs::read_dir(&stacks)
        .unwrap()
        .flatten()
        .find(|p| p.path().join(format!("{stack}.json")).exists())
        .map(|p| p.file_name())
        .expect("the stack's state file");
    state.join(".pulumi").join("locks").join("organization").join(project).join(stack)
}

/// Plants the lock a `pulumi` of `user@host` (pid `pid`) would have left, as Pulumi's DIY backend writes it.
fn plant_lock(dir: &Path, user: &str, host: &str, pid: i32) -> PathBuf {
    std::fs::create_dir_all(dir).unwrap();
    let file = dir.join(format!("{}.json", uuid_like(host)));
    let content = json!({"pid": pid, "username": user, "hostname": host, "timestamp": "2026-11-26T09:00:00Z"});
    std::fs::write(&file, serde_json::to_vec(&content).unwrap()).unwrap();
    file
}

/// A lock id of the shape Pulumi uses (a UUID), distinct per host name.
fn uuid_like(seed: &str) -> String {
    format!(
        "{:08x}-0000-4000-8000-000000000000",
        seed.bytes().fold(0u32, |h, b| h.wrapping_mul(31).wrapping_add(u32::from(b)))
    )
}

/// Requests a sync and waits until the Stack records a failed update whose message names `who`.
async fn sync_fails_naming(ns: &pko_testbed::TestNamespace, who: &str) {
    let out = kubectl_pko(&["sync", "stack/locked", "-n", ns.name()]);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let stacks = ns.api::<Stack>();
    eventually(&format!("the Stack's last update failed on the lock of {who}"), 120, || async {
        let s = stacks.get("locked").await.unwrap();
        let last = s.status.as_ref().and_then(|st| st.last_update.clone());
        last.is_some_and(|l| {
            l.state == Some(pko_api::stack::StackUpdateStateMessage::Failed)
                && l.message.as_deref().is_some_and(|m| m.contains(&format!("created by {who} (pid")))
        }) && s.status.as_ref().is_some_and(|st| st.current_update.is_none())
    })
    .await;
}

/// `kubectl pko unlock stack/locked`, off the runtime the in-process operator runs on (the command waits
/// for the operator's verdict).
async fn unlock(ns: &str) -> std::process::Output {
    let ns = ns.to_string();
    tokio::task::spawn_blocking(move || kubectl_pko(&["unlock", "stack/locked", "-n", &ns, "--timeout", "60"]))
        .await
        .unwrap()
}

#[tokio::test]
async fn unlock_refuses_a_holder_that_may_be_alive_and_releases_one_whose_agent_pod_is_gone() {
    let (client, ns, env) = setup("unlock").await;
    passphrase_and_program(
        &ns,
        json!({"resources": {"r": {"type": "command:local:Command", "properties": {"create": "echo hi"}}}}),
    )
    .await;
    let op = InProcessOperator::start(&client, &env, ns.name()).await;
    prog_stack(&ns, &env, "locked", json!({})).await;
    let stacks = ns.api::<Stack>();
    eventually("the Stack is Ready", 120, || async { ready(&stacks.get("locked").await.unwrap()) }).await;
    let dir = lock_dir(&env.dir().join("state"), "locked");

    // a lock taken on a laptop: nobody here can know it dead
    let laptop = plant_lock(&dir, "ci", "laptop-of-someone", 4242);
    sync_fails_naming(&ns, "ci@laptop-of-someone").await;
    let out = unlock(ns.name()).await;
    let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
    assert!(!out.status.success(), "refused: {stderr}");
    assert!(
        stderr.contains("refused: the lock held by ci@laptop-of-someone (pid 4242)")
            && stderr.contains("not one of this operator's replicas or agent pods"),
        "{stderr}"
    );
    assert!(laptop.exists(), "a refused unlock keeps the lock");
    let observed = stacks.get("locked").await.unwrap().status.and_then(|s| s.observed_unlock_request);
    assert!(observed.is_some(), "the request is recorded as judged");

    // the lock of a pool pod scaled away (`pko-pool-<class>-3` no longer exists): known dead
    std::fs::remove_file(&laptop).unwrap();
    let pool_pod = plant_lock(&dir, "root", "pko-pool-0123456789ab-3", 17);
    sync_fails_naming(&ns, "root@pko-pool-0123456789ab-3").await;
    let asked = Instant::now();
    let out = unlock(ns.name()).await;
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(out.status.success(), "accepted: {stdout}{}", String::from_utf8_lossy(&out.stderr));
    assert!(
        stdout.contains("accepted: releasing 1 backend lock(s)")
            && stdout.contains("agent pod pko-pool-0123456789ab-3 no longer exists"),
        "{stdout}"
    );
    eventually("the Stack is Ready again after the unlock", 120, || async {
        ready(&stacks.get("locked").await.unwrap())
    })
    .await;
    eprintln!("unlock → Stack Ready in {:?}", asked.elapsed());
    assert!(!pool_pod.exists(), "the agent released the lock");
    let s = stacks.get("locked").await.unwrap();
    let last = s.status.as_ref().and_then(|st| st.last_update.clone()).unwrap();
    let update = ns.api::<Update>().get(last.name.as_deref().unwrap()).await.unwrap();
    let release = update
        .metadata
        .annotations
        .as_ref()
        .and_then(|a| a.get("pulumi.com/release-locks"))
        .cloned()
        .unwrap_or_default();
    assert!(
        release.contains("created by root@pko-pool-0123456789ab-3 (pid 17)"),
        "the Update carried the holder to release: {release:?}"
    );
    assert_eq!(last.state, Some(pko_api::stack::StackUpdateStateMessage::Succeeded));
    let _ = stacks.delete("locked", &Default::default()).await;
    eventually("the Stack is gone", 60, || async { stacks.get_opt("locked").await.unwrap().is_none() }).await;
    tokio::time::sleep(Duration::from_millis(100)).await;
    op.stop().await;
}
