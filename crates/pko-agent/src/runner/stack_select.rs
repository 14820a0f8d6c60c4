//! Selecting an operation's stack, creating it when its settings allow (`pulumi stack select [--create]`), through
//! the races of two agents selecting one new stack of one backend at once (two Workspaces of one stack, PKO's
//! `stacks[].create`).

use std::collections::BTreeMap;
use std::path::Path;
use std::time::Duration;

use pko_proto::v1::ErrorReason;

use super::{Failure, RunnerContext, fail};
use crate::mask::Masker;
use crate::pulumi;

/// How many times a `select --create` that met another agent's creation of the stack is tried in all: 5.
const SELECT_ATTEMPTS: u32 = 5;

/// What to do after a failed `pulumi stack select` (`create`: it had `--create`; `attempt`: 1 for the first try).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum AfterFailedSelect {
    /// Another operation created the stack between this one's select and create: select what it created.
    SelectExisting,
    /// Another operation holds the stack's lock while it creates the stack (a DIY backend's creation takes the
    /// lock): try again after this long, when the stack exists.
    TryAgain(Duration),
    /// A failure of its own: report it.
    Fail,
}

/// The step after `pulumi stack select` failed with `stderr`. Pure.
fn after_failed_select(stderr: &str, create: bool, attempt: u32) -> AfterFailedSelect {
    if !create {
        return AfterFailedSelect::Fail;
    }
    if stderr.contains("already exists") {
        return AfterFailedSelect::SelectExisting;
    }
    // `could not create stack: the stack is currently locked by 1 lock(s)`: the creator holds the lock for a few
    // milliseconds; 0.2, 0.4, 0.6, 0.8 s apart
    if stderr.contains("could not create stack")
        && pulumi::classify_failure(stderr) == ErrorReason::UpdateConflict
        && attempt < SELECT_ATTEMPTS
    {
        return AfterFailedSelect::TryAgain(Duration::from_millis(200 * u64::from(attempt)));
    }
    AfterFailedSelect::Fail
}

/// Selects `stack` in `dir` (creating it when `stack.create`), selecting the stack that another operation created
/// meanwhile, and waiting out its creation's lock ([`after_failed_select`]).
///
/// Errors: [`Failure`] with the field `stack.name` and Pulumi's (masked) message, reason `InitializationFailed` unless
/// the message says more ([`pulumi::classify_failure`]); `Internal` when `pulumi` cannot be run.
pub(super) async fn select_stack(
    ctx: &RunnerContext,
    dir: &Path,
    env: &BTreeMap<String, String>,
    stack: &pko_proto::v1::StackSettings,
    masker: &Masker,
) -> Result<(), Failure> {
    let select = ["stack", "select", "--non-interactive", "--stack", stack.name.as_str()];
    let mut args = select.to_vec();
    if stack.create {
        args.push("--create");
        if !stack.secrets_provider.is_empty() {
            args.extend(["--secrets-provider", stack.secrets_provider.as_str()]);
        }
    }
    let cli = &ctx.pulumi;
    let internal = |e: std::io::Error| fail(ErrorReason::Internal, "", e.to_string());
    let mut attempt = 1;
    let mut out = pulumi::run(cli, dir, env, &args).await.map_err(internal)?;
    while !out.success {
        match after_failed_select(&out.stderr, stack.create, attempt) {
            AfterFailedSelect::SelectExisting => {
                out = pulumi::run(cli, dir, env, &select).await.map_err(internal)?;
                break;
            }
            AfterFailedSelect::TryAgain(wait) => {
                tokio::time::sleep(wait).await;
                attempt += 1;
                out = pulumi::run(cli, dir, env, &args).await.map_err(internal)?;
            }
            AfterFailedSelect::Fail => break,
        }
    }
    if !out.success {
        let text = masker.mask(out.stderr.trim());
        let reason = match pulumi::classify_failure(&text) {
            ErrorReason::UpdateFailed => ErrorReason::InitializationFailed,
            r => r,
        };
        return Err(fail(reason, "stack.name", text));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    const LOCKED: &str = "error: could not create stack: the stack is currently locked by 1 lock(s). Either wait for \
        the other process(es) to end or delete the lock file with `pulumi cancel`.";

    #[test]
    fn a_stack_created_meanwhile_is_selected_and_its_creations_lock_is_waited_out_a_few_times() {
        let exists = "error: stack 'organization/local/dev' already exists";
        assert_eq!(after_failed_select(exists, true, 1), AfterFailedSelect::SelectExisting);
        assert_eq!(after_failed_select(LOCKED, true, 1), AfterFailedSelect::TryAgain(Duration::from_millis(200)));
        assert_eq!(after_failed_select(LOCKED, true, 4), AfterFailedSelect::TryAgain(Duration::from_millis(800)));
        assert_eq!(after_failed_select(LOCKED, true, SELECT_ATTEMPTS), AfterFailedSelect::Fail, "then it is reported");
    }

    #[test]
    fn without_create_or_for_another_failure_a_failed_select_is_reported() {
        assert_eq!(after_failed_select(LOCKED, false, 1), AfterFailedSelect::Fail, "no --create: no creation race");
        let missing = "error: no stack named 'dev' found";
        assert_eq!(after_failed_select(missing, true, 1), AfterFailedSelect::Fail);
        let update_lock = "error: the stack is currently locked by 1 lock(s)";
        assert_eq!(after_failed_select(update_lock, true, 1), AfterFailedSelect::Fail, "not a creation's lock");
    }
}
