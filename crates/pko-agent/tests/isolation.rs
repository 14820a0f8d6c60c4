//! Isolation between operations on one agent, and an agent's processes ending with it: the real agent
//! binary and the real Pulumi CLI of the bed.

mod common;

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::time::Duration;

use common::*;
use pko_proto::v1::{ArtifactSource, EnvVar, OperationType, ResultStatus, Source, source};

/// One program for every Stack ([`pko_testbed::probe::ISOLATION_PROBE`]), with a secret config value so
/// each stack has a settings file holding a secure value, and the operation's id in the probe's environment (config
/// `run`), so the probe runs again when a stack runs again (its directory is the same path each time).
fn probe_program() -> String {
    let script: String = pko_testbed::probe::ISOLATION_PROBE.lines().map(|l| format!("        {l}\n")).collect();
    format!(
        "config:\n  pw:\n    type: string\n    secret: true\n  run:\n    type: string\nresources:\n  probe:\n    \
            type: command:local:Command\n    properties:\n      dir: ${{pulumi.cwd}}\n      environment:\n        \
            STACK: ${{pulumi.stack}}\n        RUN: ${{run}}\n      create: |\n{script}outputs:\n  report: \
            ${{probe.stdout}}\n"
    )
}

/// A request for `stack` of the probe with its own secret env var, `ONLY_<stack>`, and a secret config
/// value (so the stack has a settings file with a secure value).
fn probe_request(env: &pko_testbed::PulumiEnv, id: &str, dir: &Path, stack: &str) -> pko_proto::v1::OperationRequest {
    let mut r = request(env, id, dir, stack, OperationType::Up);
    r.env.push(EnvVar { name: "OP_SECRET".into(), value: Some(literal(&format!("secret-of-{stack}"))), secret: true });
    r.env.push(EnvVar { name: format!("ONLY_{stack}"), value: Some(literal("1")), secret: false });
    r.config.push(config("pw", serde_json::json!(format!("pw-of-{stack}")), true));
    r.config.push(config("run", serde_json::json!(id), false));
    r
}

/// Processes whose working directory is under `dir` (what an agent working there left running).
fn processes_under(dir: &Path) -> Vec<(i32, String)> {
    let dir = std::fs::canonicalize(dir).unwrap_or_else(|_| dir.to_path_buf());
    let mut out = Vec::new();
    for e in std::fs::read_dir("/proc").unwrap().flatten() {
        let Some(pid) = e.file_name().to_str().and_then(|s| s.parse::<i32>().ok()) else { continue };
        if std::fs::read_link(e.path().join("cwd")).is_ok_and(|cwd| cwd.starts_with(&dir)) {
            let name = std::fs::read_to_string(e.path().join("comm")).unwrap_or_default().trim().to_string();
            out.push((pid, name));
        }
    }
    out
}

#[tokio::test]
async fn nothing_of_one_stacks_operation_reaches_the_next_on_one_agent() {
    let env = pulumi_env();
    // the agent's shared plugin cache holds a plugin an operation will try to change
    let plugins: PathBuf = env.dir().join("home/plugins");
    std::fs::create_dir_all(plugins.join("resource-fake-v1.0.0")).unwrap();
    std::fs::write(plugins.join("resource-fake-v1.0.0/marker"), "original\n").unwrap();
    let agent = Agent::start(&env, &["--auth", "none"], &[]);
    let mut client = agent.client().await;
    // one source for both Stacks (one Program, or one git revision): the most they could share
    let dir = project(&env, "iso", &probe_program());

    // A, then B, then A again: each sees nothing of the one before
    for (i, stack) in ["a", "b", "a"].iter().enumerate() {
        let events = run(&mut client, probe_request(&env, &format!("op-{i}"), &dir, stack)).await;
        let r = result(&events);
        let text = all_text(&events);
        assert_eq!(r.status, ResultStatus::Succeeded as i32, "{stack}: {}: {text}", r.message);
        assert_eq!(
            outputs(&r)["report"].0,
            serde_json::json!("found:"),
            "operation {i} ({stack}) found what an earlier one left: {text}"
        );
        assert!(!text.contains("secret-of-"), "secret values stay masked: {text}");
        assert!(
            text.contains("stopped 1 process(es) the operation left running") && text.contains("sleep"),
            "the daemon was stopped and named: {text}"
        );
        assert!(
            text.contains("removed plugins this operation added to or changed")
                && text.contains("resource-planted-v9.9.9"),
            "{text}"
        );
        assert!(
            pko_testbed::probe::probe_daemons().is_empty(),
            "nothing of operation {i} still runs: {:?}",
            pko_testbed::probe::probe_daemons()
        );
        let ops: Vec<_> = std::fs::read_dir(agent.work.path().join("ops")).unwrap().collect();
        assert!(ops.is_empty(), "the operation's directories are gone: {ops:?}");
        assert!(!dir.join("leak.txt").exists() && !dir.join("Pulumi.a.yaml").exists(), "the source stays pristine");
    }
    assert!(
        !plugins.join("resource-fake-v1.0.0").exists(),
        "the plugin the first operation changed was removed, not run by the next"
    );
    assert!(!plugins.join("resource-planted-v9.9.9").exists());
    assert!(!env.dir().join("home/leak.txt").exists(), "the agent's own PULUMI_HOME was not written");
}

#[tokio::test]
async fn an_agent_killed_alone_mid_up_leaves_no_process_and_the_next_agent_completes_the_operation() {
    let env = pulumi_env();
    let mut a = Agent::start(&env, &["--auth", "none"], &[]);
    let mut ca = a.client().await;
    let dir = project(
        &env,
        "killed-alone",
        "resources:\n  slow:\n    type: command:local:Command\n    properties:\n      create: sleep 37; echo \
            done\noutputs:\n  out: ${slow.stdout}\n",
    );
    let mut stream = ca.run(request(&env, "alone-1", &dir, "dev", OperationType::Up)).await.unwrap().into_inner();
    // until the command runs: pulumi, its language host, the provider and the command's shell all live
    let end = std::time::Instant::now() + Duration::from_secs(60);
    while processes_under(a.work.path()).iter().all(|(_, n)| n != "sleep") {
        assert!(std::time::Instant::now() < end, "the command never started");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let before = processes_under(a.work.path());
    assert!(before.iter().any(|(_, n)| n.starts_with("pulumi")), "{before:?}");
    // SIGKILL of the agent process alone: not its process group (a plugin's group is its own anyway)
    let killed_at = std::time::Instant::now();
    nix::sys::signal::kill(nix::unistd::Pid::from_raw(a.child.id() as i32), nix::sys::signal::Signal::SIGKILL).unwrap();
    let _ = a.child.wait();
    while !processes_under(a.work.path()).is_empty() {
        assert!(
            killed_at.elapsed() < Duration::from_secs(5),
            "the killed agent's processes outlived it: {:?}",
            processes_under(a.work.path())
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let gone_after = killed_at.elapsed();
    drop(stream.message().await);
    assert_eq!(lock_files(&env).len(), 1, "the killed pulumi left its lock");

    // the operation again on another agent at a newer epoch (the operator's retry): it completes
    let b = Agent::start(&env, &["--auth", "none"], &[]);
    let mut cb = b.client().await;
    let mut again = request(&env, "alone-1", &dir, "dev", OperationType::Up);
    again.epoch = 2;
    std::fs::write(
        dir.join("Pulumi.yaml"),
        "name: killed-alone\nruntime: yaml\nresources:\n  slow:\n    type: command:local:Command\n    \
            properties:\n      create: sleep 1; echo done\noutputs:\n  out: ${slow.stdout}\n",
    )
    .unwrap();
    let events = run(&mut cb, again).await;
    let r = result(&events);
    let text = all_text(&events);
    assert_eq!(r.status, ResultStatus::Succeeded as i32, "{}: {text}", r.message);
    assert!(text.contains("releasing 1 stale lock(s) whose holder is known dead"), "{text}");
    assert!(lock_files(&env).is_empty(), "no lock left: {:?}", lock_files(&env));
    println!(
        "every process of the killed agent gone {:.3} s after its SIGKILL ({} before)",
        gone_after.as_secs_f64(),
        before.len()
    );
}

#[tokio::test]
async fn an_operation_waits_for_a_lock_holder_still_running_on_this_host_then_runs() {
    let env = pulumi_env();
    let a = Agent::start(&env, &["--auth", "none"], &[]);
    let b = Agent::start(&env, &["--auth", "none"], &[]);
    let (mut ca, mut cb) = (a.client().await, b.client().await);
    let body = "resources:\n  slow:\n    type: command:local:Command\n    properties:\n      create: sleep 4; echo \
        done\noutputs:\n  out: ${slow.stdout}\n";
    let dir = project(&env, "wait", body);
    let r = result(&run(&mut ca, request(&env, "create", &dir, "dev", OperationType::Preview)).await);
    assert_eq!(r.status, ResultStatus::Succeeded as i32, "{}", r.message);
    let (ea, eb) = tokio::join!(run(&mut ca, request(&env, "first", &dir, "dev", OperationType::Up)), async {
        tokio::time::sleep(Duration::from_millis(1500)).await;
        run(&mut cb, request(&env, "second", &dir, "dev", OperationType::Up)).await
    });
    let (ra, rb) = (result(&ea), result(&eb));
    assert_eq!(
        (ra.status, rb.status),
        (ResultStatus::Succeeded as i32, ResultStatus::Succeeded as i32),
        "{ra:?}\n{rb:?}"
    );
    let text = all_text(&eb);
    assert!(
        text.contains("still running on this host; waiting up to 30 s")
            && text.contains("the lock holders ended; trying again"),
        "{text}"
    );
    assert!(!text.contains("stale lock"), "a live holder's lock is never released: {text}");
    assert!(lock_files(&env).is_empty());
}

/// The script of [`what_an_operation_does_to_shared_dependency_trees_never_reaches_the_next`]: reports what it
/// finds changed in `node_modules` and the virtualenv, then, with `TAMPER=1`, writes into both, plants a file in
/// each and puts every mode back.
const TREE_PROBE: &str = r#"found=""
for d in node_modules/dep venv/lib; do
  grep -qx original "$d/marker" || found="$found changed:$d"
  [ -e "$d/planted" ] && found="$found planted:$d"
done
if [ "$TAMPER" = 1 ]; then
  for d in node_modules/dep venv/lib; do
    chmod u+w "$d" "$d/marker"; echo evil >> "$d/marker"; echo evil > "$d/planted"; chmod a-w "$d/marker" "$d"
  done
fi
echo "found:$found"
"#;

/// A fetched revision's dependency trees (`node_modules`, a virtualenv) are linked into each operation, not copied —
/// and what one operation does to them never reaches the next: Stack a's operation writes into both, plants a file in
/// each and puts every mode back; Stack b's operation of the same revision on the same agent finds them pristine (the
/// agent found the change, discarded the revision and fetched it again, and says so); Stack c's links them untouched.
#[tokio::test]
async fn what_an_operation_does_to_shared_dependency_trees_never_reaches_the_next() {
    let env = pulumi_env();
    let agent = Agent::start(&env, &["--auth", "none"], &[]);
    let mut client = agent.client().await;
    let script: String = TREE_PROBE.lines().map(|l| format!("        {l}\n")).collect();
    let program = format!(
        "name: trees\nruntime: yaml\nresources:\n  probe:\n    type: command:local:Command\n    properties:\n      \
            dir: ${{pulumi.cwd}}\n      create: |\n{script}outputs:\n  report: ${{probe.stdout}}\n"
    );
    let tar = tarball(&[
        ("Pulumi.yaml", program.as_bytes()),
        ("node_modules/dep/marker", b"original\n"),
        ("venv/pyvenv.cfg", b"home = /usr/bin\n"),
        ("venv/lib/marker", b"original\n"),
    ]);
    let server = serve_files(std::collections::HashMap::from([("/trees.tar.gz".to_string(), tar.clone())])).await;
    let dir = project(&env, "trees-local", &program);
    for (i, (stack, tamper)) in [("a", "1"), ("b", "0"), ("c", "0")].into_iter().enumerate() {
        let mut r = request(&env, &format!("trees-{i}"), &dir, stack, OperationType::Up);
        r.source = Some(pko_proto::v1::Source {
            kind: Some(pko_proto::v1::source::Kind::Artifact(pko_proto::v1::ArtifactSource {
                url: format!("{}/trees.tar.gz", server.base),
                digest: sha256(&tar),
                dir: String::new(),
                mirrors: vec![],
            })),
        });
        r.env.push(EnvVar { name: "TAMPER".into(), value: Some(literal(tamper)), secret: false });
        let events = run(&mut client, r).await;
        let (res, text) = (result(&events), all_text(&events));
        assert_eq!(res.status, ResultStatus::Succeeded as i32, "{stack}: {}: {text}", res.message);
        assert_eq!(outputs(&res)["report"].0, serde_json::json!("found:"), "{stack} found a change: {text}");
        assert!(text.contains("linked 2 shared dependency tree(s)"), "{stack}: the trees are shared: {text}");
        let discarded = text.contains("changed since it was sealed") && text.contains("discarded and prepared again");
        assert_eq!(discarded, stack == "b", "{stack}: only the operation after the tampering finds it: {text}");
    }
}

const CACHE_PROBE: &str = r#"found=""
for c in "$TS_NODE_CACHE_DIRECTORY" "$GOCACHE" "$GOMODCACHE"; do
  mkdir -p "$c"; found="$found$(ls "$c" | tr '\n' ' ')|"
  [ "$WRITE" = 1 ] && echo own > "$c/own-$STACK"
  if [ "$TAMPER" = 1 ]; then
    for other in "$(dirname "$(dirname "$c")")"/*/"$(basename "$c")"; do
      [ "$other" = "$c" ] || echo evil > "$other/planted"
    done
  fi
done
echo "found:$found"
"#;

/// A Stack's own caches (TypeScript's `TS_NODE_CACHE_DIRECTORY`, Go's `GOCACHE` and `GOMODCACHE`,
/// [`pko_agent::stack_cache`]) outlive its operation and reach only that Stack's next one: b's second operation finds
/// what its first wrote in each; a's operation finds none of it, and plants a file in each of every other Stack's
/// caches by absolute path; b's next operation finds its caches emptied (the agent says so), the planted files gone.
#[tokio::test]
async fn a_stacks_own_cache_reaches_its_next_operation_and_no_other_stacks() {
    let env = pulumi_env();
    let agent = Agent::start(&env, &["--auth", "none"], &[]);
    let mut client = agent.client().await;
    let script: String = CACHE_PROBE.lines().map(|l| format!("        {l}\n")).collect();
    let program = format!(
        "config:\n  run:\n    type: string\nresources:\n  probe:\n    \
            type: command:local:Command\n    properties:\n      triggers: [\"${{run}}\"]\n      create: |\n{script}\
            outputs:\n  report: ${{probe.stdout}}\n"
    );
    let dir = project(&env, "caches", &program);
    let steps = [
        ("b", "1", "0", "found:|||"),
        ("b", "0", "0", "found:own-b |own-b |own-b |"),
        ("a", "0", "1", "found:|||"),
        ("b", "0", "0", "found:|||"),
    ];
    for (i, (stack, write, tamper, expected)) in steps.into_iter().enumerate() {
        let mut r = request(&env, &format!("caches-{i}"), &dir, stack, OperationType::Up);
        r.config.push(config("run", serde_json::json!(format!("{i}")), false));
        for (name, v) in [("WRITE", write), ("TAMPER", tamper), ("STACK", stack)] {
            r.env.push(EnvVar { name: name.into(), value: Some(literal(v)), secret: false });
        }
        let events = run(&mut client, r).await;
        let (res, text) = (result(&events), all_text(&events));
        assert_eq!(res.status, ResultStatus::Succeeded as i32, "{i} {stack}: {}: {text}", res.message);
        assert_eq!(outputs(&res)["report"].0, serde_json::json!(expected), "{i} {stack}: {text}");
        let emptied = text.contains("the stack's cache changed since its last operation");
        assert_eq!(emptied, i == 3, "{i} {stack}: only b's operation after the planting finds it: {text}");
    }
}

/// `pulumi install` of a revision an operation fetches runs with that operation's Stack's own caches
/// (`runner/caches.rs`: Go's module downloads land where the Stack's build reads them). The project's own
/// `postinstall`, run by npm under the real `pulumi install` (offline, from the npm cache), writes a marker into
/// `$GOCACHE`; the program reports what its `$GOCACHE` holds. Stack a's operation, which fetched and installed the
/// revision, finds the marker in its cache; Stack b's operation of the same, already installed revision finds its own
/// cache empty.
#[tokio::test]
async fn a_revisions_install_writes_into_the_caches_of_the_stack_whose_operation_prepared_it() {
    let env = pulumi_env();
    // the bed's TypeScript program's dependencies and lockfile (npm offline installs from its cache by the lockfile)
    let package = r#"{"name": "tsk8s", "main": "index.js",
        "dependencies": {"@pulumi/pulumi": "3.259.0", "@pulumi/kubernetes": "4.24.1"},
        "devDependencies": {"typescript": "^5.0.0", "@types/node": "^20.0.0"},
        "scripts": {"postinstall": "mkdir -p \"$GOCACHE\" && echo x > \"$GOCACHE/installed\""}}"#;
    let index = "const fs = require('fs'); require('@pulumi/pulumi');\n\
        fs.mkdirSync(process.env.GOCACHE, { recursive: true });\n\
        exports.report = 'found:' + fs.readdirSync(process.env.GOCACHE).sort().join(',');\n";
    let files: [(&str, &[u8]); 4] = [
        ("Pulumi.yaml", b"name: install-probe\nruntime: nodejs\n"),
        ("package.json", package.as_bytes()),
        (
            "package-lock.json",
            include_bytes!("../../../scripts/testbed/programs/typescript-kubernetes/package-lock.json"),
        ),
        ("index.js", index.as_bytes()),
    ];
    let tar = tarball(&files);
    let files = HashMap::from([("/app.tar.gz".to_string(), tar.clone())]);
    let server = pko_testbed::plugins::PluginServer::kubernetes(&["4.24.1"], files).await;
    let npm_cache = format!("{}/.npm", std::env::var("HOME").unwrap_or_else(|_| "/root".into()));
    let overrides = server.overrides();
    let vars = [("npm_config_cache", npm_cache.as_str()), ("PULUMI_PLUGIN_DOWNLOAD_URL_OVERRIDES", &overrides)];
    let agent = Agent::start(&env, &["--auth", "none"], &vars);
    let mut client = agent.client().await;
    for (i, (stack, expected)) in [("a", "found:installed"), ("b", "found:")].into_iter().enumerate() {
        let mut r = request(&env, &format!("install-caches-{i}"), env.dir(), stack, OperationType::Up);
        r.source = Some(Source {
            kind: Some(source::Kind::Artifact(ArtifactSource {
                url: format!("{}/app.tar.gz", server.http.base),
                digest: sha256(&tar),
                dir: String::new(),
                mirrors: vec![],
            })),
        });
        let events = run(&mut client, r).await;
        let (res, text) = (result(&events), all_text(&events));
        assert_eq!(res.status, ResultStatus::Succeeded as i32, "{stack}: {}: {text}", res.message);
        assert_eq!(outputs(&res)["report"].0, serde_json::json!(expected), "{stack}: {text}");
    }
}
