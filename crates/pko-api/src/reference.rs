//! Generates `docs/api.md`, the API reference, from the CRD schemas (whose descriptions are the rustdoc of the types).
//! `pko-operator api-docs` prints it; a test fails when the committed file differs.

use std::fmt::Write;

use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::{
    CustomResourceDefinition, CustomResourceDefinitionVersion,
};
use serde_json::Value;

use crate::constants::{self, stack_condition as sc, update_condition as uc, workspace_condition as wc};

/// Subtrees documented by reference rather than field by field: Kubernetes' own types and the templates (same types as
/// the Workspace and Update specs).
const BY_REFERENCE: &[(&str, &str)] = &[
    (".env", "Kubernetes `[]EnvVar`"),
    (".envFrom", "Kubernetes `[]EnvFromSource`"),
    (".resources", "Kubernetes `ResourceRequirements`"),
    (".podTemplate.spec", "Kubernetes `PodSpec`"),
    (".conditions", "Kubernetes `[]metav1.Condition` (listType map, key `type`)"),
    ("spec.workspaceTemplate.spec", "the Workspace spec (see Workspace)"),
    ("spec.updateTemplate.spec", "the Update spec (see Update)"),
];

fn by_reference(path: &str, node: &Value) -> Option<&'static str> {
    let list = node.get("type").and_then(Value::as_str) == Some("array");
    BY_REFERENCE
        .iter()
        .find(|(s, _)| match *s {
            ".env" | ".envFrom" | ".conditions" => list && path.ends_with(s),
            s if s.starts_with('.') => path.ends_with(s),
            s => path == s,
        })
        .map(|(_, note)| *note)
}

fn type_of(node: &Value) -> String {
    if node.get("x-kubernetes-preserve-unknown-fields") == Some(&Value::Bool(true)) && node.get("type").is_none() {
        return "any JSON".into();
    }
    if node.get("x-kubernetes-int-or-string") == Some(&Value::Bool(true)) {
        return "int or string".into();
    }
    match node.get("type").and_then(Value::as_str) {
        Some("array") => format!("[]{}", node.get("items").map(type_of).unwrap_or_default()),
        Some("object") if node.get("additionalProperties").is_some_and(Value::is_object) => {
            format!("map[string]{}", type_of(&node["additionalProperties"]))
        }
        Some(t) => {
            let mut t = t.to_string();
            if let Some(f) = node.get("format").and_then(Value::as_str) {
                write!(t, " ({f})").unwrap();
            }
            t
        }
        None => "any JSON".into(),
    }
}

fn notes(node: &Value) -> String {
    let mut n = Vec::new();
    if let Some(e) = node.get("enum").and_then(Value::as_array) {
        n.push(format!(
            "one of {}",
            e.iter().map(|v| format!("`{}`", v.as_str().unwrap_or_default())).collect::<Vec<_>>().join(", ")
        ));
    }
    if let Some(d) = node.get("default") {
        n.push(format!("default `{d}`"));
    }
    if let Some(m) = node.get("minimum") {
        n.push(format!("≥ {m}"));
    }
    if node.get("pattern").and_then(Value::as_str) == Some(crate::duration::GO_DURATION_PATTERN) {
        n.push("a Go duration (e.g. `90s`, `1h30m`, `-5m`)".into());
    }
    if let Some(m) = node.get("minLength") {
        n.push(format!("min length {m}"));
    }
    for r in node.get("x-kubernetes-validations").and_then(Value::as_array).into_iter().flatten() {
        n.push(format!("rule: {}", r["message"].as_str().unwrap_or_default()));
    }
    n.join("; ")
}

fn cell(s: &str) -> String {
    s.replace('|', "\\|").replace('\n', " ")
}

fn walk(node: &Value, path: &str, required: bool, out: &mut String) {
    if !path.is_empty() {
        let desc = node.get("description").and_then(Value::as_str).unwrap_or_default();
        let mut extra = notes(node);
        if let Some(r) = by_reference(path, node) {
            extra = if extra.is_empty() { format!("see {r}") } else { format!("{extra}; see {r}") };
        }
        writeln!(
            out,
            "| `{path}` | {} | {} | {} | {} |",
            cell(&type_of(node)),
            if required { "yes" } else { "" },
            cell(desc),
            cell(&extra)
        )
        .unwrap();
        if by_reference(path, node).is_some() {
            return;
        }
    }
    let req: Vec<&str> =
        node.get("required").and_then(Value::as_array).into_iter().flatten().filter_map(Value::as_str).collect();
    if let Some(props) = node.get("properties").and_then(Value::as_object) {
        for (k, v) in props {
            if path.is_empty() && (k == "apiVersion" || k == "kind" || k == "metadata") {
                continue;
            }
            let p = if path.is_empty() { k.clone() } else { format!("{path}.{k}") };
            walk(v, &p, req.contains(&k.as_str()), out);
        }
    }
    if let Some(ap) = node.get("additionalProperties").filter(|v| v.is_object()) {
        walk(ap, &format!("{path}.<key>"), false, out);
    }
    if let Some(items) = node.get("items") {
        walk(items, &format!("{path}[]"), false, out);
    }
}

/// The API reference as Markdown.
pub fn api_reference_markdown() -> String {
    let mut out = String::new();
    let crds = crate::crds();
    intro(&mut out, &crds);
    conditions(&mut out);
    metadata(&mut out);
    for crd in &crds {
        for v in &crd.spec.versions {
            schema(&mut out, crd, v);
        }
    }
    out
}

/// What the reference covers, and the kinds with their printer columns.
fn intro(out: &mut String, crds: &[CustomResourceDefinition]) {
    out.push_str("# API reference\n\n<!-- Generated by `pko-operator api-docs` (make docs); do not edit. -->\n\n");
    out.push_str("For everyone writing manifests: every field of every kind, its default and its PKO source.\n\n");
    out.push_str(
        "The operator serves the Pulumi Kubernetes Operator v2 API unchanged: users apply their PKO v2 manifests \
         as they are. Field names, defaults, condition types and reasons, printer columns, finalizers, labels and \
         annotations follow PKO v2.9. Descriptions below come from the Rust types (`crates/pko-api`). Fields \
         marked *extension* are our additions; there are none yet.\n\n",
    );
    out.push_str("| kind | apiVersion | printer columns |\n|---|---|---|\n");
    for crd in crds {
        for v in &crd.spec.versions {
            let cols: Vec<String> = v
                .additional_printer_columns
                .iter()
                .flatten()
                .map(|c| if c.priority.unwrap_or(0) > 0 { format!("{} (wide)", c.name) } else { c.name.clone() })
                .collect();
            let dep = if v.deprecated == Some(true) { " (deprecated)" } else { "" };
            let (kind, group) = (&crd.spec.names.kind, &crd.spec.group);
            writeln!(out, "| {kind} | `{group}/{}`{dep} | {} |", v.name, cols.join(", ")).unwrap();
        }
    }
    out.push_str(
        "\nAll kinds are namespaced, have a status subresource and belong to the category `pulumi` \
         (`kubectl get pulumi`).\n\n",
    );
}

/// The condition types and reasons of each kind.
fn conditions(out: &mut String) {
    out.push_str("## Conditions\n\n");
    stack_conditions(out);
    workspace_conditions(out);
    update_conditions(out);
}

/// The Stack's conditions and reasons (PKO's kstatus protocol).
fn stack_conditions(out: &mut String) {
    let stack = [
        sc::READY,
        sc::PROCESSING_COMPLETED,
        sc::NOT_READY_IN_PROGRESS,
        sc::NOT_READY_STALLED,
        sc::RECONCILING,
        sc::STACK_PROCESSING,
        sc::RETRYING_AFTER_FAILURE,
        sc::PREVIEW_FAILED,
        sc::PREREQUISITE_NOT_SATISFIED,
        sc::STALLED,
        sc::SPEC_INVALID,
        sc::SOURCE_UNAVAILABLE,
        sc::PULUMI_VERSION_TOO_LOW,
        sc::WORKSPACE_FAILED,
        sc::UPDATE_FAILED,
    ];
    let [r, pc, nip, nis, rec, sp, raf, pf, pns, st, si, su, pvtl, wf, uf] = stack;
    writeln!(
        out,
        "- **Stack** (kstatus ready protocol): `{r}` True reason `{pc}`; False with `{nip}` or `{nis}`, always \
         together with exactly one of `{rec}`=True (reasons `{sp}`, `{raf}`, `{pf}`, `{pns}`) or `{st}`=True \
         (reasons `{si}`, `{su}`, `{pvtl}`, `{wf}`, `{uf}` after {} failures, `{}`, `{}`). Ours also: \
         `{rec}` `{}` (a saved plan waits for its approval) and `{}` (a StackRollout holds a new revision).",
        sc::MAX_UPDATE_FAILURES,
        sc::NAMESPACE_TERMINATING,
        sc::UPDATE_CONFLICT,
        sc::AWAITING_APPROVAL,
        sc::ROLLOUT_HELD
    )
    .unwrap();
}

/// The Workspace's conditions and reasons.
fn workspace_conditions(out: &mut String) {
    let [r, s, d, ru, wr, cf, ns, st, inf, inif, ic, si, ing, init] = [
        wc::READY,
        wc::SUCCEEDED,
        wc::DELETING,
        wc::ROLLING_UPDATE,
        wc::WAITING_FOR_REPLICAS,
        wc::CONNECTION_FAILED,
        wc::NO_SOURCE,
        wc::STALLED,
        wc::INSTALLATION_FAILED,
        wc::INITIALIZATION_FAILED,
        wc::INCOMPATIBLE_CONFIGURATION,
        wc::SPEC_INVALID,
        wc::INSTALLING,
        wc::INITIALIZING,
    ];
    writeln!(
        out,
        "- **Workspace**: `{r}` with reasons `{s}`, `{d}`, `{ru}`, `{wr}`, `{cf}`, `{ns}` (ours: no source, and a \
         runtime without workspace pods), and False with the stall's reason while `{st}`=True: `{inf}`, `{inif}`, \
         `{ic}` (the initialization before the Workspace is first Ready, or an operation, could not prepare it; \
         no Update is made against it, and an initialization tried again every minute clears it) or `{si}` (a \
         field holds a value this version cannot run; a new spec clears it). PKO's transient `{ing}` is not \
         written (`pulumi install` runs inside the initialization); `{init}` while an initialization cannot run yet."
    )
    .unwrap();
}

/// The Update's conditions and reasons.
fn update_conditions(out: &mut String) {
    let [p, c, f, uf, u, ca, conf, iat, rf, wnf, wnr, tf, ab] = [
        uc::PROGRESSING,
        uc::COMPLETE,
        uc::FAILED,
        uc::UPDATE_FAILED,
        uc::UNKNOWN,
        uc::CANCELED,
        uc::UPDATE_CONFLICT,
        uc::INVALID_ACCESS_TOKEN,
        uc::REASON_FAILED,
        uc::WORKSPACE_NOT_FOUND,
        uc::WORKSPACE_NOT_READY,
        uc::TRANSIENT_FAILURE,
        uc::ABORTED,
    ];
    writeln!(
        out,
        "- **Update**: `{p}`, `{c}`, `{f}`; failure reasons `{uf}`, `{u}`, `{ca}`, `{conf}`, `{iat}`, `{rf}`; \
         transient `{wnf}`, `{wnr}`, `{tf}`. (PKO marks an update found Progressing after a restart `{ab}`; this \
         operator re-attaches to it instead. An Update never started that has no controller owner — created by \
         hand without an `ownerReference` with `controller: true` — is `Failed` `Canceled` and never runs, as in \
         PKO.)\n"
    )
    .unwrap();
}

/// The finalizer, annotations and labels of generated objects, and validation beyond the schema.
fn metadata(out: &mut String) {
    out.push_str("## Finalizers, annotations, labels\n\n");
    writeln!(out, "- finalizer `{}` on Stacks and on the Updates they create;", constants::STACK_FINALIZER).unwrap();
    writeln!(
        out,
        "- annotation `{}`: any new value requests a sync; echoed to `status.observedReconcileRequest`;",
        constants::RECONCILE_REQUEST_ANNOTATION
    )
    .unwrap();
    writeln!(
        out,
        "- annotation `{}` (ours): the id of the Stack's pending plan approves it (`spec.approval.mode: manual`);",
        crate::approval::APPROVE_PLAN_ANNOTATION
    )
    .unwrap();
    writeln!(
        out,
        "- annotations `{}` and `{}` (ours) on StackRollouts: a new value aborts the rollout of the current \
         revision, or resumes a halted one;",
        crate::rollout::ROLLOUT_ABORT_ANNOTATION,
        crate::rollout::ROLLOUT_RESUME_ANNOTATION
    )
    .unwrap();
    writeln!(
        out,
        "- annotation `{}` on `<update>-stack-outputs` Secrets: JSON list of secret output names;",
        constants::SECRET_OUTPUTS_ANNOTATION
    )
    .unwrap();
    writeln!(
        out,
        "- labels `{}`, `{}`, `{}`, `{}`, `{}` on generated objects;",
        constants::STACK_COMPONENT_LABEL,
        constants::STACK_NAME_LABEL,
        constants::AUTO_COMPONENT_LABEL,
        constants::WORKSPACE_NAME_LABEL,
        constants::UPDATE_NAME_LABEL
    )
    .unwrap();
    writeln!(out, "- secret outputs appear in `Stack.status.outputs` as `{}`.\n", constants::SECRET_MASK).unwrap();
    out.push_str(
        "Validation the API server cannot express (cross-namespace Secret references, the v1-only `Env`/`FS` \
         reference types) is done by the Stack controller, which reports it as `Stalled` `SpecInvalid` naming the \
         field.\n",
    );
}

/// The field table of version `v` of `crd`.
fn schema(out: &mut String, crd: &CustomResourceDefinition, v: &CustomResourceDefinitionVersion) {
    let schema = serde_json::to_value(&v.schema).unwrap();
    let root = &schema["openAPIV3Schema"];
    writeln!(out, "\n## {} `{}/{}`\n", crd.spec.names.kind, crd.spec.group, v.name).unwrap();
    if let Some(d) = root.get("description").and_then(Value::as_str) {
        writeln!(out, "{d}\n").unwrap();
    }
    for r in root.get("x-kubernetes-validations").and_then(Value::as_array).into_iter().flatten() {
        writeln!(out, "Rule on the object: {}\n", r["message"].as_str().unwrap_or_default()).unwrap();
    }
    let table = "| field | type | required | description | notes |\n|---|---|---|---|---|\n";
    if crd.spec.names.kind == "Stack" && v.name == "v1alpha1" {
        out.push_str("Same spec as `pulumi.com/v1`; status fields:\n\n");
        out.push_str(table);
        walk(&root["properties"]["status"], "status", false, out);
        return;
    }
    out.push_str(table);
    walk(root, "", false, out);
}
