//! A program body that looks for what an earlier operation on the same agent left behind, for the isolation tests of
//! the agent and of the operator's pools.

// Portable on purpose: a POSIX shell, `tr`, `grep` and `setsid` only (a slim Debian image has them), and no `${…}`,
// which Pulumi YAML would read as its own. The daemon's number is computed, so the script's own command line never
// matches it.
/// A `command:local:Command` create script, run in the program's directory with `STACK` set: prints `found:` and what
/// it finds of any other operation (`file:<path>`, `stack-settings:<file>`, `env`, `process`, `plugin-changed`,
/// `plugin-planted`), then leaves the same behind for the next (files holding `$OP_SECRET`, a plugin marker, a planted
/// plugin, a `sleep 3001` daemon). An isolated agent makes it print exactly `found:` every time.
pub const ISOLATION_PROBE: &str = r#"found=""
t=$TMPDIR; [ -n "$t" ] || t=/tmp
for p in ./leak.txt "$HOME/leak.txt" "$PULUMI_HOME/leak.txt" "$t/leak.txt"; do [ -e "$p" ] && found="$found \
    file:$p"; done
for f in Pulumi.*.yaml; do [ -e "$f" ] && [ "$f" != "Pulumi.$STACK.yaml" ] && found="$found stack-settings:$f"; done
env | grep '^ONLY_' | grep -qv "^ONLY_$STACK=" && found="$found env"
n=$((3000+1))
for c in /proc/[0-9]*/cmdline; do tr '\0' ' ' < "$c" 2>/dev/null | grep -q "^sleep $n" && found="$found process"; done
grep -qs evil "$PULUMI_HOME/plugins/resource-fake-v1.0.0/marker" && found="$found plugin-changed"
ls -d "$PULUMI_HOME"/plugins/resource-planted-* >/dev/null 2>&1 && found="$found plugin-planted"
for p in ./leak.txt "$HOME/leak.txt" "$PULUMI_HOME/leak.txt" "$t/leak.txt"; do echo "$OP_SECRET" > "$p"; done
echo evil >> "$PULUMI_HOME/plugins/resource-fake-v1.0.0/marker" 2>/dev/null
mkdir -p "$PULUMI_HOME/plugins/resource-planted-v9.9.9"
setsid sleep $n </dev/null >/dev/null 2>&1 &
echo "found:$found"
"#;

/// The processes running the daemon [`ISOLATION_PROBE`] leaves (`pgrep -fa 'sleep 3001'` lines).
pub fn probe_daemons() -> Vec<String> {
    let out =
        std::process::Command::new("pgrep").args(["-fa", "sleep 3001"]).output().map(|o| o.stdout).unwrap_or_default();
    String::from_utf8_lossy(&out).lines().map(str::to_string).collect()
}
