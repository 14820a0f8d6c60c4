//! Prerequisite Stacks (PKO `spec.prerequisites`, `stack_controller.go` step 8 of the inventory): before an update
//! runs, every named Stack of the namespace must exist, be in sync with its own spec (its `lastUpdate` is for its
//! current generation and reconcile request), have succeeded, and — when `requirement.succeededWithinDuration` is set
//! — have succeeded within that duration. A stale prerequisite gets the annotation
//! `pulumi.com/reconciliation-request: after-<its lastUpdate name>` so that it runs again; the dependent waits
//! (Reconciling `PrerequisiteNotSatisfied`) and is woken when a prerequisite changes. Pure: the caller fetches the
//! Stacks and passes the time.

use std::collections::BTreeMap;

use k8s_openapi::jiff::Timestamp;
use pko_api::Stack;
use pko_api::constants::RECONCILE_REQUEST_ANNOTATION;
use pko_api::stack::{PrerequisiteRef, StackUpdateStateMessage};

use super::plan::go_quote;

/// The outcome of checking a Stack's prerequisites.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Verdict {
    /// Every prerequisite is satisfied (or there are none).
    Satisfied,
    /// At least one is not.
    NotSatisfied {
        /// What is missing, one clause per unsatisfied prerequisite (`Reconciling` message).
        message: String,
        /// Prerequisites to annotate, as `(stack name, reconcile-request value)`, so they resync.
        resync: Vec<(String, String)>,
    },
}

/// Checks `prerequisites` against the Stacks found in the namespace (`found`, by name; a missing name is a missing
/// Stack) at time `now`.
pub fn check(prerequisites: &[PrerequisiteRef], found: &BTreeMap<String, Stack>, now: Timestamp) -> Verdict {
    let mut failed: Vec<(String, String)> = Vec::new();
    let mut resync = Vec::new();
    // PKO's texts (`stack_controller.go`), with ours in parentheses where they add detail
    let unsatisfied = |name: &str, why: &str| format!("prerequisite not satisfied for {}: {why}", go_quote(name));
    for p in prerequisites {
        let Some(s) = found.get(&p.name) else {
            failed.push((
                p.name.clone(),
                format!(
                    "unable to fetch prerequisite {}: stacks.pulumi.com {} not found",
                    go_quote(&p.name),
                    go_quote(&p.name)
                ),
            ));
            continue;
        };
        let Some(last) = s.status.as_ref().and_then(|st| st.last_update.as_ref()) else {
            failed.push((p.name.clone(), unsatisfied(&p.name, "prerequisite has not run to completion")));
            continue;
        };
        let request = s.metadata.annotations.as_ref().and_then(|a| a.get(RECONCILE_REQUEST_ANNOTATION)).cloned();
        if last.generation != s.metadata.generation
            || last.reconcile_request.clone().unwrap_or_default() != request.clone().unwrap_or_default()
        {
            failed.push((
                p.name.clone(),
                unsatisfied(&p.name, "prerequisite has not run to completion (not in sync with its spec yet)"),
            ));
            continue;
        }
        if last.state != Some(StackUpdateStateMessage::Succeeded) {
            failed.push((p.name.clone(), unsatisfied(&p.name, "prerequisite failed")));
            continue;
        }
        let within = p.requirement.as_ref().and_then(|r| r.succeeded_within_duration.as_deref());
        if let Some(d) = within {
            let Ok(limit) = pko_api::duration::parse_go_duration_or_zero(d) else {
                failed.push((
                    p.name.clone(),
                    unsatisfied(&p.name, &format!("succeededWithinDuration {d:?} is not a duration")),
                ));
                continue;
            };
            let age = last.last_resync_time.as_ref().map(|t| now.duration_since(t.0).unsigned_abs());
            if age.is_none_or(|a| a > limit) {
                failed.push((
                    p.name.clone(),
                    unsatisfied(
                        &p.name,
                        &format!("prerequisite is out of date (did not succeed within {d}; requested its resync)"),
                    ),
                ));
                let value = format!("after-{}", last.name.clone().unwrap_or_default());
                if request.as_deref() != Some(value.as_str()) {
                    resync.push((p.name.clone(), value));
                }
            }
        }
    }
    let message = match failed.as_slice() {
        [] => return Verdict::Satisfied,
        [(_, one)] => one.clone(),
        many => {
            let names: Vec<&str> = many.iter().map(|(n, _)| n.as_str()).collect();
            let details: Vec<&str> = many.iter().map(|(_, m)| m.as_str()).collect();
            format!("multiple prerequisites were not satisfied {} ({})", names.join(", "), details.join("; "))
        }
    };
    Verdict::NotSatisfied { message, resync }
}

/// Whether `stack` is in `namespace` and names `prerequisite` among its prerequisites: a dependent to look at again
/// when that Stack changes (tested on each Stack of the cache in place, never a copy of it: the watch runs for every
/// Stack event).
pub fn depends_on(stack: &Stack, namespace: &str, prerequisite: &str) -> bool {
    stack.metadata.namespace.as_deref() == Some(namespace)
        && stack.spec.prerequisites.iter().flatten().any(|p| p.name == prerequisite)
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
    use pko_api::StackSpec;
    use pko_api::stack::{RequirementSpec, StackStatus, StackUpdateState};

    fn at(s: i64) -> Timestamp {
        Timestamp::from_second(1_800_000_000 + s).unwrap()
    }

    fn stack(name: &str, generation: i64, last: Option<(i64, StackUpdateStateMessage, i64)>) -> Stack {
        let mut s = Stack::new(name, StackSpec { stack: "dev".into(), ..Default::default() });
        s.metadata.namespace = Some("ns".into());
        s.metadata.generation = Some(generation);
        s.status = Some(StackStatus {
            last_update: last.map(|(g, state, t)| StackUpdateState {
                generation: Some(g),
                name: Some(format!("{name}-u1")),
                state: Some(state),
                last_resync_time: Some(Time(at(t))),
                ..Default::default()
            }),
            ..Default::default()
        });
        s
    }

    fn prereq(name: &str, within: Option<&str>) -> PrerequisiteRef {
        PrerequisiteRef {
            name: name.into(),
            requirement: within.map(|d| RequirementSpec { succeeded_within_duration: Some(d.into()) }),
        }
    }

    fn found(stacks: Vec<Stack>) -> BTreeMap<String, Stack> {
        stacks.into_iter().map(|s| (s.metadata.name.clone().unwrap(), s)).collect()
    }

    #[test]
    fn no_prerequisites_and_succeeded_ones_are_satisfied() {
        assert_eq!(check(&[], &BTreeMap::new(), at(0)), Verdict::Satisfied);
        let f = found(vec![stack("db", 2, Some((2, StackUpdateStateMessage::Succeeded, 0)))]);
        assert_eq!(check(&[prereq("db", None)], &f, at(10_000)), Verdict::Satisfied);
    }

    #[test]
    fn missing_unsynced_and_failed_prerequisites_are_named() {
        let f = found(vec![
            stack("fresh", 1, None),
            stack("behind", 3, Some((2, StackUpdateStateMessage::Succeeded, 0))),
            stack("broken", 1, Some((1, StackUpdateStateMessage::Failed, 0))),
        ]);
        let v = check(
            &[prereq("gone", None), prereq("fresh", None), prereq("behind", None), prereq("broken", None)],
            &f,
            at(1),
        );
        let Verdict::NotSatisfied { message, resync } = v else { panic!("satisfied") };
        assert!(
            message.starts_with("multiple prerequisites were not satisfied gone, fresh, behind, broken ("),
            "PKO's text first: {message}"
        );
        for want in [
            r#"unable to fetch prerequisite "gone": stacks.pulumi.com "gone" not found"#,
            r#"prerequisite not satisfied for "fresh": prerequisite has not run to completion"#,
            r#"prerequisite not satisfied for "behind": prerequisite has not run to completion (not in sync"#,
            r#"prerequisite not satisfied for "broken": prerequisite failed"#,
        ] {
            assert!(message.contains(want), "{want:?} missing from {message:?}");
        }
        assert!(resync.is_empty(), "only stale successes are asked to resync");
    }

    #[test]
    fn a_stale_success_is_asked_to_resync_once() {
        let f = found(vec![stack("db", 1, Some((1, StackUpdateStateMessage::Succeeded, 0)))]);
        assert_eq!(check(&[prereq("db", Some("1h"))], &f, at(3_000)), Verdict::Satisfied, "within the hour");
        let Verdict::NotSatisfied { message, resync } = check(&[prereq("db", Some("1h"))], &f, at(4_000)) else {
            panic!("satisfied")
        };
        assert_eq!(
            message,
            concat!(
                r#"prerequisite not satisfied for "db": prerequisite is out of date "#,
                "(did not succeed within 1h; requested its resync)"
            )
        );
        assert_eq!(resync, vec![("db".to_string(), "after-db-u1".to_string())]);
        // already requested: no second annotation (its lastUpdate then no longer matches the request, so it waits)
        let mut requested = stack("db", 1, Some((1, StackUpdateStateMessage::Succeeded, 0)));
        requested.metadata.annotations =
            Some([(RECONCILE_REQUEST_ANNOTATION.to_string(), "after-db-u1".to_string())].into());
        let Verdict::NotSatisfied { message, resync } =
            check(&[prereq("db", Some("1h"))], &found(vec![requested]), at(4_000))
        else {
            panic!("satisfied")
        };
        assert!(message.contains("not in sync"), "{message}");
        assert!(resync.is_empty());
    }

    #[test]
    fn a_malformed_duration_is_reported() {
        let f = found(vec![stack("db", 1, Some((1, StackUpdateStateMessage::Succeeded, 0)))]);
        let Verdict::NotSatisfied { message, .. } = check(&[prereq("db", Some("soon"))], &f, at(0)) else {
            panic!("satisfied")
        };
        assert!(message.contains("\"soon\" is not a duration"), "{message}");
    }

    #[test]
    fn dependents_are_found_by_prerequisite_name_within_the_namespace() {
        let mut app = stack("app", 1, None);
        app.spec.prerequisites = Some(vec![prereq("db", None)]);
        let mut other = app.clone();
        other.metadata.namespace = Some("other".into());
        let lone = stack("lone", 1, None);
        let all = [app, other, lone];
        let d: Vec<&Stack> = all.iter().filter(|s| depends_on(s, "ns", "db")).collect();
        assert_eq!(d.iter().map(|s| s.metadata.name.clone().unwrap()).collect::<Vec<_>>(), vec!["app"]);
    }
}
