//! The bad-input corpus of the operator (docs/security.md), against the real API server with the
//! operator in this process and real agents: option-like git URLs and refs, templates the API server
//! refuses (by its own validation and by a ValidatingAdmissionPolicy), case-colliding secret config keys,
//! a Workspace `KUBECONFIG` aimed at another identity, the artifact server's cost for unknown paths, and
//! the authentication of `/metrics`. Each case asserts a clear condition naming the field, and that no
//! command ran and no write loop started.

mod common;

use std::sync::Arc;
use std::time::Duration;

use common::*;
use k8s_openapi::api::core::v1::{Secret, ServiceAccount};
use kube::ResourceExt;
use kube::api::{Api, PostParams};
use pko_api::{Program, Stack, Update};
use pko_operator::context::Context;
use pko_operator::ownership::Namespaces;
use pko_testbed::{eventually, testbed};
use serde_json::json;

fn stack(name: &str, spec: serde_json::Value) -> serde_json::Value {
    json!({"apiVersion": "pulumi.com/v1", "kind": "Stack", "metadata": {"name": name}, "spec": spec})
}

/// Polls `f` every 250 ms until it gives a value; panics after `secs`.
async fn poll<T, F, Fut>(what: &str, secs: u64, mut f: F) -> T
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Option<T>>,
{
    let end = tokio::time::Instant::now() + Duration::from_secs(secs);
    loop {
        if let Some(v) = f().await {
            return v;
        }
        assert!(tokio::time::Instant::now() < end, "{what}: not within {secs} s");
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
}

async fn wait_stalled(stacks: &Api<Stack>, name: &str) -> (String, String) {
    poll(&format!("stack {name} is Stalled"), 60, || async { stalled(&stacks.get(name).await.unwrap()) }).await
}

/// How many times the Stack is written during `secs` seconds (resourceVersion changes seen by polling
/// every 100 ms; a hot loop shows as dozens).
async fn writes_during(stacks: &Api<Stack>, name: &str, secs: u64) -> usize {
    let mut last = stacks.get(name).await.unwrap().resource_version();
    let mut writes = 0;
    let end = tokio::time::Instant::now() + Duration::from_secs(secs);
    while tokio::time::Instant::now() < end {
        tokio::time::sleep(Duration::from_millis(100)).await;
        let rv = stacks.get(name).await.unwrap().resource_version();
        if rv != last {
            writes += 1;
            last = rv;
        }
    }
    writes
}

#[tokio::test]
async fn option_like_repositories_and_refs_stall_and_run_nothing() {
    let (client, ns, env) = setup("hostile-git").await;
    let task = start_stack_controller(&client, ns.name());
    let stacks = ns.api::<Stack>();
    let marks = env.dir().join("marks");
    std::fs::create_dir_all(&marks).unwrap();
    let touch = |n: &str| format!("--upload-pack=touch {}", marks.join(n).display());
    let cases = [
        ("repo", json!({"stack": "dev", "projectRepo": touch("repo"), "branch": "main"}), "spec.projectRepo"),
        (
            "branch",
            json!({"stack": "dev", "projectRepo": "git://127.0.0.1:1/x.git", "branch": touch("branch")}),
            "spec.branch",
        ),
        (
            "commit",
            json!({"stack": "dev", "projectRepo": "git://127.0.0.1:1/x.git", "commit": touch("commit")}),
            "spec.commit",
        ),
        (
            "ext",
            json!({"stack": "dev", "projectRepo": format!("ext::touch%S{}", marks.join("ext").display()),
                "branch": "main"}),
            "remote helper",
        ),
    ];
    for (name, spec, _) in &cases {
        create(&stacks, stack(name, spec.clone())).await;
    }
    for (name, _, field) in &cases {
        let (reason, message) = wait_stalled(&stacks, name).await;
        assert_eq!(reason, "SpecInvalid", "{name}: {message}");
        assert!(message.contains(field), "{name}: {message:?} lacks {field:?}");
    }
    assert_eq!(std::fs::read_dir(&marks).unwrap().count(), 0, "a git command ran");
    task.abort();
}

const PROGRAM: &str = concat!(
    r#"{"resources": {"hi": {"type": "command:local:Command", "properties": {"create": "echo hi"}}}, "#,
    r#""outputs": {"out": "${hi.stdout}"}}"#
);

#[tokio::test]
async fn refused_templates_stall_naming_the_field_without_a_write_loop() {
    let (client, ns, env) = setup("hostile-tpl").await;
    let op = InProcessOperator::start(&client, &env, ns.name()).await;
    create(
        &ns.api::<Program>(),
        json!({"apiVersion": "pulumi.com/v1", "kind": "Program", "metadata": {"name": "p"},
            "program": serde_json::from_str::<serde_json::Value>(PROGRAM).unwrap()}),
    )
    .await;
    let stacks = ns.api::<Stack>();
    let base = |extra: serde_json::Value| {
        let mut spec = json!({"stack": "dev", "programRef": {"name": "p"}, "backend": env.backend_url(),
            "envRefs": {"PULUMI_CONFIG_PASSPHRASE": {"type": "Literal",
                "literal": {"value": pko_testbed::PulumiEnv::PASSPHRASE}}}});
        spec.as_object_mut().unwrap().extend(extra.as_object().unwrap().clone());
        spec
    };

    // an admission policy of this namespace refuses Updates with a label our validation accepts
    let vap_name = format!("pko-hostile-{}", ns.name());
    let policy: k8s_openapi::api::admissionregistration::v1::ValidatingAdmissionPolicy =
        serde_json::from_value(json!({
            "apiVersion": "admissionregistration.k8s.io/v1", "kind": "ValidatingAdmissionPolicy",
                "metadata": {"name": vap_name},
            "spec": {"failurePolicy": "Fail",
                     "matchConstraints": {"resourceRules": [{"apiGroups": ["auto.pulumi.com"], "apiVersions": ["*"],
                         "operations": ["CREATE"], "resources": ["updates", "workspaces"]}]},
                     "validations": [{"expression": "!has(object.metadata.labels) || !('pko-hostile-refuse' in \
                         object.metadata.labels)",
                                      "message": "objects labelled pko-hostile-refuse are not allowed here"}]}
        }))
        .unwrap();
    let policies = Api::<k8s_openapi::api::admissionregistration::v1::ValidatingAdmissionPolicy>::all(client.clone());
    policies.create(&PostParams::default(), &policy).await.unwrap();
    use k8s_openapi::api::admissionregistration::v1::ValidatingAdmissionPolicyBinding;
    let binding: ValidatingAdmissionPolicyBinding = serde_json::from_value(json!({
        "apiVersion": "admissionregistration.k8s.io/v1", "kind": "ValidatingAdmissionPolicyBinding",
            "metadata": {"name": vap_name},
        "spec": {"policyName": vap_name, "validationActions": ["Deny"],
                 "matchResources": {"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": ns.name()}}}}
    }))
    .unwrap();
    let bindings =
        Api::<k8s_openapi::api::admissionregistration::v1::ValidatingAdmissionPolicyBinding>::all(client.clone());
    bindings.create(&PostParams::default(), &binding).await.unwrap();
    // the policy is enforced once the API server has loaded it
    let probe: Update = serde_json::from_value(json!({"apiVersion": "auto.pulumi.com/v1alpha1", "kind": "Update",
        "metadata": {"name": "probe", "labels": {"pko-hostile-refuse": "yes"}}, "spec": {"workspaceName": "none",
            "stackName": "dev", "type": "preview"}}))
    .unwrap();
    eventually("the admission policy is enforced", 30, || async {
        match ns.api::<Update>().create(&PostParams::default(), &probe).await {
            Err(_) => true,
            Ok(_) => {
                let _ = ns.api::<Update>().delete("probe", &Default::default()).await;
                false
            }
        }
    })
    .await;

    let cases = [
        (
            "bad-label-key",
            json!({"updateTemplate": {"metadata": {"labels": {"bad key!": "x"}}}}),
            r#"spec.updateTemplate.metadata.labels["bad key!"]"#,
        ),
        (
            "bad-ws-label",
            json!({"workspaceTemplate": {"metadata": {"labels": {"ok": "not a valid value!"}}}}),
            r#"spec.workspaceTemplate.metadata.labels["ok"]"#,
        ),
        (
            "refused-by-policy",
            json!({"updateTemplate": {"metadata": {"labels": {"pko-hostile-refuse": "yes"}}}}),
            "spec.updateTemplate: the API server refused the Update",
        ),
        (
            "ws-refused-by-policy",
            json!({"workspaceTemplate": {"metadata": {"labels": {"pko-hostile-refuse": "yes"}}}}),
            "spec.workspaceTemplate: the API server refused the Workspace",
        ),
    ];
    for (name, extra, _) in &cases {
        create(&stacks, stack(name, base(extra.clone()))).await;
    }
    for (name, _, field) in &cases {
        let (reason, message) = wait_stalled(&stacks, name).await;
        assert_eq!(reason, "SpecInvalid", "{name}: {message}");
        assert!(message.contains(field), "{name}: {message:?} lacks {field:?}");
    }
    // no write loop: a Stalled Stack stays as it is (before the fix: ~25 writes a second)
    for (name, _, _) in &cases {
        let writes = writes_during(&stacks, name, 5).await;
        eprintln!("{name}: {writes} writes in 5 s");
        assert!(writes <= 1, "{name} was written {writes} times in 5 s");
    }
    let updates = ns.api::<Update>().list(&Default::default()).await.unwrap();
    assert!(
        updates.items.is_empty(),
        "no Update was created: {:?}",
        updates.items.iter().map(|u| u.name_any()).collect::<Vec<_>>()
    );

    // a spec change (new generation) is tried again: without the refused label the Stack goes Ready
    stacks
        .patch(
            "refused-by-policy",
            &kube::api::PatchParams::default(),
            &kube::api::Patch::Merge(json!({"spec": {"updateTemplate": {"metadata":
                {"labels": {"pko-hostile-refuse": null, "fine": "yes"}}}}})),
        )
        .await
        .unwrap();
    eventually("the fixed Stack is Ready", 120, || async {
        let s = stacks.get("refused-by-policy").await.unwrap();
        s.status
            .and_then(|st| st.conditions)
            .unwrap_or_default()
            .iter()
            .any(|c| c.type_ == "Ready" && c.status == "True")
    })
    .await;
    bindings.delete(&vap_name, &Default::default()).await.unwrap();
    policies.delete(&vap_name, &Default::default()).await.unwrap();
    drop(op);
}

#[tokio::test]
async fn case_colliding_secret_keys_reach_the_program_apart_and_a_secret_is_read_only_in_the_stacks_own_namespace() {
    let (client, ns, env) = setup("hostile-cfg").await;
    let op = InProcessOperator::start(&client, &env, ns.name()).await;
    let out = env.dir().join("out");
    std::fs::create_dir_all(&out).unwrap();
    create(
        &ns.api::<Secret>(),
        json!({"apiVersion": "v1", "kind": "Secret", "metadata": {"name": "db"},
        "stringData": {"lower": "value-of-lower", "upper": "VALUE-OF-UPPER"}}),
    )
    .await;
    let program = json!({
        "configuration": {"dbpass": {"type": "String"}, "dbPass": {"type": "String"}},
        "resources": {"w": {"type": "command:local:Command",
            "properties": {"create": format!("echo ${{dbpass}} > {0}/lower; echo ${{dbPass}} > {0}/upper",
                out.display())}}}
    });
    create(
        &ns.api::<Program>(),
        json!({"apiVersion": "pulumi.com/v1", "kind": "Program", "metadata": {"name": "p"}, "program": program}),
    )
    .await;
    let stacks = ns.api::<Stack>();
    create(
        &stacks,
        stack(
            "collide",
            json!({"stack": "dev", "programRef": {"name": "p"}, "backend": env.backend_url(),
               "envRefs": {"PULUMI_CONFIG_PASSPHRASE": {"type": "Literal",
                   "literal": {"value": pko_testbed::PulumiEnv::PASSPHRASE}}},
               "secretsRef": {"dbpass": {"type": "Secret", "secret": {"name": "db", "key": "lower"}},
                              "dbPass": {"type": "Secret", "secret": {"name": "db", "key": "upper"}}}}),
        ),
    )
    .await;
    eventually("the Stack is Ready", 120, || async {
        let s = stacks.get("collide").await.unwrap();
        s.status
            .and_then(|st| st.conditions)
            .unwrap_or_default()
            .iter()
            .any(|c| c.type_ == "Ready" && c.status == "True")
    })
    .await;
    assert_eq!(std::fs::read_to_string(out.join("lower")).unwrap().trim(), "value-of-lower");
    assert_eq!(
        std::fs::read_to_string(out.join("upper")).unwrap().trim(),
        "VALUE-OF-UPPER",
        "dbPass did not replace dbpass"
    );

    // the local agents' credentials are private to them: the pool's identity (one per class and
    // replica) and each agent's directory
    use std::os::unix::fs::PermissionsExt;
    let classes = env.dir().join("agents").join("pools").join(ns.name());
    let class = std::fs::read_dir(&classes).unwrap().flatten().next().unwrap().path().join("operator");
    let agent_dir = class.join("identity");
    for (f, mode) in [("kubeconfig", 0o600), ("token", 0o600), ("", 0o700), ("../0", 0o700)] {
        let m = std::fs::metadata(agent_dir.join(f)).unwrap().permissions().mode() & 0o777;
        assert_eq!(m, mode, "{f:?} has mode {m:o}");
    }
    // a token past half its lifetime is renewed while the pool has agents (the pool looks every second)
    let token = agent_dir.join("token");
    let old = std::fs::read_to_string(&token).unwrap();
    let two_hours_ago = std::time::SystemTime::now() - Duration::from_secs(7200);
    std::fs::File::options().write(true).open(&token).unwrap().set_modified(two_hours_ago).unwrap();
    poll("the local agent's token is renewed", 60, || async {
        let age = std::fs::metadata(&token).unwrap().modified().unwrap().elapsed().unwrap_or_default();
        (age < Duration::from_secs(600)).then_some(())
    })
    .await;
    assert_ne!(std::fs::read_to_string(&token).unwrap(), old, "a new token was written");
    assert_eq!(std::fs::metadata(&token).unwrap().permissions().mode() & 0o777, 0o600);

    // Secret references are resolved by the operator in the Stack's own namespace and nowhere else:
    // a Stack in a second namespace naming Secret `db` (which exists only in the first) fails naming
    // its own namespace's missing Secret — pointing KUBECONFIG at the bed's admin kubeconfig through
    // envRefs changes nothing (it reaches only the program), and the value of the first namespace's
    // `db` appears nowhere
    let (_, ns2, _) = setup("hostile-kcfg").await;
    let op2 = InProcessOperator::start(&client, &env, ns2.name()).await;
    create(
        &ns2.api::<Program>(),
        json!({"apiVersion": "pulumi.com/v1", "kind": "Program", "metadata": {"name": "p"},
            "program": serde_json::from_str::<serde_json::Value>(PROGRAM).unwrap()}),
    )
    .await;
    create(
        &ns2.api::<Stack>(),
        stack(
            "bypass",
            json!({"stack": "dev", "programRef": {"name": "p"}, "backend": env.backend_url(),
               "envRefs": {"PULUMI_CONFIG_PASSPHRASE": {"type": "Literal",
                   "literal": {"value": pko_testbed::PulumiEnv::PASSPHRASE}},
                           "KUBECONFIG": {"type": "Literal",
                               "literal": {"value": testbed().kubeconfig().display().to_string()}}},
               "secretsRef": {"pw": {"type": "Secret", "secret": {"name": "db", "key": "lower"}}}}),
        ),
    )
    .await;
    let updates = ns2.api::<Update>();
    let message = poll("the Update fails reading the Secret", 120, || async {
        let list = updates.list(&Default::default()).await.unwrap();
        list.items
            .iter()
            .find(|u| condition(u, "Failed").is_some_and(|(s, _)| s == "True"))
            .map(|u| u.status.as_ref().and_then(|s| s.message.clone()).unwrap_or_default())
    })
    .await;
    assert!(
        message.contains(&format!("Secret {}/db could not be read", ns2.name())) && message.contains("not found"),
        "{message}"
    );
    let s = ns2.api::<Stack>().get("bypass").await.unwrap();
    assert!(
        !s.status
            .clone()
            .and_then(|st| st.conditions)
            .unwrap_or_default()
            .iter()
            .any(|c| c.type_ == "Ready" && c.status == "True"),
        "the Stack must not be Ready"
    );
    let everything = serde_json::to_string(&(s, updates.list(&Default::default()).await.unwrap().items)).unwrap();
    assert!(!everything.contains("value-of-lower"), "the first namespace's Secret value leaked");
    drop(op2);
    drop(op);
}

/// `apiserver_request_total` of `GET` on `programs` (one Program), from the API server's own metrics.
async fn program_gets(client: &kube::Client) -> f64 {
    let text = client.request_text(http::Request::get("/metrics").body(Vec::new()).unwrap()).await.unwrap();
    text.lines()
        .filter(|l| {
            l.starts_with("apiserver_request_total{")
                && l.contains(r#"resource="programs""#)
                && l.contains(r#"verb="GET""#)
        })
        .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .sum()
}

async fn token_of(client: &kube::Client, ns: &str, sa: &str) -> String {
    let accounts = Api::<ServiceAccount>::namespaced(client.clone(), ns);
    accounts
        .create(
            &PostParams::default(),
            &serde_json::from_value(json!({"apiVersion": "v1", "kind": "ServiceAccount", "metadata": {"name": sa}}))
                .unwrap(),
        )
        .await
        .unwrap();
    let tr = k8s_openapi::api::authentication::v1::TokenRequest::default();
    accounts.create_token_request(sa, &PostParams::default(), &tr).await.unwrap().status.unwrap().token
}

#[tokio::test]
async fn unknown_artifacts_cost_no_api_reads_and_metrics_need_an_authorized_token() {
    let _ = rustls::crypto::ring::default_provider().install_default();
    let (client, ns, _env) = setup("hostile-http").await;
    let ctx = Arc::new(Context::new(client.clone(), "127.0.0.1:1".to_string(), Arc::new(Namespaces::one(ns.name()))));
    let mut informers = pko_operator::informer::Informers::new(client.clone(), scoped(ns.name()));
    let (programs, run) = pko_operator::program::program_controller(ctx.clone(), &mut informers);
    let run = informers.drive(run);
    let programs_for_metrics = programs.clone();
    let controller = tokio::spawn(run);
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let base = format!("http://{}", listener.local_addr().unwrap());
    let artifacts = pko_operator::artifacts::ArtifactState::new(programs);
    let server = tokio::spawn(pko_operator::artifacts::serve(listener, artifacts.clone()));
    let http = reqwest::Client::builder().danger_accept_invalid_certs(true).build().unwrap();
    let before = program_gets(&client).await;
    for i in 0..200 {
        let r = http
            .get(format!("{base}/programs/{}/missing-{i}/1/{}.tar.gz", ns.name(), "0".repeat(64)))
            .send()
            .await
            .unwrap();
        assert_eq!(r.status(), 404);
    }
    let after = program_gets(&client).await;
    eprintln!("200 requests for missing Programs: {} API reads of programs", after - before);
    assert!(after - before < 5.0, "{} API reads for 200 unknown artifact paths", after - before);

    // a real 1 MiB Program: a wrong digest is refused before anything is rendered; the published one is
    // rendered once and then served from the cache
    let big = "x".repeat(1 << 20);
    create(
        &ns.api::<pko_api::Program>(),
        serde_json::json!({"apiVersion": "pulumi.com/v1", "kind": "Program", "metadata": {"name": "big"},
                           "program": {"variables": {"blob": big}, "outputs": {"n": "${blob}"}}}),
    )
    .await;
    let programs_api = ns.api::<pko_api::Program>();
    pko_testbed::eventually("the big Program's artifact is published", 60, || async {
        programs_api.get("big").await.ok().and_then(|p| p.status?.artifact).is_some()
    })
    .await;
    let art = programs_api.get("big").await.unwrap().status.unwrap().artifact.unwrap();
    let path = |digest: &str| format!("{base}/programs/{}/big/1/{digest}.tar.gz", ns.name());
    let t = std::time::Instant::now();
    for i in 0..100 {
        let wrong = format!("{i:064x}");
        assert_eq!(http.get(path(&wrong)).send().await.unwrap().status(), 404);
    }
    eprintln!(
        "100 wrong-digest requests for a 1 MiB Program: {:.3} s, {} renders",
        t.elapsed().as_secs_f64(),
        artifacts.renders()
    );
    assert_eq!(artifacts.renders(), 0, "a wrong digest costs no rendering");
    let hex = art.digest.as_deref().unwrap().trim_start_matches("sha256:").to_string();
    for _ in 0..3 {
        let r = http.get(path(&hex)).send().await.unwrap();
        assert_eq!(r.status(), 200);
        assert_eq!(pko_operator::program::digest(&r.bytes().await.unwrap()), art.digest.clone().unwrap());
    }
    assert_eq!(artifacts.renders(), 1, "rendered once, then served from the cache");

    // /metrics: HTTPS; no token 401, an account without the role 403, one with it 200
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("https://{}/metrics", listener.local_addr().unwrap());
    let tls = pko_operator::metrics::self_signed_tls(vec![]).await.unwrap();
    let mut informers = pko_operator::informer::Informers::new(client.clone(), scoped(ns.name()));
    let (stacks, stack_controller) = pko_operator::stack::controller::controller(ctx.clone(), &mut informers);
    let stack_controller = tokio::spawn(informers.drive(stack_controller));
    let sources = pko_operator::metrics::Sources {
        stacks,
        programs: programs_for_metrics,
        ownership: ctx.ownership.clone(),
        handle: pko_operator::metrics::install_recorder(),
    };
    let metrics = tokio::spawn(pko_operator::metrics::serve(
        listener,
        client.clone(),
        sources,
        pko_operator::metrics::Security::Secure { tls },
        ctx.output.clone(),
    ));
    let get = |token: Option<String>| {
        let mut r = http.get(&url);
        if let Some(t) = token {
            r = r.bearer_auth(t);
        }
        async move { r.send().await.unwrap() }
    };
    assert_eq!(get(None).await.status(), 401);
    assert_eq!(get(Some("not-a-token".into())).await.status(), 401);
    let nobody = token_of(&client, ns.name(), "nobody").await;
    assert_eq!(get(Some(nobody)).await.status(), 403);
    let reader = token_of(&client, ns.name(), "scraper").await;
    let role = format!("pko-metrics-reader-{}", ns.name());
    let roles = Api::<k8s_openapi::api::rbac::v1::ClusterRole>::all(client.clone());
    roles
        .create(
            &PostParams::default(),
            &serde_json::from_value(
                json!({"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRole", "metadata": {"name": role},
            "rules": [{"nonResourceURLs": ["/metrics"], "verbs": ["get"]}]}),
            )
            .unwrap(),
        )
        .await
        .unwrap();
    let crbs = Api::<k8s_openapi::api::rbac::v1::ClusterRoleBinding>::all(client.clone());
    crbs.create(
        &PostParams::default(),
        &serde_json::from_value(json!({"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRoleBinding",
            "metadata": {"name": role},
            "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": role},
            "subjects": [{"kind": "ServiceAccount", "name": "scraper", "namespace": ns.name()}]}))
        .unwrap(),
    )
    .await
    .unwrap();
    let body = poll("the scraper is allowed", 30, || async {
        let r = get(Some(reader.clone())).await;
        if r.status() == 200 { Some(r.text().await.unwrap()) } else { None }
    })
    .await;
    assert!(body.contains("stacks_active"), "{body}");
    let _ = crbs.delete(&role, &Default::default()).await;
    let _ = roles.delete(&role, &Default::default()).await;
    metrics.abort();
    stack_controller.abort();
    server.abort();
    controller.abort();
}

/// The stall of a Stack read as a dynamic object: `(reason, message)` when `Stalled` is True (a Stack
/// that does not decode as `Stack` cannot be read through the typed API).
async fn dynamic_stalled(stacks: &Api<kube::api::DynamicObject>, name: &str) -> Option<(String, String)> {
    let s = stacks.get(name).await.unwrap();
    let conditions = s.data["status"]["conditions"].as_array().cloned().unwrap_or_default();
    conditions.iter().find(|c| c["type"] == "Stalled" && c["status"] == "True").map(|c| {
        (c["reason"].as_str().unwrap_or_default().to_string(), c["message"].as_str().unwrap_or_default().to_string())
    })
}

/// Two specs PKO's schema admits that cannot run, each Stalled `SpecInvalid` naming the field with a
/// Warning `StackConfigInvalid`, no Workspace made, and the Stacks beside them reconciled as usual:
/// - git fields without `projectRepo` (PKO's `NewGitSource`: `missing "projectRepo"`), while a Stack
///   with no source field at all is source-less as before (its Workspace is made);
/// - a value the Stack's type cannot hold (`parallel` beyond int32, which the API server does not
///   enforce): the Stack decodes in no cache, yet it is reported, and the list it is in still syncs;
///   mending it clears the stall.
#[tokio::test]
async fn specs_that_cannot_run_stall_naming_the_field_and_the_others_reconcile() {
    let (client, ns, _env) = setup("hostile-spec").await;
    let task = start_stack_controller(&client, ns.name());
    let stacks = ns.api::<Stack>();
    let workspaces = ns.api::<pko_api::Workspace>();
    let resource = kube::api::ApiResource::erase::<Stack>(&());
    let dynamic: Api<kube::api::DynamicObject> = Api::namespaced_with(client.clone(), ns.name(), &resource);
    let too_big =
        stack("too-big", json!({"stack": "dev", "updateTemplate": {"spec": {"parallel": 99_999_999_999_i64}}}));
    dynamic.create(&PostParams::default(), &serde_json::from_value(too_big).unwrap()).await.unwrap();
    create(&stacks, stack("no-repo", json!({"stack": "dev", "branch": "main", "repoDir": "infra"}))).await;
    create(&stacks, stack("source-less", json!({"stack": "dev"}))).await;

    let (reason, message) = wait_stalled(&stacks, "no-repo").await;
    assert_eq!((reason.as_str(), message.as_str()), ("SpecInvalid", r#"missing "projectRepo""#));
    let (reason, message) =
        poll("too-big is Stalled", 60, || async { dynamic_stalled(&dynamic, "too-big").await }).await;
    assert_eq!(reason, "SpecInvalid", "{message}");
    assert!(message.contains("spec.updateTemplate.spec.parallel"), "the field is named: {message}");
    eventually("the source-less Stack's Workspace is made", 60, || async {
        workspaces.get_opt("source-less").await.unwrap().is_some()
    })
    .await;
    for name in ["no-repo", "too-big"] {
        assert!(workspaces.get_opt(name).await.unwrap().is_none(), "{name}: no Workspace for a spec that cannot run");
    }
    eventually("a Warning StackConfigInvalid for each", 30, || async {
        let events = ns.api::<k8s_openapi::api::events::v1::Event>().list(&Default::default()).await.unwrap();
        let warned = |name: &str| {
            events.items.iter().any(|e| {
                e.reason.as_deref() == Some("StackConfigInvalid")
                    && e.type_.as_deref() == Some("Warning")
                    && e.regarding.as_ref().and_then(|r| r.name.as_deref()) == Some(name)
            })
        };
        warned("no-repo") && warned("too-big")
    })
    .await;
    let writes = writes_during(&stacks, "no-repo", 3).await;
    assert!(writes <= 1, "no-repo was written {writes} times in 3 s");

    let mend = json!({"spec": {"updateTemplate": {"spec": {"parallel": 2}}}});
    stacks.patch("too-big", &kube::api::PatchParams::default(), &kube::api::Patch::Merge(&mend)).await.unwrap();
    eventually("the mended Stack is reconciled", 60, || async {
        stalled(&stacks.get("too-big").await.unwrap()).is_none()
            && workspaces.get_opt("too-big").await.unwrap().is_some()
    })
    .await;
    task.abort();
}
