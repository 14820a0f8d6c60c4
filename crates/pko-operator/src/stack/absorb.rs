//! Absorbing a finished Update into the Stack's status (PKO `stack_controller.go`, the completed-update branch): the
//! new `lastUpdate` (state, commits, failure count) and what follows from it. Pure.

use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use kube::ResourceExt;
use pko_api::Update;
use pko_api::constants::update_condition as uc;
use pko_api::stack::{CurrentStackUpdate, StackUpdateState, StackUpdateStateMessage};
use pko_api::workspace::ProjectInfo;

/// What a finished Update means for its Stack.
#[derive(Debug, Clone, PartialEq)]
pub struct Absorbed {
    /// The new `status.lastUpdate`.
    pub last_update: StackUpdateState,
    /// The operation succeeded.
    pub succeeded: bool,
    /// It failed because another update held the stack lock (`UpdateConflict`).
    pub conflict: bool,
    /// Project name and runtime to cache (success only).
    pub project_info: Option<ProjectInfo>,
    /// The outputs Secret to read into `status.outputs` (success only).
    pub outputs_secret: Option<String>,
    /// The Update's message (the error on failure).
    pub message: String,
    /// Why an Update that says it succeeded is not taken as a success ([`verify_run`]).
    pub mismatch: Option<String>,
}

/// Whether `update`, finished, ran what it was made for as the Stack's `current` update: made for the same Stack
/// generation (`spec.stackGeneration`), and — when it succeeded — with the run digest it names (`status.runDigest`
/// equal to `spec.runDigest`: the agent checked and ran that request). An Update that names neither (made by an earlier
/// version) is taken as it is. `Err`: why not. Pure.
pub fn verify_run(update: &Update, current: &CurrentStackUpdate) -> Result<(), String> {
    if let (Some(made), Some(want)) = (update.spec.stack_generation, current.generation)
        && made != want
    {
        return Err(format!("the Update was made for generation {made} of the Stack, not {want}"));
    }
    let Some(expected) = update.spec.run_digest.as_deref().filter(|_| update.succeeded()) else { return Ok(()) };
    match update.status.as_ref().and_then(|s| s.run_digest.as_deref()) {
        Some(ran) if ran == expected => Ok(()),
        ran => Err(format!(
            "the Update reported success but did not run what it was made for: its agent ran {}, the Update names \
                {expected}",
            ran.unwrap_or("an unrecorded request")
        )),
    }
}

/// The finished `update` that `current` pointed at, against the previous `lastUpdate` `prev`, at `now`: failures count
/// while the same generation and reconcile request keep failing (PKO), a success resets the count and moves
/// `lastSuccessfulCommit`, and a backend-lock conflict backs off like a failure but never reaches `maxUpdateFailures`,
/// so the Stack retries until the holder is gone.
pub fn absorb(
    prev: Option<&StackUpdateState>,
    current: &CurrentStackUpdate,
    update: &Update,
    now: &Time,
    max_failures: i64,
) -> Absorbed {
    let mismatch = verify_run(update, current).err();
    let ok = update.succeeded() && mismatch.is_none();
    // not the program's failure: backs off like one, never reaches the stall count
    let conflict = update.failed_reason() == Some(uc::UPDATE_CONFLICT);
    let not_programs = conflict || mismatch.is_some() || update.failed_reason() == Some(uc::RUN_MISMATCH);
    let prev = prev.cloned().unwrap_or_default();
    let same_request = prev.generation == current.generation
        && prev.reconcile_request == current.reconcile_request
        && prev.state == Some(StackUpdateStateMessage::Failed);
    let us = update.status.clone().unwrap_or_default();
    let failures = if ok {
        0
    } else if same_request {
        prev.failures.unwrap_or(0) + 1
    } else {
        0
    };
    let failures = if not_programs { failures.min(max_failures - 1) } else { failures };
    Absorbed {
        last_update: StackUpdateState {
            generation: current.generation,
            reconcile_request: current.reconcile_request.clone(),
            name: update.metadata.name.clone(),
            update_type: update.spec.update_type.clone(),
            state: Some(if ok { StackUpdateStateMessage::Succeeded } else { StackUpdateStateMessage::Failed }),
            // PKO leaves the message of a success empty
            message: if ok { None } else { mismatch.clone().or_else(|| us.message.clone()) },
            last_attempted_commit: current.commit.clone(),
            last_successful_commit: if ok { current.commit.clone() } else { prev.last_successful_commit.clone() },
            permalink: us.permalink.clone(),
            last_resync_time: Some(now.clone()),
            failures: Some(failures),
            change_summary: us.change_summary.clone(),
            // canceled on request: the Stack waits for a change instead of retrying
            cancel_request: (update.failed_reason() == Some(uc::CANCELED))
                .then(|| update.annotations().get(pko_api::constants::CANCEL_REQUEST_ANNOTATION).cloned())
                .flatten(),
            run_digest: us.run_digest.clone(),
        },
        succeeded: ok,
        conflict,
        project_info: if ok { us.project_info.clone() } else { None },
        outputs_secret: if ok { us.outputs.clone() } else { None },
        message: mismatch.clone().or(us.message).unwrap_or_default(),
        mismatch,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use pko_api::constants::stack_condition::MAX_UPDATE_FAILURES;
    use pko_api::update::UpdateStatus;

    fn t(s: i64) -> Time {
        Time(k8s_openapi::jiff::Timestamp::from_second(s).unwrap())
    }

    fn finished(name: &str, ok: bool, reason: &str) -> Update {
        let mut u = Update::new(name, Default::default());
        let mut conds = Vec::new();
        pko_api::conditions::set(&mut conds, uc::COMPLETE, "True", uc::UPDATED, "", None, &t(0));
        pko_api::conditions::set(&mut conds, uc::FAILED, if ok { "False" } else { "True" }, reason, "", None, &t(0));
        u.status = Some(UpdateStatus {
            conditions: Some(conds),
            message: Some(if ok { "update succeeded" } else { "boom" }.into()),
            outputs: ok.then(|| format!("{name}-stack-outputs")),
            project_info: Some(ProjectInfo { name: Some("p".into()), runtime: Some("yaml".into()) }),
            change_summary: Some([("create".to_string(), 2), ("same".to_string(), 1)].into()),
            ..Default::default()
        });
        u
    }

    fn current(generation: i64, commit: &str) -> CurrentStackUpdate {
        CurrentStackUpdate {
            generation: Some(generation),
            reconcile_request: None,
            name: Some("u".into()),
            commit: Some(commit.into()),
        }
    }

    #[test]
    fn a_success_records_the_commit_outputs_and_project() {
        let a =
            absorb(None, &current(2, "abc"), &finished("u", true, uc::UPDATE_SUCCEEDED), &t(9), MAX_UPDATE_FAILURES);
        assert!(a.succeeded && !a.conflict);
        assert_eq!(a.last_update.state, Some(StackUpdateStateMessage::Succeeded));
        assert_eq!((a.last_update.last_successful_commit.as_deref(), a.last_update.failures), (Some("abc"), Some(0)));
        assert_eq!(a.outputs_secret.as_deref(), Some("u-stack-outputs"));
        assert_eq!(a.project_info.and_then(|p| p.name).as_deref(), Some("p"));
        assert_eq!(a.last_update.last_resync_time, Some(t(9)));
        assert_eq!(
            a.last_update.change_summary,
            Some([("create".to_string(), 2), ("same".to_string(), 1)].into()),
            "the resource change counts"
        );
    }

    #[test]
    fn failures_count_only_for_the_same_request() {
        let first =
            absorb(None, &current(2, "abc"), &finished("u1", false, uc::UPDATE_FAILED), &t(1), MAX_UPDATE_FAILURES);
        assert_eq!((first.last_update.failures, first.outputs_secret.clone()), (Some(0), None));
        let prev = StackUpdateState { last_successful_commit: Some("old".into()), ..first.last_update.clone() };
        let second = absorb(
            Some(&prev),
            &current(2, "abc"),
            &finished("u2", false, uc::UPDATE_CONFLICT),
            &t(2),
            MAX_UPDATE_FAILURES,
        );
        assert_eq!(second.last_update.failures, Some(1));
        assert!(second.conflict);
        assert_eq!(
            second.last_update.last_successful_commit.as_deref(),
            Some("old"),
            "a failure keeps the last success"
        );
        let new_generation = absorb(
            Some(&second.last_update),
            &current(3, "def"),
            &finished("u3", false, uc::UPDATE_FAILED),
            &t(3),
            MAX_UPDATE_FAILURES,
        );
        assert_eq!(new_generation.last_update.failures, Some(0), "a new generation starts counting again");
    }

    #[test]
    fn a_success_counts_only_with_the_digest_and_generation_it_was_made_for() {
        let made = |generation: i64, digest: Option<&str>, ran: Option<&str>| {
            let mut u = finished("u", true, uc::UPDATE_SUCCEEDED);
            u.spec.stack_generation = Some(generation);
            u.spec.run_digest = digest.map(str::to_string);
            u.status.as_mut().unwrap().run_digest = ran.map(str::to_string);
            u
        };
        let a = absorb(
            None,
            &current(2, "abc"),
            &made(2, Some("sha256:aa"), Some("sha256:aa")),
            &t(1),
            MAX_UPDATE_FAILURES,
        );
        assert!(a.succeeded && a.mismatch.is_none());
        assert_eq!(a.last_update.run_digest.as_deref(), Some("sha256:aa"), "what ran, on the Stack");
        let stale = absorb(
            None,
            &current(2, "abc"),
            &made(2, Some("sha256:aa"), Some("sha256:bb")),
            &t(1),
            MAX_UPDATE_FAILURES,
        );
        assert!(!stale.succeeded, "another request ran: never a success");
        assert_eq!(stale.last_update.state, Some(StackUpdateStateMessage::Failed));
        assert!(stale.outputs_secret.is_none(), "its outputs are not taken");
        assert!(stale.message.contains("sha256:bb") && stale.message.contains("sha256:aa"), "{}", stale.message);
        assert!(
            !absorb(None, &current(2, "abc"), &made(2, Some("sha256:aa"), None), &t(1), MAX_UPDATE_FAILURES).succeeded,
            "an agent that recorded nothing"
        );
        let other_generation = absorb(
            None,
            &current(3, "abc"),
            &made(2, Some("sha256:aa"), Some("sha256:aa")),
            &t(1),
            MAX_UPDATE_FAILURES,
        );
        assert!(
            !other_generation.succeeded && other_generation.message.contains("generation 2"),
            "{}",
            other_generation.message
        );
        assert!(
            absorb(None, &current(2, "abc"), &made(2, None, None), &t(1), MAX_UPDATE_FAILURES).succeeded,
            "an Update that names no digest (an earlier version's)"
        );
        let mut last = stale.last_update;
        for i in 0..10 {
            last = absorb(
                Some(&last),
                &current(2, "abc"),
                &made(2, Some("sha256:aa"), Some("sha256:bb")),
                &t(i),
                MAX_UPDATE_FAILURES,
            )
            .last_update;
        }
        assert!(last.failures < Some(MAX_UPDATE_FAILURES), "a mismatch backs off, never stalls the Stack");
    }

    #[test]
    fn conflicts_back_off_but_never_reach_the_stall_count() {
        let mut last =
            absorb(None, &current(2, "abc"), &finished("u0", false, uc::UPDATE_CONFLICT), &t(0), MAX_UPDATE_FAILURES)
                .last_update;
        for i in 1..10 {
            last = absorb(
                Some(&last),
                &current(2, "abc"),
                &finished(&format!("u{i}"), false, uc::UPDATE_CONFLICT),
                &t(i),
                MAX_UPDATE_FAILURES,
            )
            .last_update;
            assert!(last.failures.unwrap() < MAX_UPDATE_FAILURES, "conflict {i}: {:?}", last.failures);
        }
        assert_eq!(last.failures, Some(MAX_UPDATE_FAILURES - 1), "the longest back-off short of stalling");
        let failed = absorb(
            Some(&last),
            &current(2, "abc"),
            &finished("u", false, uc::UPDATE_FAILED),
            &t(20),
            MAX_UPDATE_FAILURES,
        )
        .last_update;
        assert_eq!(failed.failures, Some(MAX_UPDATE_FAILURES), "a real failure after them stalls");
    }
}
