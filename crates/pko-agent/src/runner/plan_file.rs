//! An operation's saved plan on disk (`OperationOptions.save_plan`, `plan_id`/`plan`): a preview that saves one gets a
//! file to write it to and returns it in its result; an `up` constrained to one gets it written back, after its id was
//! checked against the bytes. The file lives in a directory of its own under the operation's `TMPDIR` (its sandbox's,
//! when isolated) and goes with the operation.

use std::collections::BTreeMap;
use std::path::PathBuf;

use pko_proto::plan::{MAX_PLAN_BYTES, id, is_id};
use pko_proto::v1::{ErrorReason, OperationOptions, OperationResult, OperationType};

use super::{Failure, fail};

/// The plan file of one operation.
pub(super) struct PlanFile {
    /// Removed with the operation.
    _dir: tempfile::TempDir,
    path: PathBuf,
    /// A preview saves it (else an `up` reads it).
    saves: bool,
}

/// What the request asks of plans, checked (pure): `Ok(None)` none; `Ok(Some(true))` a preview saves one;
/// `Ok(Some(false))` an `up` runs the request's plan, whose bytes have the id it names.
///
/// Errors: `INVALID_REQUEST` naming `options.save_plan` (not a preview), `options.plan_id` (not an `up`, not an id)
/// or `options.plan` (missing, over [`MAX_PLAN_BYTES`], or not the plan the id names).
pub(super) fn asked(kind: OperationType, o: &OperationOptions) -> Result<Option<bool>, Failure> {
    let invalid = |field: &str, message: String| Err(fail(ErrorReason::InvalidRequest, field, message));
    if o.save_plan {
        if kind != OperationType::Preview {
            return invalid("options.save_plan", "only a preview saves a plan".into());
        }
        return Ok(Some(true));
    }
    if o.plan_id.is_empty() {
        return Ok(None);
    }
    if kind != OperationType::Up {
        return invalid("options.plan_id", "only an up runs with a saved plan".into());
    }
    if !is_id(&o.plan_id) {
        return invalid("options.plan_id", format!("{:?} is not a plan id (16 lowercase hex digits)", o.plan_id));
    }
    if o.plan.is_empty() || o.plan.len() > MAX_PLAN_BYTES {
        return invalid(
            "options.plan",
            format!("the plan must hold 1 to {MAX_PLAN_BYTES} bytes, not {}", o.plan.len()),
        );
    }
    let found = id(&o.plan);
    if found != o.plan_id {
        return invalid("options.plan", format!("the plan sent is {found}, not the plan {} it names", o.plan_id));
    }
    Ok(Some(false))
}

/// The plan file the request asks for ([`asked`]), in a new directory under `env`'s `TMPDIR` (else the system's):
/// empty for a preview to save into, the plan for an `up`.
///
/// Errors: [`asked`]'s; `INTERNAL` when the file cannot be made.
pub(super) fn prepare(
    kind: OperationType,
    o: &OperationOptions,
    env: &BTreeMap<String, String>,
) -> Result<Option<PlanFile>, Failure> {
    let Some(saves) = asked(kind, o)? else { return Ok(None) };
    let internal = |e: std::io::Error| fail(ErrorReason::Internal, "", format!("preparing the plan file: {e}"));
    let mut builder = tempfile::Builder::new();
    builder.prefix("pko-plan-");
    let dir = match env.get("TMPDIR").filter(|d| !d.is_empty()) {
        Some(tmp) => builder.tempdir_in(tmp),
        None => builder.tempdir(),
    }
    .map_err(internal)?;
    let path = dir.path().join("plan.json");
    if !saves {
        std::fs::write(&path, &o.plan).map_err(internal)?;
    }
    Ok(Some(PlanFile { _dir: dir, path, saves }))
}

impl PlanFile {
    /// The Pulumi arguments: `--save-plan <file>` or `--plan <file>`.
    pub(super) fn args(&self) -> Vec<String> {
        let flag = if self.saves { "--save-plan" } else { "--plan" };
        vec![flag.into(), self.path.display().to_string()]
    }

    /// After a preview that saved it: the plan and its id into `result`.
    ///
    /// Errors: `UPDATE_FAILED` when Pulumi wrote none, or one over [`MAX_PLAN_BYTES`].
    pub(super) fn collect(&self, result: &mut OperationResult) -> Result<(), Failure> {
        if !self.saves {
            return Ok(());
        }
        let bytes = std::fs::read(&self.path)
            .map_err(|e| fail(ErrorReason::UpdateFailed, "", format!("pulumi saved no plan: {e}")))?;
        if bytes.len() > MAX_PLAN_BYTES {
            let message = format!("the saved plan holds {} bytes, more than the {MAX_PLAN_BYTES} kept", bytes.len());
            return Err(fail(ErrorReason::UpdateFailed, "", message));
        }
        result.plan_id = id(&bytes);
        result.plan = bytes;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn opts(save: bool, plan_id: &str, plan: &[u8]) -> OperationOptions {
        OperationOptions { save_plan: save, plan_id: plan_id.into(), plan: plan.to_vec(), ..Default::default() }
    }

    fn field(r: Result<Option<bool>, Failure>) -> String {
        match r {
            Err(f) => {
                assert_eq!(f.reason, ErrorReason::InvalidRequest);
                f.field
            }
            Ok(v) => panic!("expected a refusal, got {v:?}"),
        }
    }

    #[test]
    fn a_preview_saves_and_an_up_runs_only_the_plan_its_id_names() {
        let plan = b"{\"resourcePlans\":{}}";
        assert_eq!(asked(OperationType::Up, &opts(false, "", b"")).ok().flatten(), None);
        assert_eq!(asked(OperationType::Preview, &opts(true, "", b"")).ok().flatten(), Some(true));
        assert_eq!(asked(OperationType::Up, &opts(false, &id(plan), plan)).ok().flatten(), Some(false));
        assert_eq!(field(asked(OperationType::Up, &opts(true, "", b""))), "options.save_plan");
        assert_eq!(field(asked(OperationType::Preview, &opts(false, &id(plan), plan))), "options.plan_id");
        assert_eq!(field(asked(OperationType::Up, &opts(false, "nope", plan))), "options.plan_id");
        assert_eq!(field(asked(OperationType::Up, &opts(false, &id(plan), b""))), "options.plan");
        let other = b"{\"resourcePlans\":{\"x\":{}}}";
        assert_eq!(field(asked(OperationType::Up, &opts(false, &id(plan), other))), "options.plan", "not its bytes");
    }

    #[test]
    fn the_plan_file_is_written_for_an_up_and_read_back_after_a_preview() {
        let tmp = tempfile::tempdir().unwrap();
        let env = BTreeMap::from([("TMPDIR".to_string(), tmp.path().display().to_string())]);
        let plan = b"{\"resourcePlans\":{}}";
        let up = prepare(OperationType::Up, &opts(false, &id(plan), plan), &env).ok().flatten().unwrap();
        assert_eq!(up.args()[0], "--plan");
        assert!(up.path.starts_with(tmp.path()), "under the operation's TMPDIR");
        assert_eq!(std::fs::read(&up.path).unwrap(), plan);
        let preview = prepare(OperationType::Preview, &opts(true, "", b""), &env).ok().flatten().unwrap();
        assert_eq!(preview.args()[0], "--save-plan");
        let mut result = OperationResult::default();
        assert!(preview.collect(&mut result).is_err(), "pulumi saved nothing yet");
        std::fs::write(&preview.path, plan).unwrap();
        assert!(preview.collect(&mut result).is_ok());
        assert_eq!((result.plan.as_slice(), result.plan_id.as_str()), (&plan[..], id(plan).as_str()));
        let dir = preview.path.parent().unwrap().to_path_buf();
        drop(preview);
        assert!(!dir.exists(), "the plan's directory goes with the operation");
    }
}
