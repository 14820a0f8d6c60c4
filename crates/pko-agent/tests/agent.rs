//! The agent against the real Pulumi CLI of the test bed.

mod common;

use std::collections::HashMap;
use std::time::Duration;

use common::*;
use futures::StreamExt;
use pko_proto::v1::{
    ArtifactSource, AttachRequest, CancelRequest, ConfigItem, ErrorReason, GitSource, OperationType,
    PulumiVersionRequest, ResultStatus, Source, StatusRequest, WhoAmIRequest, config_item, operation_event::Event,
    source, status_response,
};
use pko_testbed::{testbed, versions};

const LIFECYCLE: &str = r#"config:
  greeting:
    type: string
  pw:
    type: string
    secret: true
  settings:
    type: object
resources:
  hello:
    type: command:local:Command
    properties:
      create: echo "${greeting}"
      delete: echo destroyed > "$MARKER"
      environment:
        MARKER: ${marker}
  secretcmd:
    type: command:local:Command
    properties:
      create: echo "${pw}"
variables:
  marker: MARKER_PATH
outputs:
  greeting: ${hello.stdout}
  secretOut: ${secretcmd.stdout}
  zones: ${settings.zones}
"#;

fn reason(r: &pko_proto::v1::OperationResult) -> ErrorReason {
    r.error.as_ref().map(|e| ErrorReason::try_from(e.reason).unwrap()).unwrap_or(ErrorReason::Unspecified)
}

#[tokio::test]
async fn up_preview_refresh_destroy_with_config_and_secret_outputs() {
    let env = pulumi_env();
    let marker = env.dir().join("marker");
    let dir = project(&env, "life", &LIFECYCLE.replace("MARKER_PATH", &marker.display().to_string()));
    let agent = Agent::start(&env, &["--auth", "none"], &[]);
    let mut c = agent.client().await;
    let secret = "s3cr3t-Value-42";

    let mut up = request(&env, "life-up", &dir, "dev", OperationType::Up);
    up.config = vec![
        config("greeting", serde_json::json!("bonjour"), false),
        config("pw", serde_json::json!(secret), true),
        config("settings", serde_json::json!({"zones": ["a", "b"]}), false),
    ];
    let events = run(&mut c, up.clone()).await;
    let r = result(&events);
    assert_eq!(r.status, ResultStatus::Succeeded as i32, "{}", all_text(&events));
    let out = outputs(&r);
    assert_eq!(out["greeting"], (serde_json::json!("bonjour"), false));
    assert_eq!(out["secretOut"], (serde_json::json!(secret), true), "secret output is flagged");
    assert_eq!(out["zones"], (serde_json::json!(["a", "b"]), false), "structured config reaches the program");
    assert!(!all_text(&events[..events.len() - 1]).contains(secret), "the secret appears in no log or engine event");
    assert!(
        events.iter().any(|e| matches!(&e.event, Some(Event::EngineEvent(s)) if s.fields.contains_key("summaryEvent")))
    );
    assert_eq!(r.change_summary.get("create"), Some(&3), "{:?}", r.change_summary);
    assert_eq!(r.project_info.as_ref().unwrap().name, "life");
    assert!(events.windows(2).all(|w| w[1].sequence == w[0].sequence + 1), "sequences are consecutive");

    let mut preview = up.clone();
    preview.operation_id = "life-preview".into();
    preview.r#type = OperationType::Preview as i32;
    preview.options.as_mut().unwrap().expect_no_changes = true;
    let events = run(&mut c, preview).await;
    let r = result(&events);
    assert_eq!(r.status, ResultStatus::Succeeded as i32, "preview shows no changes: {}", all_text(&events));
    assert_eq!(r.change_summary.get("same"), Some(&3), "{:?}", r.change_summary);

    let mut refresh = up.clone();
    refresh.operation_id = "life-refresh".into();
    refresh.r#type = OperationType::Refresh as i32;
    let r = result(&run(&mut c, refresh).await);
    assert_eq!(r.status, ResultStatus::Succeeded as i32, "{}", r.message);

    let mut destroy = up.clone();
    destroy.operation_id = "life-destroy".into();
    destroy.r#type = OperationType::Destroy as i32;
    let r = result(&run(&mut c, destroy).await);
    assert_eq!(r.status, ResultStatus::Succeeded as i32, "{}", r.message);
    assert_eq!(std::fs::read_to_string(&marker).unwrap().trim(), "destroyed", "destroy ran the command's delete");
    assert_eq!(r.change_summary.get("delete"), Some(&3), "{:?}", r.change_summary);
}

/// What an Update names is what runs: a request whose run digest is not the one it carries is refused
/// before anything runs (no stack, no state); one that matches runs, and every result reports the digest
/// the agent computed over the request it received.
#[tokio::test]
async fn a_request_runs_only_when_it_is_what_its_update_names() {
    let env = pulumi_env();
    let marker = env.dir().join("ran");
    let body = format!(
        "resources:\n  r:\n    type: command:local:Command\n    properties:\n      create: echo ${{n}} >> {}\n",
        marker.display()
    );
    let dir = project(&env, "digest", &body);
    let agent = Agent::start(&env, &["--auth", "none"], &[]);
    let mut c = agent.client().await;
    let mut up = request(&env, "digest-up", &dir, "dev", OperationType::Up);
    up.config = vec![config("n", serde_json::json!("1"), false)];
    let expected = pko_proto::digest::run_digest(&up);
    // made for n=1, built with n=0: what a dispatcher reading a stale Workspace would send
    let mut stale = up.clone();
    stale.operation_id = "digest-stale".into();
    stale.config = vec![config("n", serde_json::json!("0"), false)];
    stale.run_digest = expected.clone();
    let r = result(&run(&mut c, stale.clone()).await);
    assert_eq!((r.status, reason(&r)), (ResultStatus::Failed as i32, ErrorReason::RunMismatch), "{}", r.message);
    assert!(
        r.message.contains(&expected) && r.message.contains(&pko_proto::digest::run_digest(&stale)),
        "{}",
        r.message
    );
    assert!(!marker.exists(), "nothing ran");
    up.run_digest = expected.clone();
    let events = run(&mut c, up).await;
    let r = result(&events);
    assert_eq!(r.status, ResultStatus::Succeeded as i32, "{}", all_text(&events));
    assert_eq!(r.run_digest, expected, "the digest it ran is reported");
    assert_eq!(std::fs::read_to_string(&marker).unwrap().trim(), "1");
}

/// Every operation's lines reach the agent's standard output with whose they are (issue "See what
/// Pulumi did"): Pulumi's steps as it prints them, the summary, the result; secrets masked; PKO's
/// `AGENT_JSON_LOG` makes them JSON objects.
#[tokio::test]
async fn an_operation_s_lines_are_on_the_agent_s_output_with_whose_they_are() {
    let env = pulumi_env();
    let marker = env.dir().join("marker");
    let dir = project(&env, "said", &LIFECYCLE.replace("MARKER_PATH", &marker.display().to_string()));
    let secret = "0utput-S3cret-77";
    let mut up = request(&env, "team-a/web-1a2b/uid-1", &dir, "dev", OperationType::Up);
    up.config = vec![
        config("greeting", serde_json::json!("bonjour"), false),
        config("pw", serde_json::json!(secret), true),
        config("settings", serde_json::json!({"zones": ["a"]}), false),
    ];
    let agent = Agent::start(&env, &["--auth", "none"], &[]);
    let r = result(&run(&mut agent.client().await, up.clone()).await);
    assert_eq!(r.status, ResultStatus::Succeeded as i32, "{}", r.message);
    tokio::time::sleep(std::time::Duration::from_millis(300)).await;
    let out = agent.output();
    let ours: Vec<&str> =
        out.lines().filter(|l| l.contains(" namespace=team-a stack=dev update=web-1a2b operation=up | ")).collect();
    assert!(!ours.is_empty() && ours.len() == out.lines().count(), "every line says whose it is:\n{out}");
    for want in [
        "engine namespace=team-a",
        "| + command:local:Command hello creating",
        "| + command:local:Command hello created",
        "| Resources: ",
        "result namespace=team-a",
    ] {
        assert!(out.contains(want), "{want:?} in:\n{out}");
    }
    assert!(!out.contains(secret), "the secret is masked on the output");

    let agent = Agent::start(&env, &["--auth", "none"], &[("AGENT_JSON_LOG", "true")]);
    let mut failing = request(&env, "team-a/web-2c3d/uid-2", &project(&env, "fails", BROKEN), "dev", OperationType::Up);
    failing.config = vec![];
    let r = result(&run(&mut agent.client().await, failing).await);
    assert_eq!(r.status, ResultStatus::Failed as i32);
    tokio::time::sleep(std::time::Duration::from_millis(300)).await;
    let lines: Vec<serde_json::Value> = agent
        .output()
        .lines()
        .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("not JSON ({e}): {l}")))
        .collect();
    assert!(lines.iter().all(|l| l["namespace"] == "team-a"
        && l["update"] == "web-2c3d"
        && l["stack"] == "dev"
        && l["operation"] == "up"
        && l["time"].is_string()));
    assert!(
        lines.iter().any(|l| l["stream"] == "engine" && l["msg"].as_str().is_some_and(|m| m.starts_with("error: "))),
        "the error as Pulumi prints it: {lines:?}"
    );
    assert!(lines.iter().any(|l| l["stream"] == "result"));
}

const BROKEN: &str =
    "resources:\n  boom:\n    type: command:local:Command\n    properties:\n      create: echo broken >&2; exit 7\n";

/// PKO's workspace initialization (`INITIALIZE`): the stack is selected (or created) and configured,
/// and no Pulumi operation runs; a stack that must exist already and does not is `STACK_NOT_FOUND`
/// (the operator stalls the Workspace with it before any Update).
#[tokio::test]
async fn an_initialization_selects_the_stack_and_runs_no_operation() {
    let env = pulumi_env();
    let marker = env.dir().join("marker");
    let dir = project(&env, "init", &LIFECYCLE.replace("MARKER_PATH", &marker.display().to_string()));
    let agent = Agent::start(&env, &["--auth", "none"], &[]);
    let mut c = agent.client().await;
    let mut init = request(&env, "init-1", &dir, "dev", OperationType::Initialize);
    init.config = vec![config("greeting", serde_json::json!("hi"), false), config("pw", serde_json::json!("pw"), true)];
    let events = run(&mut c, init.clone()).await;
    let r = result(&events);
    assert_eq!(r.status, ResultStatus::Succeeded as i32, "{}", all_text(&events));
    assert_eq!(r.message, "stack dev initialized");
    assert!(r.change_summary.is_empty() && r.outputs.is_empty(), "no operation ran: {r:?}");
    assert_eq!(r.project_info.as_ref().unwrap().name, "init");
    assert!(!marker.exists(), "the program did not run");
    // the stack now exists: a create:false initialization selects it
    init.operation_id = "init-2".into();
    init.stack.as_mut().unwrap().create = false;
    assert_eq!(result(&run(&mut c, init.clone()).await).status, ResultStatus::Succeeded as i32);
    let mut missing = init.clone();
    missing.operation_id = "init-3".into();
    missing.stack.as_mut().unwrap().name = "never-created".into();
    let r = result(&run(&mut c, missing).await);
    assert_eq!(
        (r.status, r.error.as_ref().map(|e| e.reason)),
        (ResultStatus::Failed as i32, Some(ErrorReason::StackNotFound as i32)),
        "{}",
        r.message
    );
}

/// An initialization that meets another's creation of its stack still holding the stack's lock (two Workspaces of one
/// new stack initialized at once: a DIY backend's creation takes the lock) waits it out and selects the stack; a lock
/// that stays is an `UPDATE_CONFLICT` naming it.
#[tokio::test]
async fn an_initialization_waits_out_another_creations_lock_of_its_stack() {
    let env = pulumi_env();
    let dir = project(&env, "create-race", "resources: {}\n");
    let agent = Agent::start(&env, &["--auth", "none"], &[]);
    let mut c = agent.client().await;
    // the lock another host's `pulumi stack select --create` holds while it creates the stack
    let lock = |stack: &str| {
        let d = env.dir().join("state/.pulumi/locks/organization/create-race").join(stack);
        std::fs::create_dir_all(&d).unwrap();
        let file = d.join("creator.json");
        let content = r#"{"pid":4242,"username":"pko","hostname":"elsewhere","timestamp":"2026-11-29T21:00:00Z"}"#;
        std::fs::write(&file, content).unwrap();
        file
    };
    let held = lock("dev");
    let (events, ()) =
        tokio::join!(run(&mut c, request(&env, "init-1", &dir, "dev", OperationType::Initialize)), async {
            tokio::time::sleep(Duration::from_millis(700)).await;
            std::fs::remove_file(&held).unwrap();
        });
    let r = result(&events);
    assert_eq!(r.status, ResultStatus::Succeeded as i32, "{}", r.message);
    lock("stays");
    let r = result(&run(&mut c, request(&env, "init-2", &dir, "stays", OperationType::Initialize)).await);
    assert_eq!((r.status, reason(&r)), (ResultStatus::Failed as i32, ErrorReason::UpdateConflict), "{}", r.message);
    assert!(r.message.contains("currently locked") && r.message.contains("elsewhere"), "{}", r.message);
}

const SLOW: &str = r#"resources:
  slow:
    type: command:local:Command
    properties:
      create: sleep SECONDS; echo done
outputs:
  out: ${slow.stdout}
"#;

fn slow(env: &pko_testbed::PulumiEnv, name: &str, seconds: u32) -> std::path::PathBuf {
    project(env, name, &SLOW.replace("SECONDS", &seconds.to_string()))
}

/// Waits until the stream shows the `slow` resource being created, then returns the stream.
async fn until_resource_started(
    stream: &mut tonic::Streaming<pko_proto::v1::OperationEvent>,
) -> Vec<pko_proto::v1::OperationEvent> {
    let mut seen = Vec::new();
    while let Some(e) = stream.next().await {
        let e = e.unwrap();
        let started = matches!(&e.event, Some(Event::EngineEvent(s)) if {
            let j = pko_agent::convert::from_struct(s);
            j["resourcePreEvent"]["metadata"]["type"] == "command:local:Command"
        });
        let done = matches!(e.event, Some(Event::Result(_)));
        seen.push(e);
        if started || done {
            break;
        }
    }
    seen
}

#[tokio::test]
async fn two_agents_on_one_stack_give_exactly_one_update_conflict() {
    let env = pulumi_env();
    // no wait for a holder on this host: the conflict is reported at once
    let a = Agent::start(&env, &["--auth", "none", "--lock-wait-seconds", "0"], &[]);
    let b = Agent::start(&env, &["--auth", "none", "--lock-wait-seconds", "0"], &[]);
    let (mut ca, mut cb) = (a.client().await, b.client().await);
    // the stack exists before the race (creating it is not what is raced)
    let r = result(&run(&mut ca, request(&env, "create", &slow(&env, "race", 0), "dev", OperationType::Preview)).await);
    assert_eq!(r.status, ResultStatus::Succeeded as i32, "{}", r.message);
    let ra = request(&env, "race-a", &slow(&env, "race", 4), "dev", OperationType::Up);
    let rb = request(&env, "race-b", &slow(&env, "race", 4), "dev", OperationType::Up);
    let (ea, eb) = tokio::join!(run(&mut ca, ra), async {
        tokio::time::sleep(Duration::from_millis(300)).await;
        run(&mut cb, rb).await
    });
    let results = [result(&ea), result(&eb)];
    let ok = results.iter().filter(|r| r.status == ResultStatus::Succeeded as i32).count();
    let conflicts: Vec<_> = results.iter().filter(|r| reason(r) == ErrorReason::UpdateConflict).collect();
    assert_eq!((ok, conflicts.len()), (1, 1), "{results:?}");
    assert_eq!(conflicts[0].status, ResultStatus::Failed as i32);
    // the holder was alive: its lock was not touched
    assert!(
        !all_text(if reason(&results[0]) == ErrorReason::UpdateConflict { &ea } else { &eb }).contains("stale lock")
    );
    assert!(conflicts[0].message.contains("locked"), "{}", conflicts[0].message);
}

#[tokio::test]
async fn a_lock_left_by_an_agent_killed_mid_up_is_released_once_its_holder_is_dead() {
    let env = pulumi_env();
    let mut a = Agent::start(&env, &["--auth", "none"], &[]);
    let mut ca = a.client().await;
    let dir = slow(&env, "killed", 30);
    let mut stream = ca.run(request(&env, "killed-1", &dir, "dev", OperationType::Up)).await.unwrap().into_inner();
    until_resource_started(&mut stream).await;
    // the pod dies: agent, pulumi and plugins at once; the lock stays behind
    a.kill_group();
    assert_eq!(lock_files(&env).len(), 1, "the killed pulumi left its lock");

    // the operation again, on another agent at a newer epoch (what the operator's retry sends)
    let b = Agent::start(&env, &["--auth", "none"], &[]);
    let mut cb = b.client().await;
    std::fs::write(dir.join("Pulumi.yaml"), format!("name: killed\nruntime: yaml\n{}", SLOW.replace("SECONDS", "0")))
        .unwrap();
    let mut again = request(&env, "killed-1", &dir, "dev", OperationType::Up);
    again.epoch = 2;
    let events = run(&mut cb, again).await;
    let r = result(&events);
    let text = all_text(&events);
    assert_eq!(r.status, ResultStatus::Succeeded as i32, "{}: {text}", r.message);
    // the killed pulumi is either gone or, while nobody has reaped it yet (a container's init may
    // be slow to), a zombie: both are a dead holder
    assert!(
        text.contains("releasing 1 stale lock(s) whose holder is known dead")
            && (text.contains("no process has its pid") || text.contains("its process exited")),
        "{text}"
    );
    assert!(lock_files(&env).is_empty(), "no lock left: {:?}", lock_files(&env));
    assert_eq!(outputs(&r)["out"].0, serde_json::json!("done"));
}

#[tokio::test]
async fn a_checkpoint_sidecar_truncated_by_a_killed_pulumi_is_removed_and_the_stack_works_again() {
    let env = pulumi_env();
    let a = Agent::start(&env, &["--auth", "none"], &[]);
    let mut ca = a.client().await;
    let dir = slow(&env, "cut", 0);
    let r = result(&run(&mut ca, request(&env, "cut-1", &dir, "dev", OperationType::Up)).await);
    assert_eq!(r.status, ResultStatus::Succeeded as i32, "{}", r.message);
    // what a pulumi SIGKILLed between gocloud fileblob's `os.Create` and its JSON write of the
    // checkpoint's attribute sidecar leaves: an empty file, and every pulumi command fails on it
    let sidecar = env.dir().join("state/.pulumi/stacks/cut/dev.json.attrs");
    assert!(sidecar.exists(), "the file backend keeps a sidecar beside the checkpoint");
    std::fs::write(&sidecar, "").unwrap();
    let mut plain = env.pulumi(&dir);
    plain.args(["stack", "output", "--stack", "dev", "--non-interactive"]);
    let out = plain.output().unwrap();
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("failed to load checkpoint: EOF"),
        "the wound is real: {}",
        String::from_utf8_lossy(&out.stderr)
    );

    // a fresh agent (as after the pod's restart) repairs it before touching the stack
    let b = Agent::start(&env, &["--auth", "none"], &[]);
    let mut cb = b.client().await;
    let events = run(&mut cb, request(&env, "cut-2", &dir, "dev", OperationType::Up)).await;
    let r = result(&events);
    let text = all_text(&events);
    assert_eq!(r.status, ResultStatus::Succeeded as i32, "{}: {text}", r.message);
    assert!(
        text.contains("removed 1 truncated attribute sidecar(s)") && text.contains(".pulumi/stacks/cut/dev.json.attrs"),
        "{text}"
    );
    assert_eq!(outputs(&r)["out"].0, serde_json::json!("done"), "the stack's state survived");
    assert!(plain.output().unwrap().status.success(), "and plain pulumi reads the stack again");
}

#[tokio::test]
async fn sigterm_interrupts_pulumi_releases_the_lock_and_another_agent_succeeds() {
    let env = pulumi_env();
    let mut a = Agent::start(&env, &["--auth", "none"], &[]);
    let mut ca = a.client().await;
    let mut stream =
        ca.run(request(&env, "term-1", &slow(&env, "term", 6), "dev", OperationType::Up)).await.unwrap().into_inner();
    let mut events = until_resource_started(&mut stream).await;
    let t0 = std::time::Instant::now();
    a.sigterm();
    while let Some(e) = stream.next().await {
        events.push(e.unwrap());
    }
    let r = result(&events);
    assert_eq!(r.status, ResultStatus::Interrupted as i32, "{}", all_text(&events));
    assert_eq!(reason(&r), ErrorReason::Interrupted);
    assert!(a.wait_exit(Duration::from_secs(60)).success(), "the agent exits cleanly after draining");
    // Ctrl-C is a graceful cancel: Pulumi lets the in-flight step finish, records it, releases the lock.
    eprintln!("pulumi wound down {:?} after SIGTERM", t0.elapsed());

    // another agent runs the same stack: no `pulumi cancel` needed
    let b = Agent::start(&env, &["--auth", "none"], &[]);
    let mut cb = b.client().await;
    let events = run(&mut cb, request(&env, "term-2", &slow(&env, "term", 0), "dev", OperationType::Up)).await;
    let r = result(&events);
    assert_eq!(r.status, ResultStatus::Succeeded as i32, "the lock was released: {}", all_text(&events));
}

#[tokio::test]
async fn an_idle_agent_exits_by_itself_after_exit_when_idle_seconds_but_not_while_it_works() {
    let env = pulumi_env();
    let mut a = Agent::start(&env, &["--auth", "none", "--exit-when-idle-seconds", "2"], &[]);
    let mut ca = a.client().await;
    // an operation longer than the idle limit keeps it alive
    let events = run(&mut ca, request(&env, "idle-1", &slow(&env, "idle", 4), "dev", OperationType::Up)).await;
    assert_eq!(result(&events).status, ResultStatus::Succeeded as i32, "{}", all_text(&events));
    let t0 = std::time::Instant::now();
    assert!(a.wait_exit(Duration::from_secs(30)).success(), "it exits cleanly once idle");
    let idle = t0.elapsed();
    eprintln!("agent exited {idle:?} after its operation ended (--exit-when-idle-seconds 2)");
    assert!(idle >= Duration::from_millis(1500), "not before the idle limit: {idle:?}");
}

#[tokio::test]
async fn a_hollow_agent_simulates_operations_without_pulumi() {
    let env = pulumi_env();
    // load tests only: no `pulumi` binary at all, and the operation still succeeds after the delay
    let a = Agent::start(&env, &["--auth", "none", "--hollow-seconds", "0.5", "--pulumi", "/nonexistent/pulumi"], &[]);
    let mut ca = a.client().await;
    let t0 = std::time::Instant::now();
    let events = run(&mut ca, request(&env, "hollow-1", &slow(&env, "hollow", 30), "dev", OperationType::Up)).await;
    let r = result(&events);
    assert_eq!(r.status, ResultStatus::Succeeded as i32, "{}", all_text(&events));
    assert!(r.message.contains("hollow agent"), "named as simulated: {}", r.message);
    let took = t0.elapsed();
    assert!(
        took >= Duration::from_millis(500) && took < Duration::from_secs(10),
        "the set delay, not the program's 30 s: {took:?}"
    );
}

#[tokio::test]
async fn a_second_client_attaches_and_sees_the_same_events_and_result() {
    let env = pulumi_env();
    let agent = Agent::start(&env, &["--auth", "none"], &[]);
    let (mut c1, mut c2) = (agent.client().await, agent.client().await);
    let mut s1 = c1
        .run(request(&env, "attach-1", &slow(&env, "attach", 2), "dev", OperationType::Up))
        .await
        .unwrap()
        .into_inner();
    let mut first = until_resource_started(&mut s1).await;
    let attached: Vec<_> = c2
        .attach(AttachRequest { operation_id: "attach-1".into(), epoch: 1 })
        .await
        .unwrap()
        .into_inner()
        .map(|e| e.unwrap())
        .collect()
        .await;
    while let Some(e) = s1.next().await {
        first.push(e.unwrap());
    }
    assert_eq!(result(&first).status, ResultStatus::Succeeded as i32, "{}", all_text(&first));
    assert_eq!(attached, first, "Attach re-streams from the first event");
    // after the end it is still attachable (retention), and unknown ids are NOT_FOUND
    let again: Vec<_> = c2
        .attach(AttachRequest { operation_id: "attach-1".into(), epoch: 1 })
        .await
        .unwrap()
        .into_inner()
        .map(|e| e.unwrap())
        .collect()
        .await;
    assert_eq!(again, first);
    let missing = c2.attach(AttachRequest { operation_id: "nope".into(), epoch: 1 }).await.err().unwrap();
    assert_eq!(missing.code(), tonic::Code::NotFound);
    // fencing: once the shard's new holder (epoch 2) has called, the old holder (epoch 1) is refused
    // on Attach, Run and Cancel
    assert!(c2.attach(AttachRequest { operation_id: "attach-1".into(), epoch: 2 }).await.is_ok());
    let stale = c1
        .attach(AttachRequest { operation_id: "attach-1".into(), epoch: 1 })
        .await
        .expect_err("a stale Attach is refused");
    assert_eq!(stale.code(), tonic::Code::FailedPrecondition, "{}", stale.message());
    assert!(stale.message().contains("epoch 1 is older than 2"), "{}", stale.message());
    let stale = c1
        .run(request(&env, "attach-1", &slow(&env, "attach", 2), "dev", OperationType::Up))
        .await
        .expect_err("a stale Run is refused");
    assert_eq!(stale.code(), tonic::Code::FailedPrecondition);
    let stale = c1
        .cancel(CancelRequest { operation_id: "attach-1".into(), epoch: 1, grace_seconds: 0 })
        .await
        .expect_err("a stale Cancel is refused");
    assert_eq!(stale.code(), tonic::Code::FailedPrecondition);
}

#[tokio::test]
async fn a_run_arriving_after_its_senders_fence_deadline_starts_nothing_and_one_in_time_runs() {
    let env = pulumi_env();
    let agent = Agent::start(&env, &["--auth", "none"], &[]);
    let mut c = agent.client().await;
    let now = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap();
    let mut late = request(&env, "late-1", &slow(&env, "late", 0), "dev", OperationType::Up);
    late.not_after = Some(prost_types::Timestamp { seconds: now.as_secs() as i64 - 2, nanos: 0 });
    let refused = c.run(late).await.expect_err("a Run past its fence deadline is refused");
    assert_eq!(refused.code(), tonic::Code::FailedPrecondition, "{}", refused.message());
    assert!(refused.message().contains("after its sender's hold on the shard lapsed"), "{}", refused.message());
    assert_eq!(
        c.status(StatusRequest {}).await.unwrap().into_inner().state,
        status_response::State::Idle as i32,
        "nothing started"
    );
    let unknown = c
        .attach(AttachRequest { operation_id: "late-1".into(), epoch: 1 })
        .await
        .expect_err("the refused operation is not known");
    assert_eq!(unknown.code(), tonic::Code::NotFound);
    let mut in_time = request(&env, "late-1", &slow(&env, "late", 0), "dev", OperationType::Up);
    in_time.not_after = Some(prost_types::Timestamp { seconds: now.as_secs() as i64 + 60, nanos: 0 });
    let r = result(&run(&mut c, in_time).await);
    assert_eq!(r.status, ResultStatus::Succeeded as i32, "{}", r.message);
}

#[tokio::test]
async fn cancel_interrupts_the_operation_and_leaves_nothing_locked() {
    let env = pulumi_env();
    let agent = Agent::start(&env, &["--auth", "none"], &[]);
    let mut c = agent.client().await;
    let mut stream = c
        .run(request(&env, "cancel-1", &slow(&env, "cancel", 6), "dev", OperationType::Up))
        .await
        .unwrap()
        .into_inner();
    let mut events = until_resource_started(&mut stream).await;
    let status = c.status(StatusRequest {}).await.unwrap().into_inner();
    assert_eq!(status.state, status_response::State::Busy as i32);
    assert_eq!(status.current_operation_id, "cancel-1");
    assert!(
        c.cancel(CancelRequest { operation_id: "cancel-1".into(), epoch: 1, grace_seconds: 0 })
            .await
            .unwrap()
            .into_inner()
            .cancelled
    );
    while let Some(e) = stream.next().await {
        events.push(e.unwrap());
    }
    let r = result(&events);
    assert_eq!(r.status, ResultStatus::Cancelled as i32, "{}", all_text(&events));
    assert_eq!(reason(&r), ErrorReason::Cancelled);
    assert!(
        !c.cancel(CancelRequest { operation_id: "cancel-1".into(), epoch: 1, grace_seconds: 0 })
            .await
            .unwrap()
            .into_inner()
            .cancelled,
        "already finished"
    );
    let r = result(&run(&mut c, request(&env, "cancel-2", &slow(&env, "cancel", 0), "dev", OperationType::Up)).await);
    assert_eq!(r.status, ResultStatus::Succeeded as i32, "{}", r.message);
    assert_eq!(c.status(StatusRequest {}).await.unwrap().into_inner().state, status_response::State::Idle as i32);
}

#[tokio::test]
async fn bad_input_gives_typed_errors_and_leaves_nothing_locked() {
    let env = pulumi_env();
    let agent = Agent::start(&env, &["--auth", "none", "--max-artifact-bytes", "2000"], &[]);
    let mut c = agent.client().await;
    let good = slow(&env, "bad", 0);
    let pulumi_yaml = std::fs::read(good.join("Pulumi.yaml")).unwrap();
    let ok_tar = tarball(&[("Pulumi.yaml", &pulumi_yaml)]);
    let big_tar = tarball(&[("Pulumi.yaml", &pulumi_yaml), ("big.bin", &[7u8; 4096])]);
    let evil_tar = tarball(&[("Pulumi.yaml", &pulumi_yaml), ("../../escape.txt", b"x")]);
    let server = serve_files(HashMap::from([
        ("/ok.tar.gz".to_string(), ok_tar.clone()),
        ("/big.tar.gz".to_string(), big_tar.clone()),
        ("/evil.tar.gz".to_string(), evil_tar.clone()),
    ]))
    .await;
    let artifact = |path: &str, digest: String| Source {
        kind: Some(source::Kind::Artifact(ArtifactSource {
            url: format!("{}{path}", server.base),
            digest,
            dir: String::new(),
            mirrors: vec![],
        })),
    };

    let mut cases = Vec::new();
    let empty = env.dir().join("empty");
    std::fs::create_dir_all(&empty).unwrap();
    cases.push((
        "missing Pulumi.yaml",
        request(&env, "bad-1", &empty, "dev", OperationType::Up),
        ErrorReason::InvalidSource,
        "no Pulumi.yaml",
    ));
    let mut r = request(&env, "bad-2", &good, "dev", OperationType::Up);
    r.source = Some(artifact("/ok.tar.gz", sha256(b"something else")));
    cases.push(("wrong digest", r, ErrorReason::InvalidSource, "digest mismatch"));
    let mut r = request(&env, "bad-3", &good, "dev", OperationType::Up);
    r.source = Some(artifact("/big.tar.gz", sha256(&big_tar)));
    cases.push(("oversized tarball", r, ErrorReason::InvalidSource, "limit"));
    let mut r = request(&env, "bad-4", &good, "dev", OperationType::Up);
    r.source = Some(artifact("/evil.tar.gz", sha256(&evil_tar)));
    cases.push(("path traversal", r, ErrorReason::InvalidSource, "unsafe path"));
    let mut r = request(&env, "bad-5", &good, "never-created", OperationType::Up);
    r.stack.as_mut().unwrap().create = false;
    cases.push(("unknown stack without create", r, ErrorReason::StackNotFound, "no stack named"));
    let mut r = request(&env, "bad-6", &good, "dev", OperationType::Up);
    r.config = vec![ConfigItem {
        key: "obj".into(),
        value: Some(config_item::Value::ValueFrom(literal("{not json"))),
        json: true,
        ..Default::default()
    }];
    cases.push(("malformed config", r, ErrorReason::InvalidConfig, "not JSON"));
    // PKO's spec.environment reaches Pulumi (`pulumi config env add`); a backend without ESC says so
    let mut r = request(&env, "bad-esc", &good, "dev", OperationType::Up);
    r.stack.as_mut().unwrap().environments = vec!["team/prod".into()];
    cases.push((
        "ESC environment on a file backend",
        r,
        ErrorReason::InitializationFailed,
        "does not support environments",
    ));

    for (what, req, want, text) in cases {
        let events = run(&mut c, req).await;
        let r = result(&events);
        assert_eq!(r.status, ResultStatus::Failed as i32, "{what}: {}", r.message);
        assert_eq!(reason(&r), want, "{what}: {}", r.message);
        assert!(r.message.contains(text), "{what}: message {:?} lacks {text:?}", r.message);
    }
    assert!(!env.dir().join("escape.txt").exists() && !agent.work.path().join("escape.txt").exists());

    // a malformed request is refused outright, naming the field
    let mut r = request(&env, "bad-7", &good, "dev", OperationType::Up);
    r.r#type = 0;
    let Err(status) = c.run(r).await else { panic!("a request without a type must be refused") };
    assert_eq!(status.code(), tonic::Code::InvalidArgument);
    let info = <pko_proto::v1::ErrorInfo as prost::Message>::decode(status.details()).unwrap();
    assert_eq!(info.field, "type");

    // nothing is locked: the artifact source (valid digest) deploys the stack
    let mut r = request(&env, "bad-8", &good, "dev", OperationType::Up);
    r.source = Some(artifact("/ok.tar.gz", sha256(&ok_tar)));
    let r = result(&run(&mut c, r).await);
    assert_eq!(r.status, ResultStatus::Succeeded as i32, "{}", r.message);
    assert_eq!(r.revision, sha256(&ok_tar));
    // as PKO: an artifact without a digest is downloaded unverified (and still within the size limit)
    let mut r = request(&env, "bad-9", &good, "dev", OperationType::Preview);
    r.source = Some(artifact("/ok.tar.gz", String::new()));
    let r = result(&run(&mut c, r).await);
    assert_eq!(r.status, ResultStatus::Succeeded as i32, "an artifact without a digest runs: {}", r.message);
    let mut r = request(&env, "bad-10", &good, "dev", OperationType::Preview);
    r.source = Some(artifact("/big.tar.gz", String::new()));
    let r = result(&run(&mut c, r).await);
    assert!(
        r.status == ResultStatus::Failed as i32 && r.message.contains("limit"),
        "the size limit holds without a digest: {}",
        r.message
    );
}

/// A Program artifact whose URL names an operator replica that is gone (connection refused) comes
/// from its mirror — the dispatching replica's artifact server — in the same attempt, no retry
/// needed; without a digest the mirror is not trusted and the URL's own error is reported.
#[tokio::test]
async fn an_artifact_whose_url_is_gone_comes_from_its_mirror_only_when_verified() {
    let env = pulumi_env();
    let agent = Agent::start(&env, &["--auth", "none", "--artifact-retries", "0"], &[]);
    let mut c = agent.client().await;
    let program = std::fs::read(slow(&env, "mirrored", 0).join("Pulumi.yaml")).unwrap();
    let tar = tarball(&[("Pulumi.yaml", &program)]);
    let server = serve_files(HashMap::from([("/programs/ns/p/1/x.tar.gz".to_string(), tar.clone())])).await;
    let gone = {
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        format!("http://{}/programs/ns/p/1/x.tar.gz", l.local_addr().unwrap())
    };
    let with = |id: &str, digest: String| {
        let mut r = request(&env, id, env.dir(), "dev", OperationType::Preview);
        let mirrors = vec![format!("{}/programs/ns/p/1/x.tar.gz", server.base)];
        r.source = Some(Source {
            kind: Some(source::Kind::Artifact(ArtifactSource {
                url: gone.clone(),
                digest,
                dir: String::new(),
                mirrors,
            })),
        });
        r
    };
    let r = result(&run(&mut c, with("mirror-1", sha256(&tar))).await);
    assert_eq!(r.status, ResultStatus::Succeeded as i32, "{}", r.message);
    let r = result(&run(&mut c, with("mirror-2", String::new())).await);
    assert_eq!((r.status, reason(&r)), (ResultStatus::Failed as i32, ErrorReason::InvalidSource), "{}", r.message);
    assert!(r.message.contains(&gone), "the URL's own error: {}", r.message);
}

#[tokio::test]
async fn git_source_by_branch_and_commit() {
    let env = pulumi_env();
    let repo = env.dir().join("repo");
    let sh = |args: &[&str], cwd: &std::path::Path| {
        let out = std::process::Command::new("git").args(args).current_dir(cwd).output().unwrap();
        assert!(out.status.success(), "git {args:?}: {}", String::from_utf8_lossy(&out.stderr));
        String::from_utf8(out.stdout).unwrap()
    };
    std::fs::create_dir_all(repo.join("app")).unwrap();
    sh(&["init", "-q", "-b", "main"], &repo);
    std::fs::write(
        repo.join("app/Pulumi.yaml"),
        format!("name: gitapp\nruntime: yaml\n{}", SLOW.replace("SECONDS", "0")),
    )
    .unwrap();
    sh(&["add", "."], &repo);
    sh(&["-c", "user.email=t@e", "-c", "user.name=t", "commit", "-q", "-m", "one"], &repo);
    let sha = sh(&["rev-parse", "HEAD"], &repo).trim().to_string();
    let agent = Agent::start(&env, &["--auth", "none"], &[]);
    let mut c = agent.client().await;
    for (id, rev) in [("git-branch", "main".to_string()), ("git-commit", sha.clone())] {
        let mut r = request(&env, id, &repo, "dev", OperationType::Up);
        r.source = Some(Source {
            kind: Some(source::Kind::Git(GitSource {
                url: format!("file://{}", repo.display()),
                revision: rev,
                dir: "app".into(),
                shallow: false,
                auth: None,
            })),
        });
        let r = result(&run(&mut c, r).await);
        assert_eq!(r.status, ResultStatus::Succeeded as i32, "{id}: {}", r.message);
        assert_eq!(r.revision, sha, "{id} resolved to the commit");
    }
    let status = c.status(StatusRequest {}).await.unwrap().into_inner();
    assert!(
        status.cached_sources.iter().any(|s| s.key.ends_with(&sha)),
        "the checkout is cached once: {:?}",
        status.cached_sources
    );
}

#[tokio::test]
async fn status_version_and_whoami() {
    let env = pulumi_env();
    let agent = Agent::start(&env, &["--auth", "none"], &[]);
    let mut c = agent.client().await;
    let v = c.pulumi_version(PulumiVersionRequest {}).await.unwrap().into_inner().version;
    assert_eq!(v, versions::pulumi());
    let s = c.status(StatusRequest {}).await.unwrap().into_inner();
    assert_eq!((s.state, s.capacity, s.running), (status_response::State::Idle as i32, 1, 0));
    assert_eq!(s.pulumi_version, v);
    let who = c
        .who_am_i(WhoAmIRequest {
            env: vec![pko_proto::v1::EnvVar {
                name: "PULUMI_BACKEND_URL".into(),
                value: Some(literal(&env.backend_url())),
                secret: false,
            }],
        })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(who.url, env.backend_url());
    assert!(!who.user.is_empty());
    let _ = testbed();
}

/// The TypeScript happy path: a Flux-style artifact with a nodejs program; the agent runs `pulumi install`
/// (npm, from the npm registry) once for the revision, then `up`.
#[tokio::test]
async fn typescript_program_from_an_artifact() {
    let env = pulumi_env();
    let files: [(&str, &[u8]); 3] = [
        ("Pulumi.yaml", b"name: tsapp\nruntime: nodejs\n"),
        (
            "package.json",
            concat!(
                r#"{"name": "tsapp", "main": "index.ts", "dependencies": {"@pulumi/pulumi": "3.259.0"}, "#,
                r#""devDependencies": {"typescript": "^5.0.0", "@types/node": "^20.0.0"}}"#
            )
            .as_bytes(),
        ),
        (
            "index.ts",
            b"import * as pulumi from \"@pulumi/pulumi\";\nconst config = new pulumi.Config();\nexport const greeting \
                = `hello ${config.require(\"name\")}`;\nexport const token = pulumi.secret(\"ts-secret-value\");\n",
        ),
    ];
    let tar = tarball(&files);
    let server = serve_files(HashMap::from([("/ts.tar.gz".to_string(), tar.clone())])).await;
    // share npm's download cache between runs (it lives outside the repository)
    let npm_cache = format!("{}/.npm", std::env::var("HOME").unwrap_or_else(|_| "/root".into()));
    let agent = Agent::start(&env, &["--auth", "none"], &[("npm_config_cache", &npm_cache)]);
    let mut c = agent.client().await;
    let dir = env.dir().to_path_buf();
    let mut req = request(&env, "ts-up", &dir, "dev", OperationType::Up);
    req.source = Some(Source {
        kind: Some(source::Kind::Artifact(ArtifactSource {
            url: format!("{}/ts.tar.gz", server.base),
            digest: sha256(&tar),
            dir: String::new(),
            mirrors: vec![],
        })),
    });
    req.config = vec![config("name", serde_json::json!("pko"), false)];
    let events = run(&mut c, req.clone()).await;
    let r = result(&events);
    assert_eq!(r.status, ResultStatus::Succeeded as i32, "{}", all_text(&events));
    let out = outputs(&r);
    assert_eq!(out["greeting"], (serde_json::json!("hello pko"), false));
    assert_eq!(out["token"], (serde_json::json!("ts-secret-value"), true));
    assert_eq!(r.project_info.as_ref().map(|p| p.runtime.as_str()), Some("nodejs"));
    // the second operation reuses the installed revision
    req.operation_id = "ts-preview".into();
    req.r#type = OperationType::Preview as i32;
    let t = std::time::Instant::now();
    let r = result(&run(&mut c, req).await);
    assert_eq!(r.status, ResultStatus::Succeeded as i32, "{}", r.message);
    eprintln!("warm preview of the TypeScript program: {:?}", t.elapsed());
    let cached = c.status(StatusRequest {}).await.unwrap().into_inner().cached_sources;
    assert_eq!(cached.iter().filter(|s| s.key.starts_with("artifact-")).count(), 1, "{cached:?}");
}

/// A git source over smart HTTP with credentials: the token reaches the server as basic auth (user `git`),
/// and a missing credential is reported as INVALID_SOURCE without leaking the token.
/// A bare repository `<env>/git-root/app.git` whose `main` holds a quick program named `project`; returns
/// the root.
fn bare_repo(env: &pko_testbed::PulumiEnv, project: &str) -> std::path::PathBuf {
    let root = env.dir().join("git-root");
    std::fs::create_dir_all(&root).unwrap();
    let program = format!("name: {project}\nruntime: yaml\n{}", SLOW.replace("SECONDS", "0"));
    pko_testbed::git::bare_repo_with(&root, "app.git", &[("Pulumi.yaml", &program)]);
    root
}

#[tokio::test]
async fn git_over_http_with_token_auth() {
    let env = pulumi_env();
    let root = bare_repo(&env, "httpgit");
    let token = "tok-0123456789";
    let server =
        pko_testbed::git::GitHttpServer::start(&root, "127.0.0.1:0", Some(("git".into(), token.into()))).await.unwrap();
    let agent = Agent::start(&env, &["--auth", "none"], &[]);
    let mut c = agent.client().await;
    let git = |id: &str, auth: Option<pko_proto::v1::GitAuth>| {
        let mut r = request(&env, id, env.dir(), "dev", OperationType::Up);
        r.source = Some(Source {
            kind: Some(source::Kind::Git(GitSource {
                url: server.url("app.git"),
                revision: "main".into(),
                dir: String::new(),
                shallow: true,
                auth,
            })),
        });
        r
    };
    let r = result(&run(&mut c, git("http-noauth", None)).await);
    assert_eq!(reason(&r), ErrorReason::InvalidSource, "{}", r.message);
    let auth = pko_proto::v1::GitAuth { token: Some(literal(token)), ..Default::default() };
    let events = run(&mut c, git("http-token", Some(auth))).await;
    let r = result(&events);
    assert_eq!(r.status, ResultStatus::Succeeded as i32, "{}", all_text(&events));
    assert_eq!(r.revision.len(), 40);
    assert!(!all_text(&events).contains(token));
}

/// `--tls-cert`/`--tls-key` (mounted PEM files): the agent serves gRPC over TLS; a client that trusts the
/// certificate is served, a plaintext client is not.
#[tokio::test]
async fn tls_from_mounted_files() {
    let _ = rustls::crypto::ring::default_provider().install_default();
    let env = pulumi_env();
    let dir = env.dir().join("tls");
    std::fs::create_dir_all(&dir).unwrap();
    let (cert, key) = (dir.join("tls.crt"), dir.join("tls.key"));
    let made = std::process::Command::new("openssl")
        .args([
            "req",
            "-x509",
            "-newkey",
            "ec",
            "-pkeyopt",
            "ec_paramgen_curve:P-256",
            "-nodes",
            "-days",
            "1",
            "-subj",
            "/CN=localhost",
            "-addext",
            "subjectAltName=DNS:localhost",
            "-addext",
            "basicConstraints=critical,CA:FALSE",
        ])
        .arg("-keyout")
        .arg(&key)
        .arg("-out")
        .arg(&cert)
        .output()
        .unwrap();
    assert!(made.status.success(), "{}", String::from_utf8_lossy(&made.stderr));
    let agent = Agent::start(
        &env,
        &["--auth", "none", "--tls-cert", cert.to_str().unwrap(), "--tls-key", key.to_str().unwrap()],
        &[],
    );
    let port = agent.addr.rsplit_once(':').unwrap().1.to_string();

    let tls = tonic::transport::ClientTlsConfig::new()
        .ca_certificate(tonic::transport::Certificate::from_pem(std::fs::read(&cert).unwrap()))
        .domain_name("localhost");
    let channel = tonic::transport::Channel::from_shared(format!("https://localhost:{port}"))
        .unwrap()
        .tls_config(tls)
        .unwrap()
        .connect()
        .await
        .unwrap();
    let mut c = pko_proto::v1::agent_client::AgentClient::new(channel);
    let v = c.pulumi_version(PulumiVersionRequest {}).await.unwrap().into_inner().version;
    assert_eq!(v, versions::pulumi());

    let plain = pko_proto::v1::agent_client::AgentClient::connect(format!("http://127.0.0.1:{port}")).await;
    let refused = match plain {
        Err(_) => true,
        Ok(mut p) => p.pulumi_version(PulumiVersionRequest {}).await.is_err(),
    };
    assert!(refused, "a plaintext client must not be served");
}

/// A git source over SSH (OpenSSH `sshd` on loopback) with the Secret's private key: refused without
/// the key, cloned with it; the key never shows in the events.
#[tokio::test]
async fn git_over_ssh_with_a_private_key() {
    let env = pulumi_env();
    let root = bare_repo(&env, "sshgit");
    let server = pko_testbed::ssh::SshGitServer::start(&root).unwrap();
    let agent = Agent::start(&env, &["--auth", "none"], &[]);
    let mut c = agent.client().await;
    let git = |id: &str, auth: Option<pko_proto::v1::GitAuth>| {
        let mut r = request(&env, id, env.dir(), "dev", OperationType::Up);
        r.source = Some(Source {
            kind: Some(source::Kind::Git(GitSource {
                url: server.url("app.git"),
                revision: "main".into(),
                dir: String::new(),
                shallow: true,
                auth,
            })),
        });
        r
    };
    let r = result(&run(&mut c, git("ssh-nokey", None)).await);
    assert_eq!(reason(&r), ErrorReason::InvalidSource, "{}", r.message);
    let auth = pko_proto::v1::GitAuth { ssh_private_key: Some(literal(&server.client_key)), ..Default::default() };
    let events = run(&mut c, git("ssh-key", Some(auth))).await;
    let r = result(&events);
    assert_eq!(r.status, ResultStatus::Succeeded as i32, "{}", all_text(&events));
    assert_eq!(r.revision.len(), 40);
    let key_body = server.client_key.lines().nth(1).unwrap();
    assert!(!all_text(&events).contains(key_body), "the private key is not in the events");
}

/// PKO's `IncompatibleConfiguration`: structured config needs Pulumi CLI ≥ 3.202.0. The bed's CLI is
/// newer, so the agent runs it behind a wrapper that reports `v3.180.0` for `pulumi version` (and runs
/// the real CLI for everything else): the gate refuses structured config before any stack is touched,
/// and string config still deploys.
#[tokio::test]
async fn structured_config_on_an_old_cli_is_an_incompatible_configuration() {
    use std::os::unix::fs::PermissionsExt;
    let env = pulumi_env();
    let path = env.vars().into_iter().find(|(k, _)| k == "PATH").unwrap().1;
    let real = std::env::split_paths(&path).map(|d| d.join("pulumi")).find(|p| p.is_file()).expect("the bed's pulumi");
    let shim = env.dir().join("old-pulumi");
    std::fs::write(
        &shim,
        format!("#!/bin/sh\nif [ \"$1\" = version ]; then echo v3.180.0; exit 0; fi\nexec {} \"$@\"\n", real.display()),
    )
    .unwrap();
    std::fs::set_permissions(&shim, std::fs::Permissions::from_mode(0o755)).unwrap();
    let agent = Agent::start(&env, &["--auth", "none", "--pulumi", shim.to_str().unwrap()], &[]);
    let mut c = agent.client().await;
    let dir = slow(&env, "oldcli", 0);
    let number = prost_types::Value { kind: Some(prost_types::value::Kind::NumberValue(3.0)) };
    let mut r = request(&env, "old-1", &dir, "dev", OperationType::Up);
    r.config = vec![ConfigItem {
        key: "replicas".into(),
        value: Some(config_item::Value::Literal(number)),
        ..Default::default()
    }];
    let res = result(&run(&mut c, r).await);
    assert_eq!(
        (res.status, reason(&res)),
        (ResultStatus::Failed as i32, ErrorReason::IncompatibleConfiguration),
        "{}",
        res.message
    );
    assert_eq!(res.message, "Pulumi CLI version v3.180.0 does not support JSON configuration, require >= v3.202.0");
    assert!(files_under_state(&env, "oldcli").is_empty(), "refused before the stack was created");
    let text = prost_types::Value { kind: Some(prost_types::value::Kind::StringValue("3".into())) };
    let mut r = request(&env, "old-2", &dir, "dev", OperationType::Up);
    r.config = vec![ConfigItem {
        key: "replicas".into(),
        value: Some(config_item::Value::Literal(text)),
        ..Default::default()
    }];
    let res = result(&run(&mut c, r).await);
    assert_eq!(res.status, ResultStatus::Succeeded as i32, "string config needs no new CLI: {}", res.message);
}

/// Files of the env's `file://` backend whose path names `project`.
fn files_under_state(env: &pko_testbed::PulumiEnv, project: &str) -> Vec<std::path::PathBuf> {
    fn walk(d: &std::path::Path, out: &mut Vec<std::path::PathBuf>) {
        for e in std::fs::read_dir(d).into_iter().flatten().flatten() {
            let p = e.path();
            if p.is_dir() { walk(&p, out) } else { out.push(p) }
        }
    }
    let mut out = Vec::new();
    walk(&env.dir().join("state"), &mut out);
    out.retain(|p| p.to_string_lossy().contains(project));
    out
}

/// PKO's dynamic environment variables (`$PULUMI_ENV`, 2.2.0): what is written to the agent's
/// `--env-file` reaches Pulumi — read before each operation, so a later write counts without a restart
/// (PKO reads it once at start) — and wins over the request's env.
#[tokio::test]
async fn the_env_file_reaches_each_operation() {
    let env = pulumi_env();
    let file = env.dir().join("dynamic.env");
    let link = env.dir().join("workspace");
    // a Workspace's own pod, as PKO's: operations share the fetched source, which /share/workspace shows
    let agent = Agent::start(
        &env,
        &[
            "--auth",
            "none",
            "--isolate-operations=false",
            "--env-file",
            file.to_str().unwrap(),
            "--workspace-link",
            link.to_str().unwrap(),
        ],
        &[],
    );
    let mut c = agent.client().await;
    let dir = project(
        &env,
        "dynenv",
        "resources:\n  echo:\n    type: command:local:Command\n    properties:\n      create: echo \
            \"$FROM_ENV_FILE\"\n      triggers: [\"${run}\"]\nconfig:\n  run: {type: string}\noutputs:\n  out: \
                ${echo.stdout}\n",
    );
    let run_with = |id: &str, run: &str| {
        let mut r = request(&env, id, &dir, "dev", OperationType::Up);
        r.config = vec![ConfigItem {
            key: "run".into(),
            value: Some(config_item::Value::Literal(prost_types::Value {
                kind: Some(prost_types::value::Kind::StringValue(run.into())),
            })),
            ..Default::default()
        }];
        r.env.push(pko_proto::v1::EnvVar {
            name: "FROM_ENV_FILE".into(),
            value: Some(literal("from the request")),
            secret: false,
        });
        r
    };
    let r = result(&run(&mut c, run_with("dyn-1", "1")).await);
    assert_eq!(r.status, ResultStatus::Succeeded as i32, "{}", r.message);
    assert_eq!(outputs(&r)["out"].0, serde_json::json!("from the request"), "no file yet: {}", r.message);
    assert!(link.join("Pulumi.yaml").is_file(), "PKO's /share/workspace points at the operation's project");
    let salt = || {
        let text = std::fs::read_to_string(link.join("Pulumi.dev.yaml")).unwrap_or_default();
        text.lines().find(|l| l.starts_with("encryptionsalt:")).map(str::to_string)
    };
    let first_salt = salt();
    assert!(first_salt.is_some(), "the passphrase secrets manager wrote its salt");
    std::fs::write(&file, "FROM_ENV_FILE=\"written by an init container\"\n").unwrap();
    let r = result(&run(&mut c, run_with("dyn-2", "2")).await);
    assert_eq!(r.status, ResultStatus::Succeeded as i32, "{}", r.message);
    assert_eq!(outputs(&r)["out"].0, serde_json::json!("written by an init container"), "{}", r.message);
    assert_eq!(salt(), first_salt, "the stack's salt is kept from one operation to the next: no new secrets manager");
    std::fs::write(&file, "FROM_ENV_FILE=\"unterminated\n").unwrap();
    let r = result(&run(&mut c, run_with("dyn-3", "3")).await);
    assert_eq!((r.status, reason(&r)), (ResultStatus::Failed as i32, ErrorReason::InvalidConfig), "{}", r.message);
    assert!(
        r.message.contains("dynamic.env") && !r.message.contains("unterminated"),
        "names the file, not the line: {}",
        r.message
    );
}

/// `pko-agent init`, the workspace pod's `fetch` init container: the dynamic environment file exists
/// (what an earlier init container wrote is kept) and the work directory too.
#[test]
fn init_prepares_the_shared_volume() {
    let share = tempfile::tempdir().unwrap();
    std::fs::write(share.path().join(".env"), "A=1\n").unwrap();
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_pko-agent"))
        .args(["init", "--share"])
        .arg(share.path())
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    assert_eq!(std::fs::read_to_string(share.path().join(".env")).unwrap(), "A=1\n", "kept");
    assert!(share.path().join("work").is_dir());
    let fresh = tempfile::tempdir().unwrap();
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_pko-agent"))
        .args(["init", "--share"])
        .arg(fresh.path())
        .output()
        .unwrap();
    assert!(out.status.success() && fresh.path().join(".env").is_file());
}
