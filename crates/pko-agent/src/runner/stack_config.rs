//! The stack's settings before an operation runs: select (or create) it, reset its config file to the source's, set the
//! request's config — plain strings written into the file by the agent ([`super::config_file`]), anything else in as
//! few `pulumi config set-all` calls as the kernel's argument limits allow — add its ESC environments, and refuse
//! structured config on a CLI too old for it.

use std::collections::BTreeMap;
use std::path::Path;

use pko_proto::v1::{ConfigItem, ErrorReason, config_item};
use pko_proto::{MIN_PULUMI_FOR_STRUCTURED_CONFIG, parse_pulumi_version};

use serde_json::{Value, json};

use super::{Failure, RunnerContext, fail};
use crate::mask::Masker;
use crate::pulumi;

/// Restores the stack's config file to what the source holds (or removes it), so config set by an earlier operation on
/// this cached directory never leaks into the next.
pub(super) fn reset_stack_config(dir: &Path, stack: &str) -> std::io::Result<()> {
    let short = stack.rsplit('/').next().unwrap_or(stack);
    let file = dir.join(format!("Pulumi.{short}.yaml"));
    let pristine = dir.join(".pko-pristine").join(format!("Pulumi.{short}.yaml"));
    if !dir.join(".pko-pristine").exists() {
        std::fs::create_dir_all(dir.join(".pko-pristine"))?;
        for e in std::fs::read_dir(dir)?.flatten() {
            let n = e.file_name().to_string_lossy().into_owned();
            if n.starts_with("Pulumi.")
                && n != "Pulumi.yaml"
                && n != "Pulumi.yml"
                && (n.ends_with(".yaml") || n.ends_with(".yml"))
            {
                std::fs::copy(e.path(), dir.join(".pko-pristine").join(&n))?;
            }
        }
    }
    if pristine.exists() {
        std::fs::copy(&pristine, &file)?;
    } else if file.exists() {
        std::fs::remove_file(&file)?;
    }
    Ok(())
}

/// Writes the secrets provider settings `remembered` (from the stack's last command on this agent) into the stack
/// config file of `stack` in `dir` when it has none ([`super::secrets_provider`]); a project whose stack config lives
/// elsewhere (`stackConfigDir`) is left to Pulumi.
///
/// Errors: the file could not be read (other than absent) or written.
pub(super) fn restore_secrets_provider(
    dir: &Path,
    stack: &str,
    remembered: Option<&[(String, String)]>,
) -> std::io::Result<()> {
    let Some(fields) = remembered.filter(|f| !f.is_empty()) else { return Ok(()) };
    let short = stack.rsplit('/').next().unwrap_or(stack);
    let file = dir.join(format!("Pulumi.{short}.yaml"));
    rewrite_stack_config(dir, &file, |current| super::secrets_provider::with_fields(current, fields)).map(|_| ())
}

/// Rewrites the stack config file `file` of the project in `dir` as `edit` makes its text (empty when the file is
/// absent), replaced whole by a rename; nothing when the project keeps its stack config elsewhere or `edit` leaves it
/// as it is (`None`). Returns the text written.
///
/// Errors: the file could not be read (other than absent) or written.
fn rewrite_stack_config(
    dir: &Path,
    file: &Path,
    edit: impl FnOnce(&str) -> Option<String>,
) -> std::io::Result<Option<String>> {
    if super::config_file::stack_config_elsewhere(dir) {
        return Ok(None);
    }
    let current = match std::fs::read_to_string(file) {
        Ok(t) => t,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => String::new(),
        Err(e) => return Err(e),
    };
    let Some(text) = edit(&current) else { return Ok(None) };
    let tmp = file.with_extension("yaml.pko-tmp");
    std::fs::write(&tmp, &text)?;
    std::fs::rename(&tmp, file)?;
    Ok(Some(text))
}

/// Sets the request's config `items` on `stack` in `dir` (values resolved, secrets masked from then on), then reads the
/// stack config file back: what Pulumi will read is what the request asked for.
///
/// Errors: a value that cannot be resolved (`INVALID_CONFIG`), a Pulumi command that failed (`INITIALIZATION_FAILED`),
/// a file that differs from the request (`RUN_MISMATCH`).
pub(super) async fn set_config(
    ctx: &RunnerContext,
    dir: &Path,
    env: &BTreeMap<String, String>,
    (stack, project): (&str, &str),
    items: &[ConfigItem],
    masker: &mut Masker,
) -> Result<(), Failure> {
    if items.is_empty() {
        return Ok(());
    }
    let mut planned = Vec::with_capacity(items.len());
    for (i, item) in items.iter().enumerate() {
        planned.push(plan_item(ctx, env, project, i, item, masker).await?);
    }
    let short = stack.rsplit('/').next().unwrap_or(stack);
    let file = dir.join(format!("Pulumi.{short}.yaml"));
    let written =
        write_plain_config(dir, &file, &planned).map_err(|e| fail(ErrorReason::Internal, "config", e.to_string()))?;
    let text = match written {
        Some(text) => text,
        None => {
            for c in config_commands(stack, &planned) {
                let refs: Vec<&str> = c.args.iter().map(String::as_str).collect();
                let out = match &c.stdin {
                    None => pulumi::run(&ctx.pulumi, dir, env, &refs).await,
                    Some(input) => pulumi::run_with_input(&ctx.pulumi, dir, env, &refs, input).await,
                }
                .map_err(|e| fail(ErrorReason::Internal, "config", e.to_string()))?;
                if !out.success {
                    return Err(fail(ErrorReason::InitializationFailed, "config", masker.mask(out.stderr.trim())));
                }
            }
            std::fs::read_to_string(&file).unwrap_or_default()
        }
    };
    match written_config_mismatch(&text, &planned) {
        Some(why) => Err(fail(
            ErrorReason::RunMismatch,
            "config",
            masker.mask(&format!("the stack config written is not the request's: {why}")),
        )),
        None => Ok(()),
    }
}

/// Writes `planned` into the stack config file `file` of the project in `dir` without Pulumi when every item is a plain
/// string under a plain key ([`super::config_file`]; not a secret, a path or a structured value): a temporary file
/// renamed over it. The text written (what the mismatch check reads), or `None` to leave it to Pulumi.
///
/// Errors: the file could not be read (other than absent) or written.
fn write_plain_config(dir: &Path, file: &Path, planned: &[PlannedConfig]) -> std::io::Result<Option<String>> {
    if planned.iter().any(|p| p.secret || p.path || p.object.is_some()) {
        return Ok(None);
    }
    let items: Vec<(&str, &str)> = planned.iter().map(|p| (p.key.as_str(), p.text.as_str())).collect();
    rewrite_stack_config(dir, file, |current| super::config_file::with_plain_config(current, &items))
}

/// Config item `i` of the request resolved to what `pulumi config set` gets: a `value_from` `env` names a variable of
/// the Pulumi process (the operation's own environment first, then the agent's).
///
/// Errors: an empty key, no value, a reference that cannot be resolved, JSON that does not parse.
async fn plan_item(
    ctx: &RunnerContext,
    env: &BTreeMap<String, String>,
    project: &str,
    i: usize,
    item: &ConfigItem,
    masker: &mut Masker,
) -> Result<PlannedConfig, Failure> {
    let field = format!("config[{i}]");
    let bad = |m: String| fail(ErrorReason::InvalidConfig, &field, format!("config {}: {m}", item.key));
    if item.key.is_empty() {
        return Err(fail(ErrorReason::InvalidConfig, &field, "config key is empty"));
    }
    let value: Value = match &item.value {
        Some(config_item::Value::Literal(v)) => crate::convert::from_value(v),
        Some(config_item::Value::ValueFrom(r)) => {
            let from_op_env = match &r.kind {
                Some(pko_proto::v1::value_ref::Kind::Env(name)) => env.get(name).cloned(),
                _ => None,
            };
            let s = match from_op_env {
                Some(v) => v,
                None => ctx.values.resolve(r).await.map_err(bad)?,
            };
            if item.json {
                serde_json::from_str(&s).map_err(|e| bad(format!("value is not JSON: {e}")))?
            } else {
                Value::String(s)
            }
        }
        None => return Err(fail(ErrorReason::InvalidConfig, &field, format!("config {} has no value", item.key))),
    };
    let text = match &value {
        Value::String(s) => s.clone(),
        other => other.to_string(),
    };
    if item.secret {
        masker.add(&text);
    }
    let key = if item.key.contains(':') { item.key.clone() } else { format!("{project}:{}", item.key) };
    let object = (!value.is_string()).then_some(value);
    Ok(PlannedConfig { key, text, secret: item.secret, path: item.path, object })
}

/// Where the stack config file `text` (`Pulumi.<stack>.yaml`, as Pulumi wrote it) differs from `planned` (the request's
/// config): a key missing, a plain string with another value, a secret not encrypted. Keys set by property path
/// (`--path`) and structured values are checked for presence of their top key only. `None`: as asked. Pure; a value is
/// never repeated in the answer.
pub fn written_config_mismatch(text: &str, planned: &[PlannedConfig]) -> Option<String> {
    let doc: serde_yaml_ng::Value = serde_yaml_ng::from_str(text).unwrap_or(serde_yaml_ng::Value::Null);
    let config = doc.get("config");
    for item in planned {
        let top = if item.path { item.key.split(['.', '[']).next().unwrap_or(&item.key) } else { item.key.as_str() };
        let Some(found) = config.and_then(|c| c.get(top)) else { return Some(format!("{} is not set", item.key)) };
        if item.path || item.object.is_some() {
            continue;
        }
        if item.secret {
            if found.get("secure").is_none() {
                return Some(format!("{} is not stored encrypted", item.key));
            }
        } else if found.as_str() != Some(item.text.as_str()) {
            return Some(format!("{} has another value", item.key));
        }
    }
    None
}

/// Longest `NAME=value` environment entry, in bytes (Linux `MAX_ARG_STRLEN`).
pub const MAX_ENV_VAR_BYTES: usize = 128 << 10;

/// Longest single command-line argument the agent passes to Pulumi, in bytes: half of Linux's `MAX_ARG_STRLEN` (128
/// KiB), leaving room for the key.
pub const MAX_CONFIG_ARG_BYTES: usize = 64 << 10;

/// Bytes of `--path` config values one `pulumi config set-all` carries (Linux allows 2 MiB of arguments and environment
/// together); a `--json` batch is one argument and stays within [`MAX_CONFIG_ARG_BYTES`].
pub const MAX_CONFIG_BATCH_BYTES: usize = 256 << 10;

/// One config value, resolved.
#[derive(Debug, Clone, PartialEq)]
pub struct PlannedConfig {
    /// Fully qualified key (`project:key`).
    pub key: String,
    /// The value as text (JSON text for structured values).
    pub text: String,
    /// Encrypted by the stack's secrets provider.
    pub secret: bool,
    /// `key` is a property path (`--path`).
    pub path: bool,
    /// The structured value, when it is not a string.
    pub object: Option<Value>,
}

/// One Pulumi command that sets config: its arguments and, for a value too large for the command line, the value on
/// standard input (`pulumi config set <key>` reads it there, trimming one final newline).
#[derive(Debug, Clone, PartialEq)]
pub struct ConfigCommand {
    /// Arguments after `pulumi`.
    pub args: Vec<String>,
    /// Standard input.
    pub stdin: Option<String>,
}

/// The commands that set `items` on `stack` with no argument over [`MAX_CONFIG_ARG_BYTES`] and no command over
/// [`MAX_CONFIG_BATCH_BYTES`] of values: `config set-all --json` batches for plain keys, `config set-all --path`
/// batches for paths, and `config set <key>` with the value on standard input for a value too large for one argument.
/// Pure.
pub fn config_commands(stack: &str, items: &[PlannedConfig]) -> Vec<ConfigCommand> {
    let mut out = Vec::new();
    let mut json_batch = serde_json::Map::new();
    let mut json_bytes = 0usize;
    let mut path_batch: Vec<String> = Vec::new();
    let mut path_bytes = 0usize;
    let flag = |secret: bool| if secret { "--secret" } else { "--plaintext" }.to_string();
    let flush_json = |batch: &mut serde_json::Map<String, Value>, bytes: &mut usize, out: &mut Vec<ConfigCommand>| {
        if !batch.is_empty() {
            let doc = Value::Object(std::mem::take(batch)).to_string();
            out.push(ConfigCommand {
                args: vec!["config".into(), "set-all".into(), "--stack".into(), stack.into(), "--json".into(), doc],
                stdin: None,
            });
            *bytes = 0;
        }
    };
    let flush_path = |batch: &mut Vec<String>, bytes: &mut usize, out: &mut Vec<ConfigCommand>| {
        if !batch.is_empty() {
            let mut args = vec!["config".into(), "set-all".into(), "--stack".into(), stack.into(), "--path".into()];
            args.append(batch);
            out.push(ConfigCommand { args, stdin: None });
            *bytes = 0;
        }
    };
    for item in items {
        let mut entry = json!({ "value": item.text, "secret": item.secret });
        if let Some(o) = &item.object {
            entry["objectValue"] = o.clone();
        }
        let size = item.key.len() + if item.path { item.text.len() } else { entry.to_string().len() };
        if size > MAX_CONFIG_ARG_BYTES {
            let mut args = vec!["config".into(), "set".into(), "--stack".into(), stack.into(), flag(item.secret)];
            if item.path {
                args.push("--path".into());
            }
            if item.object.is_some() {
                args.extend(["--type".into(), "json".into()]);
            }
            args.extend(["--".into(), item.key.clone()]);
            out.push(ConfigCommand { args, stdin: Some(format!("{}\n", item.text)) });
        } else if item.path {
            if path_bytes + size > MAX_CONFIG_BATCH_BYTES {
                flush_path(&mut path_batch, &mut path_bytes, &mut out);
            }
            path_batch.push(flag(item.secret));
            path_batch.push(format!("{}={}", item.key, item.text));
            path_bytes += size;
        } else {
            // the JSON document is one argument: it stays within the per-argument limit
            let size = size + 8;
            if json_bytes + size > MAX_CONFIG_ARG_BYTES {
                flush_json(&mut json_batch, &mut json_bytes, &mut out);
            }
            json_batch.insert(item.key.clone(), entry);
            json_bytes += size;
        }
    }
    flush_json(&mut json_batch, &mut json_bytes, &mut out);
    flush_path(&mut path_batch, &mut path_bytes, &mut out);
    out
}

/// Imports the stack's ESC environments (`pulumi config env add`, PKO's `AddEnvironments`) into the stack's config
/// file, which every operation restores from the source first. Errors: Pulumi's message (e.g. a backend without ESC) as
/// `INITIALIZATION_FAILED` on `stack.environments` (PKO: a Workspace `InitializationFailed`).
pub(super) async fn add_environments(
    ctx: &RunnerContext,
    dir: &Path,
    env: &BTreeMap<String, String>,
    stack: &pko_proto::v1::StackSettings,
    masker: &Masker,
) -> Result<(), Failure> {
    if stack.environments.is_empty() {
        return Ok(());
    }
    let mut args = vec!["config", "env", "add", "--yes", "--non-interactive", "--stack", stack.name.as_str()];
    args.extend(stack.environments.iter().map(String::as_str));
    let out =
        pulumi::run(&ctx.pulumi, dir, env, &args).await.map_err(|e| fail(ErrorReason::Internal, "", e.to_string()))?;
    if !out.success {
        let text = masker.mask(&pulumi::error_text(&out.stderr));
        return Err(fail(
            ErrorReason::InitializationFailed,
            "stack.environments",
            format!("adding ESC environments {}: {text}", stack.environments.join(", ")),
        ));
    }
    Ok(())
}

/// Whether `config` holds a structured value: a literal that is not a string, or a value parsed as JSON.
pub(super) fn uses_structured_config(config: &[ConfigItem]) -> bool {
    config.iter().any(|c| {
        c.json
            || matches!(&c.value, Some(config_item::Value::Literal(v)) if !matches!(v.kind,
        Some(prost_types::value::Kind::StringValue(_))))
    })
}

/// PKO's message when the CLI `version` (`v3.180.0`) is older than [`MIN_PULUMI_FOR_STRUCTURED_CONFIG`] (or not a
/// version); `None` when it reads structured config.
pub fn structured_config_unsupported(version: &str) -> Option<String> {
    let (a, b, c) = MIN_PULUMI_FOR_STRUCTURED_CONFIG;
    match parse_pulumi_version(version) {
        Some(v) if v >= MIN_PULUMI_FOR_STRUCTURED_CONFIG => None,
        Some(_) => Some(format!(
            "Pulumi CLI version {} does not support JSON configuration, require >= v{a}.{b}.{c}",
            version.trim()
        )),
        None => Some(format!("Failed to parse Pulumi version {:?}", version.trim())),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn plain_config_is_written_by_the_agent_and_anything_else_is_left_to_pulumi() {
        let d = tempfile::tempdir().unwrap();
        std::fs::write(d.path().join("Pulumi.yaml"), "name: p\nruntime: yaml\n").unwrap();
        let file = d.path().join("Pulumi.dev.yaml");
        std::fs::write(&file, "encryptionsalt: v1:s\n").unwrap();
        let plain = PlannedConfig { key: "p:a".into(), text: "1".into(), secret: false, path: false, object: None };
        let written = write_plain_config(d.path(), &file, std::slice::from_ref(&plain)).unwrap();
        let text = std::fs::read_to_string(&file).unwrap();
        assert_eq!(written.as_deref(), Some(text.as_str()), "the text written is what the file holds");
        assert_eq!(written_config_mismatch(&text, std::slice::from_ref(&plain)), None, "{text}");
        assert!(text.contains("encryptionsalt: v1:s"), "{text}");
        for other in [
            PlannedConfig { secret: true, ..plain.clone() },
            PlannedConfig { path: true, key: "p:a.b".into(), ..plain.clone() },
            PlannedConfig { object: Some(json!([1])), text: "[1]".into(), ..plain.clone() },
        ] {
            assert_eq!(write_plain_config(d.path(), &file, &[plain.clone(), other]).unwrap(), None);
            assert_eq!(std::fs::read_to_string(&file).unwrap(), text, "untouched");
        }
        std::fs::write(d.path().join("Pulumi.yaml"), "name: p\nruntime: yaml\nstackConfigDir: cfg\n").unwrap();
        assert_eq!(write_plain_config(d.path(), &file, &[plain]).unwrap(), None, "the file is elsewhere");
    }

    #[test]
    fn stack_config_is_reset_to_the_source() {
        let d = tempfile::tempdir().unwrap();
        std::fs::write(d.path().join("Pulumi.yaml"), "name: p\nruntime: yaml\n").unwrap();
        std::fs::write(d.path().join("Pulumi.prod.yaml"), "config:\n  p:a: checked-in\n").unwrap();
        reset_stack_config(d.path(), "org/p/prod").unwrap();
        std::fs::write(d.path().join("Pulumi.prod.yaml"), "config:\n  p:a: changed\n").unwrap();
        std::fs::write(d.path().join("Pulumi.dev.yaml"), "config:\n  p:b: stale\n").unwrap();
        reset_stack_config(d.path(), "org/p/prod").unwrap();
        reset_stack_config(d.path(), "dev").unwrap();
        assert_eq!(std::fs::read_to_string(d.path().join("Pulumi.prod.yaml")).unwrap(), "config:\n  p:a: checked-in\n");
        assert!(!d.path().join("Pulumi.dev.yaml").exists());
    }

    #[test]
    fn the_config_written_is_checked_against_the_request() {
        let planned =
            [item("p:n", "1", false, false), item("p:pw", "hunter2", true, false), item("p:a.b", "x", false, true)];
        let written = "config:\n  p:n: \"1\"\n  p:pw:\n    secure: v1:abc\n  p:a:\n    b: x\n  p:extra: kept\n";
        assert_eq!(written_config_mismatch(written, &planned), None, "as asked (a key of the source's file may stay)");
        let stale = written.replace("\"1\"", "\"0\"");
        assert_eq!(
            written_config_mismatch(&stale, &planned).as_deref(),
            Some("p:n has another value"),
            "the value is not repeated"
        );
        let plain = written.replace("\n    secure: v1:abc", " hunter2");
        assert_eq!(written_config_mismatch(&plain, &planned).as_deref(), Some("p:pw is not stored encrypted"));
        assert_eq!(written_config_mismatch("config: {}\n", &planned).as_deref(), Some("p:n is not set"));
        assert_eq!(written_config_mismatch("", &planned).as_deref(), Some("p:n is not set"), "no file at all");
    }

    fn item(key: &str, text: &str, secret: bool, path: bool) -> PlannedConfig {
        PlannedConfig { key: key.into(), text: text.into(), secret, path, object: None }
    }

    #[test]
    fn small_config_is_one_command_per_kind() {
        let cmds = config_commands(
            "dev",
            &[item("p:a", "1", false, false), item("p:b", "2", true, false), item("p:c.d", "3", false, true)],
        );
        assert_eq!(cmds.len(), 2);
        assert_eq!(&cmds[0].args[..5], &["config", "set-all", "--stack", "dev", "--json"]);
        let doc: Value = serde_json::from_str(&cmds[0].args[5]).unwrap();
        assert_eq!(doc["p:b"], json!({"value": "2", "secret": true}));
        assert_eq!(cmds[1].args[4..], ["--path", "--plaintext", "p:c.d=3"]);
        assert!(cmds.iter().all(|c| c.stdin.is_none()));
    }

    #[test]
    fn no_argument_or_command_exceeds_the_kernel_limits() {
        let big = "x".repeat(300 << 10);
        let medium = "y".repeat(40 << 10);
        let mut items: Vec<PlannedConfig> = (0..20).map(|i| item(&format!("p:m{i}"), &medium, false, false)).collect();
        items.push(item("p:big", &big, true, false));
        items.push(item("p:bigpath.x", &big, false, true));
        let cmds = config_commands("dev", &items);
        for c in &cmds {
            assert!(c.args.iter().all(|a| a.len() <= MAX_CONFIG_ARG_BYTES + 1024), "an argument over the limit");
            assert!(c.args.iter().map(String::len).sum::<usize>() <= MAX_CONFIG_BATCH_BYTES + MAX_CONFIG_ARG_BYTES);
        }
        let stdin: Vec<&ConfigCommand> = cmds.iter().filter(|c| c.stdin.is_some()).collect();
        assert_eq!(stdin.len(), 2, "the two large values go on standard input");
        assert_eq!(stdin[0].args, ["config", "set", "--stack", "dev", "--secret", "--", "p:big"]);
        assert_eq!(stdin[0].stdin.as_deref().map(str::len), Some(big.len() + 1));
        assert!(stdin[1].args.contains(&"--path".to_string()));
        let set: usize = cmds
            .iter()
            .filter(|c| c.stdin.is_none())
            .map(|c| serde_json::from_str::<serde_json::Map<String, Value>>(&c.args[5]).unwrap().len())
            .sum();
        assert_eq!(set, 20, "every medium value is set, in batches");
    }

    #[test]
    fn structured_config_needs_pulumi_3_202() {
        let string = ConfigItem {
            key: "a".into(),
            value: Some(config_item::Value::Literal(prost_types::Value {
                kind: Some(prost_types::value::Kind::StringValue("x".into())),
            })),
            ..Default::default()
        };
        let number = ConfigItem {
            key: "n".into(),
            value: Some(config_item::Value::Literal(prost_types::Value {
                kind: Some(prost_types::value::Kind::NumberValue(2.0)),
            })),
            ..Default::default()
        };
        let json_ref = ConfigItem { key: "j".into(), json: true, ..Default::default() };
        assert!(!uses_structured_config(std::slice::from_ref(&string)));
        assert!(uses_structured_config(&[string.clone(), number]));
        assert!(uses_structured_config(&[json_ref]));
        assert_eq!(structured_config_unsupported("v3.202.0"), None);
        assert_eq!(structured_config_unsupported("v3.259.0\n"), None);
        assert_eq!(
            structured_config_unsupported("v3.201.9").as_deref(),
            Some("Pulumi CLI version v3.201.9 does not support JSON configuration, require >= v3.202.0")
        );
        assert_eq!(structured_config_unsupported("dev").as_deref(), Some("Failed to parse Pulumi version \"dev\""));
    }
}
