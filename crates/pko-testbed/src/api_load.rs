//! The API server's requests during a bench phase, from its own counters (`apiserver_request_total` of `GET
//! /metrics`), by verb and resource: what an operation costs the control plane, counted where it is served.

use std::collections::BTreeMap;

/// Requests served, by `VERB group/resource[/subresource]` (a `WATCH` counts once, when it starts).
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Requests(pub BTreeMap<String, f64>);

impl Requests {
    /// The API server's counters now, read with the bed's `kubectl get --raw /metrics` (empty when it cannot be read).
    pub fn now(bed: &crate::TestBed) -> Requests {
        let out = bed.kubectl().args(["get", "--raw", "/metrics"]).output();
        out.map(|o| parse(&String::from_utf8_lossy(&o.stdout))).unwrap_or_default()
    }

    /// The requests served since `before`, the largest first, zeros left out.
    pub fn since(&self, before: &Requests) -> Vec<(String, f64)> {
        let mut out: Vec<(String, f64)> = self
            .0
            .iter()
            .map(|(k, v)| (k.clone(), v - before.0.get(k).copied().unwrap_or(0.0)))
            .filter(|(_, d)| *d > 0.0)
            .collect();
        out.sort_by(|a, b| b.1.total_cmp(&a.1).then_with(|| a.0.cmp(&b.0)));
        out
    }
}

/// Sums `apiserver_request_total` samples by verb and resource (any code, scope, version). Pure.
fn parse(text: &str) -> Requests {
    let mut by = BTreeMap::new();
    for line in text.lines().filter(|l| l.starts_with("apiserver_request_total{")) {
        let Some((labels, value)) = line.rsplit_once(' ') else { continue };
        let Ok(value) = value.parse::<f64>() else { continue };
        let label = |name: &str| {
            let start = format!("{name}=\"");
            labels
                .split(',')
                .find_map(|l| l.trim_start_matches('{').strip_prefix(start.as_str()))
                .map(|v| v.trim_end_matches('}').trim_end_matches('"').to_string())
        };
        let (verb, group, resource, sub) =
            (label("verb"), label("group"), label("resource"), label("subresource").unwrap_or_default());
        let mut key =
            format!("{} {}/{}", verb.unwrap_or_default(), group.unwrap_or_default(), resource.unwrap_or_default());
        if !sub.is_empty() {
            key = format!("{key}/{sub}");
        }
        *by.entry(key).or_insert(0.0) += value;
    }
    Requests(by)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn requests_are_summed_by_verb_and_resource_and_differences_are_the_largest_first() {
        let before = parse(
            "apiserver_request_total{code=\"200\",component=\"apiserver\",dry_run=\"\",group=\"pulumi.com\",\
             resource=\"stacks\",scope=\"namespace\",subresource=\"status\",verb=\"PATCH\",version=\"v1\"} 3\n",
        );
        let after = parse(
            "apiserver_request_total{code=\"200\",component=\"apiserver\",dry_run=\"\",group=\"pulumi.com\",\
             resource=\"stacks\",scope=\"namespace\",subresource=\"status\",verb=\"PATCH\",version=\"v1\"} 7\n\
             apiserver_request_total{code=\"409\",component=\"apiserver\",dry_run=\"\",group=\"pulumi.com\",\
             resource=\"stacks\",scope=\"namespace\",subresource=\"status\",verb=\"PATCH\",version=\"v1\"} 1\n\
             apiserver_request_total{code=\"201\",component=\"apiserver\",dry_run=\"\",group=\"\",\
             resource=\"events\",scope=\"namespace\",subresource=\"\",verb=\"POST\",version=\"v1\"} 9\n\
             # HELP something else\n",
        );
        assert_eq!(
            after.since(&before),
            vec![("POST /events".to_string(), 9.0), ("PATCH pulumi.com/stacks/status".to_string(), 5.0)]
        );
    }
}
