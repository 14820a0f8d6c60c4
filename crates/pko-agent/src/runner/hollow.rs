//! The hollow agent (`--hollow-agents-seconds`, kubemark-style, for control-plane load tests only — never a default,
//! never in a functional test): every operation succeeds after a delay without running Pulumi or reading its source,
//! unless its request asks for a simulated failure ([`hollow_failure`]).

use std::sync::Arc;
use std::sync::atomic::Ordering;

use pko_proto::v1::{
    ErrorInfo, ErrorReason, OperationRequest, OperationResult, OperationType, ResultStatus, operation_event::Event,
};

use super::{check_digest, verb};
use crate::operation::Operation;

/// The hollow agent's operation: waits `delay` (ending early, `INTERRUPTED` or `CANCELLED`, on shutdown or Cancel),
/// then succeeds with no outputs. Its log line and result message say it was simulated.
pub(super) async fn hollow(op: &Arc<Operation>, req: &OperationRequest, delay: std::time::Duration) {
    let start = crate::convert::now();
    let run_digest = pko_proto::digest::run_digest(req);
    if let Err(f) = check_digest(req, &run_digest) {
        let error = Some(ErrorInfo { reason: f.reason as i32, message: f.message.clone(), field: f.field });
        let result = OperationResult {
            status: ResultStatus::Failed as i32,
            message: f.message,
            error,
            run_digest,
            ..Default::default()
        };
        op.publish(Event::Result(result));
        return;
    }
    op.log("hollow agent: simulated operation, no Pulumi runs (load tests only)");
    let end = tokio::time::Instant::now() + delay;
    let fails = hollow_failure(req);
    let status = loop {
        if op.interrupted.load(Ordering::SeqCst) {
            break ResultStatus::Interrupted;
        }
        if op.cancelled.load(Ordering::SeqCst) {
            break ResultStatus::Cancelled;
        }
        let now = tokio::time::Instant::now();
        if now >= end {
            break if fails.is_some() { ResultStatus::Failed } else { ResultStatus::Succeeded };
        }
        tokio::time::sleep((end - now).min(std::time::Duration::from_millis(100))).await;
    };
    let message = match (status, &fails) {
        (ResultStatus::Succeeded, _) => format!("hollow agent: {} simulated", verb(req)),
        (ResultStatus::Failed, Some(why)) => why.clone(),
        _ => "hollow agent: simulated operation stopped".to_string(),
    };
    let error = (status != ResultStatus::Succeeded).then(|| ErrorInfo {
        reason: match status {
            ResultStatus::Interrupted => ErrorReason::Interrupted,
            ResultStatus::Failed => ErrorReason::UpdateFailed,
            _ => ErrorReason::Cancelled,
        } as i32,
        message: message.clone(),
        field: String::new(),
    });
    let end_time = Some(crate::convert::now());
    // a preview that saves a plan gets a stand-in plan of its own (never run: hollow agents run no up either)
    let saves = req.options.as_ref().is_some_and(|o| o.save_plan) && status == ResultStatus::Succeeded;
    let plan = if saves { format!("{{\"hollow\":true,\"operation\":{:?}}}", op.id).into_bytes() } else { Vec::new() };
    let result = OperationResult {
        status: status as i32,
        message,
        error,
        start_time: Some(start),
        end_time,
        run_digest,
        plan_id: if plan.is_empty() { String::new() } else { pko_proto::plan::id(&plan) },
        plan,
        ..Default::default()
    };
    tracing::info!(operation = %op.id, status = ?status, "operation finished (hollow)");
    op.publish(Event::Result(result));
}

/// Whether a hollow operation simulates a failing program (control-plane load tests of failure handling only, e.g. a
/// rollout's failure budget): its request's variable `PKO_HOLLOW_FAIL` (a literal) appears in its source — a git
/// revision, an artifact's URL (which names the Program's generation) or digest — so a Stack fails from a given
/// revision on. The failure's message, or `None`. Pure.
fn hollow_failure(req: &OperationRequest) -> Option<String> {
    use pko_proto::v1::{source, value_ref};
    let kind = OperationType::try_from(req.r#type).unwrap_or(OperationType::Unspecified);
    if kind == OperationType::Initialize {
        return None;
    }
    let pattern = req.env.iter().find(|e| e.name == "PKO_HOLLOW_FAIL").and_then(|e| match e.value.as_ref()?.kind {
        Some(value_ref::Kind::Literal(ref v)) if !v.is_empty() => Some(v.clone()),
        _ => None,
    })?;
    let source = match req.source.as_ref().and_then(|s| s.kind.as_ref())? {
        source::Kind::Git(g) => g.revision.clone(),
        source::Kind::Artifact(a) => format!("{} {}", a.url, a.digest),
        _ => return None,
    };
    source
        .contains(&pattern)
        .then(|| format!("hollow agent: simulated failure (PKO_HOLLOW_FAIL {pattern:?} in {source})"))
}

#[cfg(test)]
mod tests {
    use super::*;
    use pko_proto::v1::{ArtifactSource, EnvVar, Source, ValueRef, source, value_ref};

    #[test]
    fn a_hollow_operation_fails_only_from_the_source_its_request_names() {
        let req = |url: &str, fail: Option<&str>, kind: OperationType| OperationRequest {
            r#type: kind as i32,
            source: Some(Source {
                kind: Some(source::Kind::Artifact(ArtifactSource { url: url.into(), ..Default::default() })),
            }),
            env: fail
                .map(|f| EnvVar {
                    name: "PKO_HOLLOW_FAIL".into(),
                    value: Some(ValueRef { kind: Some(value_ref::Kind::Literal(f.into())), ..Default::default() }),
                    secret: false,
                })
                .into_iter()
                .collect(),
            ..Default::default()
        };
        let v2 = "http://op/programs/ns/prog/2/abc.tar.gz";
        assert!(hollow_failure(&req(v2, Some("/2/"), OperationType::Up)).is_some_and(|m| m.contains("simulated")));
        assert_eq!(
            hollow_failure(&req("http://op/programs/ns/prog/1/abc.tar.gz", Some("/2/"), OperationType::Up)),
            None
        );
        assert_eq!(hollow_failure(&req(v2, None, OperationType::Up)), None);
        assert_eq!(hollow_failure(&req(v2, Some("/2/"), OperationType::Initialize)), None, "initialization succeeds");
    }
}
