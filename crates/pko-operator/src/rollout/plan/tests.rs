use super::*;
use pko_api::rollout::RolloutStep;

fn at(s: i64) -> Time {
    Time(k8s_openapi::jiff::Timestamp::from_second(1_800_000_000 + s).unwrap())
}

fn labels(wave: &str) -> BTreeMap<String, String> {
    BTreeMap::from([("wave".to_string(), wave.to_string())])
}

fn spec(max: &[Option<IntOrString>]) -> StackRolloutSpec {
    let steps = ["a", "b", "c"]
        .iter()
        .zip(max)
        .map(|(w, m)| RolloutStep { match_labels: labels(w), max_update: m.clone() })
        .collect();
    StackRolloutSpec { steps, ..Default::default() }
}

/// `n` Stacks per wave a, b, c and `rest` others, all wanting `r`, running `old`.
fn fleet(n: usize, rest: usize, r: &str, old: &str) -> Vec<StackView> {
    let mut v = Vec::new();
    for (wave, count) in [("a", n), ("b", n), ("c", n), ("z", rest)] {
        for k in 0..count {
            v.push(StackView {
                name: format!("{wave}{k:03}"),
                labels: labels(wave),
                wants: Some(r.into()),
                runs: Some(old.into()),
                failed: None,
                source: None,
            });
        }
    }
    v
}

/// The admitted Stacks update: each runs `r` (or fails it when `bad` says so) by the next advance.
fn update(stacks: &mut [StackView], st: &StackRolloutStatus, r: &str, bad: impl Fn(&str) -> bool) {
    for s in stacks.iter_mut().filter(|s| st.admitted.contains(&s.name) && s.runs.as_deref() != Some(r)) {
        if bad(&s.name) {
            s.failed = Some(r.into());
        } else {
            s.runs = Some(r.into());
        }
    }
}

#[test]
fn max_update_is_a_count_or_a_percentage_rounded_up_at_least_one() {
    assert_eq!(max_update(None, 7), 7);
    assert_eq!(max_update(Some(&IntOrString::Int(2)), 7), 2);
    assert_eq!(max_update(Some(&IntOrString::Int(0)), 7), 1);
    assert_eq!(max_update(Some(&IntOrString::String("25%".into())), 7), 2);
    assert_eq!(max_update(Some(&IntOrString::String("10%".into())), 3), 1);
    assert_eq!(max_update(Some(&IntOrString::String("3".into())), 7), 3);
}

#[test]
fn two_hundred_stacks_go_through_four_steps_in_order_each_once() {
    let spec = spec(&[Some(IntOrString::Int(1)), Some(IntOrString::String("50%".into())), None]);
    let mut stacks = fleet(50, 50, "r2", "r1");
    let mut st = StackRolloutStatus::default();
    let mut admitted_at: BTreeMap<String, i32> = BTreeMap::new();
    for tick in 0..500 {
        let (next, again) = advance(&spec, &st, &stacks, &Requests::default(), &at(tick));
        // what a replica that takes the shard over computes from the same status: the same
        let (replay, _) = advance(&spec, &next, &stacks, &Requests::default(), &at(tick));
        assert_eq!(replay, next, "idempotent at tick {tick}");
        for a in &next.admitted {
            admitted_at.entry(a.clone()).or_insert(next.step);
        }
        st = next;
        if st.phase == RolloutPhase::Completed {
            assert_eq!(again, None);
            break;
        }
        update(&mut stacks, &st, "r2", |_| false);
    }
    assert_eq!(st.phase, RolloutPhase::Completed, "{st:?}");
    assert_eq!(st.admitted.len(), 200);
    assert!(stacks.iter().all(|s| s.runs.as_deref() == Some("r2")));
    for (name, step) in &admitted_at {
        let expected = match &name[..1] {
            "a" => 0,
            "b" => 1,
            "c" => 2,
            _ => 3,
        };
        assert_eq!(*step, expected, "{name} admitted in its own step");
    }
    assert_eq!(st.steps.len(), 4);
    assert!(st.steps.iter().all(|s| s.stacks == 50 && s.done_at.is_some() && s.halted.is_none()));
}

#[test]
fn a_step_with_more_failures_than_its_budget_halts_and_holds_the_rest() {
    let mut spec = spec(&[None, None, None]);
    spec.failure_budget = Some(1);
    let mut stacks = fleet(4, 4, "r2", "r1");
    let mut st = StackRolloutStatus::default();
    for tick in 0..50 {
        st = advance(&spec, &st, &stacks, &Requests::default(), &at(tick)).0;
        if st.phase == RolloutPhase::Halted {
            break;
        }
        update(&mut stacks, &st, "r2", |n| n == "b000" || n == "b001");
    }
    assert_eq!((st.phase, st.step), (RolloutPhase::Halted, 1), "{st:?}");
    let why = st.steps[1].halted.clone().unwrap();
    assert!(why.contains("step 2: 2 Stack(s) failed revision r2 (budget 1): b000, b001"), "{why}");
    assert!(st.admitted.iter().all(|a| a.starts_with('a') || a.starts_with('b')), "c and the rest held: {st:?}");
    let (still, again) = advance(&spec, &st, &stacks, &Requests::default(), &at(60));
    assert_eq!((still.phase, again), (RolloutPhase::Halted, None), "halted stays halted");
    // resumed (after a fix): the step runs again with a new deadline
    stacks.iter_mut().filter(|s| s.name.starts_with('b')).for_each(|s| (s.runs, s.failed) = (Some("r2".into()), None));
    let resume = Requests { resume: Some("t1".into()), ..Default::default() };
    let (resumed, _) = advance(&spec, &still, &stacks, &resume, &at(61));
    assert_eq!((resumed.phase, resumed.step), (RolloutPhase::Progressing, 2));
    assert!(resumed.admitted.iter().any(|a| a.starts_with('c')));
}

#[test]
fn a_step_past_its_deadline_halts_a_pause_waits_and_a_paused_rollout_admits_nobody() {
    let mut spec = spec(&[None, None, None]);
    spec.step_deadline_seconds = Some(10);
    spec.pause_seconds = Some(30);
    let mut stacks = fleet(2, 0, "r2", "r1");
    let st = advance(&spec, &StackRolloutStatus::default(), &stacks, &Requests::default(), &at(0)).0;
    assert_eq!(st.admitted, ["a000", "a001"]);
    update(&mut stacks, &st, "r2", |_| false);
    let (st, again) = advance(&spec, &st, &stacks, &Requests::default(), &at(5));
    assert_eq!((st.step, again), (0, Some(Duration::from_secs(30))), "step 0 done: pausing");
    let (st, _) = advance(&spec, &st, &stacks, &Requests::default(), &at(36));
    assert_eq!(st.step, 1, "the pause is over");
    assert!(st.admitted.contains(&"b000".to_string()));
    let (late, _) = advance(&spec, &st, &stacks, &Requests::default(), &at(36 + 11));
    assert_eq!(late.phase, RolloutPhase::Halted, "b did not finish within 10 s");
    assert!(late.message.unwrap().contains("step 2: not every Stack runs revision r2 within 10 s: b000, b001"));
    let mut paused = spec.clone();
    paused.paused = true;
    let (p, _) = advance(&paused, &StackRolloutStatus::default(), &stacks, &Requests::default(), &at(0));
    assert_eq!((p.phase, p.admitted.len()), (RolloutPhase::Paused, 0));
}

#[test]
fn a_new_revision_restarts_from_the_first_step_and_abort_holds_everyone_left() {
    let spec = spec(&[None, None, None]);
    let mut stacks = fleet(2, 0, "r2", "r1");
    let st = advance(&spec, &StackRolloutStatus::default(), &stacks, &Requests::default(), &at(0)).0;
    update(&mut stacks, &st, "r2", |_| false);
    let st = advance(&spec, &st, &stacks, &Requests::default(), &at(1)).0;
    assert_eq!(st.step, 1);
    stacks.iter_mut().for_each(|s| s.wants = Some("r3".into()));
    let st = advance(&spec, &st, &stacks, &Requests::default(), &at(2)).0;
    assert_eq!((st.revision.as_deref(), st.step), (Some("r3"), 0), "a new revision starts over");
    assert_eq!(st.admitted, ["a000", "a001"]);
    let abort = Requests { abort: Some("now".into()), ..Default::default() };
    let st = advance(&spec, &st, &stacks, &abort, &at(3)).0;
    assert_eq!((st.phase, st.observed_abort.as_deref()), (RolloutPhase::Aborted, Some("now")));
    let (still, _) = advance(&spec, &st, &stacks, &Requests::default(), &at(4));
    assert_eq!((still.phase, still.admitted.len()), (RolloutPhase::Aborted, 2), "nobody more");
}

#[test]
fn stacks_that_learn_of_the_revision_late_join_their_started_step() {
    let spec = spec(&[None, None, None]);
    let mut stacks = fleet(2, 0, "r2", "r1");
    stacks[1].wants = None; // a001 has not polled its source yet
    let st = advance(&spec, &StackRolloutStatus::default(), &stacks, &Requests::default(), &at(0)).0;
    assert_eq!(st.admitted, ["a000"]);
    update(&mut stacks, &st, "r2", |_| false);
    let st = advance(&spec, &st, &stacks, &Requests::default(), &at(1)).0;
    assert_eq!(st.step, 1, "step 0's Stacks that want r2 run it");
    stacks[1].wants = Some("r2".into());
    let st = advance(&spec, &st, &stacks, &Requests::default(), &at(2)).0;
    assert!(st.admitted.contains(&"a001".to_string()), "admitted on learning: {st:?}");
    assert!(!st.admitted.contains(&"c000".to_string()), "a later step waits");
}

#[test]
fn a_step_waits_for_its_stacks_still_learning_of_the_revision_from_the_same_source() {
    let spec = spec(&[None, None, None]);
    let mut stacks = fleet(2, 0, "r2", "r1");
    stacks.iter_mut().for_each(|s| s.source = Some("program:p".into()));
    // only a000 has seen the Program change yet
    stacks.iter_mut().skip(1).for_each(|s| s.wants = None);
    let st = advance(&spec, &StackRolloutStatus::default(), &stacks, &Requests::default(), &at(0)).0;
    assert_eq!((st.step, st.admitted.clone()), (0, vec!["a000".to_string(), "a001".into()]), "a001 in advance");
    stacks[0].runs = Some("r2".into());
    let st = advance(&spec, &st, &stacks, &Requests::default(), &at(1)).0;
    assert_eq!(st.step, 0, "a001 has not learned of r2 yet: step 1 is not done");
    assert_eq!(st.steps[0].stacks, 2);
    stacks[1].runs = Some("r2".into());
    stacks[3].wants = Some("r2".into()); // b001 learns, b000 not yet
    let st = advance(&spec, &st, &stacks, &Requests::default(), &at(2)).0;
    assert_eq!(st.step, 1);
    assert!(st.admitted.contains(&"b000".to_string()) && st.admitted.contains(&"b001".to_string()), "{st:?}");
    // b001 fails: the rollout halts with b000 admitted, which updates once it learns
    stacks[3].failed = Some("r2".into());
    let st = advance(&spec, &st, &stacks, &Requests::default(), &at(3)).0;
    assert_eq!(st.phase, RolloutPhase::Halted);
    assert!(st.admitted.contains(&"b000".to_string()) && !st.admitted.iter().any(|a| a.starts_with('c')));
    // a Stack of another source that does not want r2 is no member
    let mut other = fleet(1, 0, "r2", "r1");
    other[0].source = Some("program:p".into());
    other[1].source = Some("program:q".into());
    other[1].wants = None;
    let st = advance(&spec, &StackRolloutStatus::default(), &other, &Requests::default(), &at(0)).0;
    assert_eq!(st.steps[0].stacks, 1);
}
