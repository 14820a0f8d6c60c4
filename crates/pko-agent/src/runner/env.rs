//! The operation's environment: the dotenv file read before it, the names that mark a secret, a home backend pinned to
//! the agent's home.

use std::collections::BTreeMap;
use std::path::Path;

/// A `file://~` backend (Pulumi expands `~` with `HOME`) names the agent's home, not the operation's fresh one: the URL
/// of the operation's environment, else the agent's (`inherited`), is rewritten with the agent's `home`. Otherwise
/// every operation would find an empty backend in its own home.
pub(super) fn pin_home_backend(env: &mut BTreeMap<String, String>, inherited: Option<String>, home: Option<String>) {
    let Some(url) = env.get("PULUMI_BACKEND_URL").cloned().or(inherited) else { return };
    let (Some(rest), Some(home)) = (url.strip_prefix("file://~"), home) else { return };
    if rest.is_empty() || rest.starts_with('/') {
        env.insert("PULUMI_BACKEND_URL".into(), format!("file://{}{rest}", home.trim_end_matches('/')));
    }
}

/// Whether an environment variable's name says it holds a secret (masked in every log line).
pub(super) fn is_secret_name(name: &str) -> bool {
    ["PASSPHRASE", "TOKEN", "SECRET", "PASSWORD"].iter().any(|s| name.contains(s))
}

/// The variables of the dotenv file `path` (dotenv syntax: `NAME=value`, quotes, `export`, comments), none when it does
/// not exist. Errors: the file named with what is wrong in it.
pub(super) fn read_env_file(path: &Path) -> Result<Vec<(String, String)>, String> {
    let iter = match dotenvy::from_path_iter(path) {
        Ok(i) => i,
        Err(dotenvy::Error::Io(e)) if e.kind() == std::io::ErrorKind::NotFound => return Ok(Vec::new()),
        Err(e) => return Err(format!("env file {}: {e}", path.display())),
    };
    let mut vars = Vec::new();
    for r in iter {
        match r {
            Ok(v) => vars.push(v),
            // the line itself may hold a secret: it is not repeated
            Err(dotenvy::Error::LineParse(_, at)) => {
                return Err(format!(
                    "env file {}: entry {} is not NAME=value (a parse error at character {at} of it)",
                    path.display(),
                    vars.len() + 1
                ));
            }
            Err(e) => return Err(format!("env file {}: {e}", path.display())),
        }
    }
    Ok(vars)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_backend_in_the_home_stays_in_the_agents_home() {
        let pin = |url: Option<&str>, inherited: Option<&str>| {
            let mut env: BTreeMap<String, String> =
                url.map(|u| ("PULUMI_BACKEND_URL".to_string(), u.to_string())).into_iter().collect();
            pin_home_backend(&mut env, inherited.map(str::to_string), Some("/home/agent/".into()));
            env.get("PULUMI_BACKEND_URL").cloned()
        };
        assert_eq!(pin(Some("file://~"), None).as_deref(), Some("file:///home/agent"));
        assert_eq!(pin(Some("file://~/state"), None).as_deref(), Some("file:///home/agent/state"));
        assert_eq!(
            pin(None, Some("file://~/s")).as_deref(),
            Some("file:///home/agent/s"),
            "the agent's own URL, made explicit"
        );
        assert_eq!(pin(Some("file:///abs"), Some("file://~")).as_deref(), Some("file:///abs"), "the request's wins");
        assert_eq!(
            pin(Some("file://~bob/x"), None).as_deref(),
            Some("file://~bob/x"),
            "another user's home is not ours"
        );
        assert_eq!(pin(Some("s3://b"), None).as_deref(), Some("s3://b"));
        assert_eq!(pin(None, None), None);
    }

    #[test]
    fn env_files_are_read_as_dotenv_without_repeating_a_bad_line() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join(".env");
        assert_eq!(read_env_file(&path), Ok(vec![]), "no file yet: nothing");
        std::fs::write(&path, "# written by an init container\nA=1\nexport B=\"two words\"\n").unwrap();
        assert_eq!(read_env_file(&path), Ok(vec![("A".into(), "1".into()), ("B".into(), "two words".into())]));
        std::fs::write(&path, "A=1\nPULUMI_CONFIG_PASSPHRASE=\"hunter2\n").unwrap();
        let e = read_env_file(&path).unwrap_err();
        assert!(e.contains("entry 2 is not NAME=value") && !e.contains("hunter2"), "{e}");
    }
}
