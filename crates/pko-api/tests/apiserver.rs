//! The CRDs against the real API server of the test bed: the valid corpus is accepted and read back
//! unchanged (also through the Rust types), the invalid corpus is rejected with the expected message, and
//! `kubectl get` shows PKO's printer columns.

mod common;

use kube::Client;
use kube::api::{Api, ApiResource, DynamicObject, GroupVersionKind, Patch, PatchParams, PostParams};
use pko_testbed::testbed;
use serde_json::{Value, json};

async fn install_crds(client: &Client) {
    pko_testbed::install_crds(client, pko_api::crds()).await.unwrap();
}

fn api_for(client: &Client, ns: &str, v: &Value) -> Api<DynamicObject> {
    let (group, version, kind) = common::gvk(v);
    let ar = ApiResource::from_gvk(&GroupVersionKind::gvk(&group, &version, &kind));
    Api::namespaced_with(client.clone(), ns, &ar)
}

/// The body of an object of ours: everything but metadata, apiVersion and kind.
fn body(v: &Value) -> Value {
    let mut m = v.as_object().cloned().unwrap_or_default();
    m.remove("metadata");
    m.remove("apiVersion");
    m.remove("kind");
    Value::Object(m)
}

#[tokio::test]
async fn valid_corpus_is_accepted_and_read_back_unchanged() {
    let bed = testbed();
    let client = bed.client().await.unwrap();
    install_crds(&client).await;
    let ns = bed.namespace("api-valid").await.unwrap();
    let docs = common::valid();
    let mut checked = 0;
    for d in &docs {
        let api = api_for(&client, ns.name(), &d.value);
        let mut obj = d.value.clone();
        let status = obj.as_object_mut().unwrap().remove("status");
        let name = obj["metadata"]["name"].as_str().unwrap().to_string();
        let created: DynamicObject = serde_json::from_value(obj).unwrap();
        api.create(&PostParams::default(), &created)
            .await
            .unwrap_or_else(|e| panic!("{} {name}: {e}", d.file.display()));
        if let Some(status) = status {
            api.patch_status(&name, &PatchParams::default(), &Patch::Merge(json!({ "status": status })))
                .await
                .unwrap_or_else(|e| panic!("{} {name} status: {e}", d.file.display()));
        }
        if !common::is_ours(&d.value) {
            continue;
        }
        let back = serde_json::to_value(api.get(&name).await.unwrap()).unwrap();
        assert_eq!(body(&back), body(&d.value), "{} {name}: the API server changed the object", d.file.display());

        // The same object through the Rust types: read, write back unchanged (replace), read again.
        let (_, version, kind) = common::gvk(&d.value);
        let typed = match (kind.as_str(), version.as_str()) {
            ("Stack", "v1") => serde_json::to_value(ns.api::<pko_api::Stack>().get(&name).await.unwrap()).unwrap(),
            ("Stack", _) => {
                serde_json::to_value(ns.api::<pko_api::stack::v1alpha1::Stack>().get(&name).await.unwrap()).unwrap()
            }
            ("Program", _) => serde_json::to_value(ns.api::<pko_api::Program>().get(&name).await.unwrap()).unwrap(),
            ("Workspace", _) => serde_json::to_value(ns.api::<pko_api::Workspace>().get(&name).await.unwrap()).unwrap(),
            ("Update", _) => serde_json::to_value(ns.api::<pko_api::Update>().get(&name).await.unwrap()).unwrap(),
            ("StackRollout", _) => {
                serde_json::to_value(ns.api::<pko_api::StackRollout>().get(&name).await.unwrap()).unwrap()
            }
            ("Receiver", _) => serde_json::to_value(ns.api::<pko_api::Receiver>().get(&name).await.unwrap()).unwrap(),
            other => panic!("unexpected {other:?}"),
        };
        assert_eq!(body(&typed), body(&d.value), "{} {name}: the Rust types lost or changed a field", d.file.display());
        let replaced: DynamicObject = serde_json::from_value(typed).unwrap();
        let after = serde_json::to_value(api.replace(&name, &PostParams::default(), &replaced).await.unwrap()).unwrap();
        assert_eq!(
            body(&after),
            body(&d.value),
            "{} {name}: writing the typed object back changed it",
            d.file.display()
        );
        checked += 1;
    }
    assert!(checked >= 10, "only {checked} objects checked");
}

#[tokio::test]
async fn invalid_corpus_is_rejected_naming_the_field() {
    let bed = testbed();
    let client = bed.client().await.unwrap();
    install_crds(&client).await;
    let ns = bed.namespace("api-invalid").await.unwrap();
    let docs = common::invalid();
    assert!(docs.len() >= 10, "the invalid corpus shrank to {}", docs.len());
    for d in &docs {
        let expect = d.expect.as_deref().unwrap_or_else(|| panic!("{} has no `# expect:` line", d.file.display()));
        let api = api_for(&client, ns.name(), &d.value);
        let obj: DynamicObject = serde_json::from_value(d.value.clone()).unwrap();
        match api.create(&PostParams::default(), &obj).await {
            Err(kube::Error::Api(status)) => {
                assert_eq!(status.code, 422, "{}: {status:?}", d.file.display());
                assert!(
                    status.message.contains(expect),
                    "{}: message does not contain {expect:?}:\n{}",
                    d.file.display(),
                    status.message
                );
            }
            other => panic!("{}: must be rejected, got {other:?}", d.file.display()),
        }
    }
}

#[tokio::test]
async fn kubectl_shows_pko_printer_columns() {
    let bed = testbed();
    let client = bed.client().await.unwrap();
    install_crds(&client).await;
    let ns = bed.namespace("api-columns").await.unwrap();
    for d in common::valid().iter().filter(|d| d.file.to_string_lossy().contains("all-fields")) {
        let api = api_for(&client, ns.name(), &d.value);
        let mut obj = d.value.clone();
        obj.as_object_mut().unwrap().remove("status");
        api.create(&PostParams::default(), &serde_json::from_value(obj).unwrap()).await.unwrap();
    }
    let run = |args: &[&str]| {
        let out = bed.kubectl().args(args).args(["-n", ns.name()]).output().unwrap();
        assert!(out.status.success(), "kubectl {args:?}: {}", String::from_utf8_lossy(&out.stderr));
        String::from_utf8(out.stdout).unwrap()
    };
    let headers = |text: &str| -> Vec<String> {
        text.lines()
            .filter(|l| l.starts_with("NAME"))
            .map(|l| l.split("  ").map(str::trim).filter(|s| !s.is_empty()).collect::<Vec<_>>().join("|"))
            .collect()
    };
    let out = run(&["get", "stacks,programs,workspaces,updates"]);
    let h = headers(&out);
    assert!(h.contains(&"NAME|LAST UPDATE|AGE|READY|RECONCILING|STALLED|PERMALINK".to_string()), "{out}");
    assert!(h.contains(&"NAME|AGE|URL".to_string()), "{out}");
    assert!(h.contains(&"NAME|IMAGE|READY|ADDRESS".to_string()), "{out}");
    assert!(h.contains(&"NAME|WORKSPACE|PROGRESSING|FAILED|COMPLETE|URL".to_string()), "{out}");
    assert!(out.contains("stack.pulumi.com/git-all-fields"), "{out}");
    let wide = headers(&run(&["get", "stacks,updates", "-o", "wide"]));
    assert!(
        wide.contains(&"NAME|STACK|LAST UPDATE|AGE|LAST COMMIT|READY|RECONCILING|STALLED|PERMALINK".to_string()),
        "{wide:?}"
    );
    assert!(
        wide.contains(&"NAME|WORKSPACE|TYPE|START TIME|END TIME|PROGRESSING|FAILED|COMPLETE|URL".to_string()),
        "{wide:?}"
    );
    // the category lists every kind
    let all = run(&["get", "pulumi", "-o", "name"]);
    for kind in ["stack.pulumi.com/", "program.pulumi.com/", "workspace.auto.pulumi.com/", "update.auto.pulumi.com/"] {
        assert!(all.contains(kind), "`kubectl get pulumi` misses {kind}: {all}");
    }
}

/// As PKO serves it, `pulumi.com/v1alpha1` is not marked deprecated: applying a v1alpha1 Stack prints
/// no warning (PKO manifests applied by GitOps tools stay quiet).
#[tokio::test]
async fn a_v1alpha1_stack_applies_without_a_deprecation_warning() {
    let bed = testbed();
    let client = bed.client().await.unwrap();
    install_crds(&client).await;
    let ns = bed.namespace("api-v1alpha1").await.unwrap();
    let file = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/valid/stack-v1alpha1.yaml");
    let out = bed.kubectl().args(["apply", "-n", ns.name(), "-f"]).arg(&file).output().unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{stderr}");
    assert!(!stderr.to_ascii_lowercase().contains("warning"), "no deprecation warning: {stderr}");
}
