//! A program body that looks for what an earlier operation on the same agent left behind, for the
//! isolation tests of the agent and of the operator's pools.

/// A shell script for the `create` of a `command:local:Command` (the bed's command provider) that runs
/// in the program's directory with `STACK` set to the stack's name. It prints `found:` followed by
/// what it finds of any other operation — files in its working directory, `HOME`, `PULUMI_HOME` and
/// `TMPDIR` (`file:<path>`), another stack's settings file (`stack-settings:<file>`), another request's
/// `ONLY_<stack>` variable (`env`), a process left running (`process`), a changed or planted plugin in
/// the plugin cache (`plugin-changed`, `plugin-planted`) — then leaves all of that behind for the next
/// operation: `$OP_SECRET` in those files, a line in `resource-fake-v1.0.0/marker`, a planted
/// `resource-planted-v9.9.9`, and a daemon (`sleep 3001` in a session of its own; the number is
/// computed, so the script's own command line never matches it). Needs only a POSIX shell, `tr`,
/// `grep` and `setsid` (a slim Debian image has them), and no `${…}` (Pulumi YAML would read it as its own). An
/// isolated agent makes it print exactly
/// `found:` every time.
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
