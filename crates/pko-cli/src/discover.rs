//! Which fleet `kubectl pko fleet` and `status` read when the user names none: found from the fleets' own Leases
//! (label `pulumi.com/fleet`, `pko_fleet::lease`) in every namespace the caller may list, so `make demo`, `make demo
//! REPLICAS=3` and a Helm install all work without flags.

use std::collections::BTreeSet;

/// The chart's fleet name and namespace: what is read when nothing is given and no fleet can be found.
pub const DEFAULT: (&str, &str) = ("pko", "pko-system");

/// A fleet: its name (`--fleet-name`) and the namespace of its Leases (`--fleet-namespace`).
pub type Fleet = (String, String);

/// The fleets the Leases `leases` (JSON objects) belong to: (name, namespace), each once, in order. Pure.
pub fn fleets(leases: &[serde_json::Value]) -> Vec<Fleet> {
    let set: BTreeSet<Fleet> = leases
        .iter()
        .filter_map(|l| {
            let name = l["metadata"]["labels"]["pulumi.com/fleet"].as_str()?;
            let ns = l["metadata"]["namespace"].as_str()?;
            Some((name.to_string(), ns.to_string()))
        })
        .collect();
    set.into_iter().collect()
}

/// The fleet to read, from the name and namespace the user gave (flags or `PKO_FLEET_*`) and the fleets `found`
/// (`None`: they could not be listed). Both given: those. Else the fleets found that match what was given: one → it;
/// none, or none could be listed → what was given, completed by [`DEFAULT`].
///
/// Errors: several fleets match; the message lists them and the flags that pick one. Pure.
pub fn choose(name: Option<&str>, namespace: Option<&str>, found: Option<&[Fleet]>) -> Result<Fleet, String> {
    let given = || (name.unwrap_or(DEFAULT.0).to_string(), namespace.unwrap_or(DEFAULT.1).to_string());
    if name.is_some() && namespace.is_some() {
        return Ok(given());
    }
    let Some(found) = found else { return Ok(given()) };
    let matching: Vec<&Fleet> =
        found.iter().filter(|(n, ns)| name.is_none_or(|x| x == n) && namespace.is_none_or(|x| x == ns)).collect();
    match matching.as_slice() {
        [] => Ok(given()),
        [one] => Ok((*one).clone()),
        many => {
            let list: Vec<String> = many.iter().map(|(n, ns)| format!("{n} (namespace {ns})")).collect();
            Err(format!(
                "{} fleets found: {}; pick one with --fleet-name and --fleet-namespace",
                many.len(),
                list.join(", ")
            ))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn lease(name: &str, ns: &str) -> serde_json::Value {
        json!({"metadata": {"name": "x", "namespace": ns, "labels": {"pulumi.com/fleet": name}}})
    }

    #[test]
    fn the_fleets_of_the_leases_each_once() {
        let leases = [lease("pko", "pko-system"), lease("pko", "pko-system"), lease("demo", "pko-demo"), json!({})];
        assert_eq!(fleets(&leases), vec![("demo".into(), "pko-demo".into()), ("pko".into(), "pko-system".into())]);
    }

    #[test]
    fn one_fleet_found_is_used_several_are_named_and_nothing_falls_back_to_the_chart() {
        let one = [("pko".to_string(), "pko-demo".to_string())];
        assert_eq!(choose(None, None, Some(&one)), Ok(one[0].clone()));
        let two = [one[0].clone(), ("pko".to_string(), "pko-system".to_string())];
        let e = choose(None, None, Some(&two)).unwrap_err();
        assert!(
            e.contains("2 fleets found") && e.contains("pko (namespace pko-demo)") && e.contains("--fleet-namespace")
        );
        assert_eq!(choose(None, Some("pko-system"), Some(&two)), Ok(two[1].clone()), "the namespace given picks one");
        assert_eq!(choose(None, None, Some(&[])), Ok(("pko".into(), "pko-system".into())));
        assert_eq!(choose(None, None, None), Ok(("pko".into(), "pko-system".into())), "not allowed to list");
        assert_eq!(choose(Some("a"), Some("b"), Some(&two)), Ok(("a".into(), "b".into())), "both given: no search");
    }
}
