//! `kubectl pko rollout status|pause|resume|abort <name>`: a StackRollout's state, and its controls, with the caller's
//! own rights (`patch` on `stackrollouts.pulumi.com`). `pause`/`resume` set `spec.paused`; `resume` also asks a halted
//! rollout to run its current step again (`pulumi.com/rollout-resume`); `abort` holds every Stack not yet admitted
//! until the next revision (`pulumi.com/rollout-abort`).

use kube::api::ApiResource;

/// The annotation whose new value aborts the current revision's rollout.
pub const ABORT: &str = "pulumi.com/rollout-abort";
/// The annotation whose new value resumes a halted rollout.
pub const RESUME: &str = "pulumi.com/rollout-resume";

/// The StackRollout kind (`pulumi.com/v1alpha1`).
pub fn rollouts() -> ApiResource {
    ApiResource {
        group: "pulumi.com".into(),
        version: "v1alpha1".into(),
        api_version: "pulumi.com/v1alpha1".into(),
        kind: "StackRollout".into(),
        plural: "stackrollouts".into(),
    }
}

/// The merge patch of a control: `pause`, `resume` (with `value` as the resume request) or `abort` (with `value`).
/// `Err` for another verb. Pure.
pub fn control(verb: &str, value: &str) -> Result<serde_json::Value, String> {
    use serde_json::json;
    match verb {
        "pause" => Ok(json!({"spec": {"paused": true}})),
        "resume" => Ok(json!({"spec": {"paused": false}, "metadata": {"annotations": {RESUME: value}}})),
        "abort" => Ok(json!({"metadata": {"annotations": {ABORT: value}}})),
        other => Err(format!("unknown rollout verb {other:?}: status, pause, resume or abort")),
    }
}

/// A rollout (as JSON) in a few lines: phase, revision, current step, each step's record, the message. Pure.
pub fn describe(r: &serde_json::Value) -> String {
    let st = &r["status"];
    let s = |v: &serde_json::Value| v.as_str().unwrap_or("-").to_string();
    let steps = r["spec"]["steps"].as_array().map_or(0, Vec::len) + 1;
    let admitted = st["admitted"].as_array().map_or(0, Vec::len);
    let mut out = vec![
        format!("StackRollout: {}", s(&r["metadata"]["name"])),
        format!("Phase:        {}{}", s(&st["phase"]), if r["spec"]["paused"] == true { " (paused)" } else { "" }),
        format!("Revision:     {}", s(&st["revision"])),
        format!("Step:         {} of {steps}", st["step"].as_i64().unwrap_or(0) + 1),
        format!("Admitted:     {admitted} Stack(s)"),
    ];
    for (i, rec) in st["steps"].as_array().into_iter().flatten().enumerate() {
        let mut line = format!(
            "  step {}: {} Stack(s), {} failed, started {}, done {}",
            i + 1,
            rec["stacks"].as_i64().unwrap_or(0),
            rec["failed"].as_i64().unwrap_or(0),
            s(&rec["startedAt"]),
            s(&rec["doneAt"])
        );
        if let Some(h) = rec["halted"].as_str() {
            line.push_str(&format!(", HALTED: {h}"));
        }
        out.push(line);
    }
    if let Some(m) = st["message"].as_str() {
        out.push(format!("Message:      {m}"));
    }
    out.join("\n")
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn controls_patch_the_spec_or_an_annotation() {
        assert_eq!(control("pause", "t").unwrap(), json!({"spec": {"paused": true}}));
        assert_eq!(control("resume", "t").unwrap()["metadata"]["annotations"][RESUME], "t");
        assert_eq!(control("abort", "t").unwrap(), json!({"metadata": {"annotations": {ABORT: "t"}}}));
        assert!(control("skip", "t").is_err());
    }

    #[test]
    fn a_halted_rollout_is_described_step_by_step() {
        let r = json!({"metadata": {"name": "waves"}, "spec": {"steps": [{}, {}]},
            "status": {"phase": "Halted", "revision": "r2", "step": 1, "admitted": ["a", "b"],
                       "steps": [{"stacks": 1, "failed": 0, "startedAt": "t0", "doneAt": "t1"},
                                 {"stacks": 2, "failed": 1, "startedAt": "t1", "halted": "step 1: 1 failed"}],
                       "message": "halted: step 1: 1 failed"}});
        let text = describe(&r);
        assert!(text.contains("Phase:        Halted") && text.contains("Step:         2 of 3"), "{text}");
        assert!(
            text.contains("  step 2: 2 Stack(s), 1 failed, started t1, done -, HALTED: step 1: 1 failed"),
            "{text}"
        );
    }
}
