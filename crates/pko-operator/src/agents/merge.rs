//! Kubernetes' strategic merge of a Workspace's `podTemplate` onto the generated pod (PKO merges it with
//! `strategicpatch.StrategicMergePatch` against `corev1.PodTemplateSpec`). Pure.
//!
//! The rules are Kubernetes': maps merge key by key (recursively); a list whose Go field declares
//! `patchStrategy:"merge"` merges its elements by their `patchMergeKey` — a matched element is merged recursively, an
//! unmatched one appended, so the generated elements (the `bootstrap` init container, the `pulumi` container, the
//! `share` volume) keep their places — and every other list is replaced whole. A `null` deletes the key. The merge
//! keys are those of `k8s.io/api/core/v1` for the fields a pod template holds ([`merge_key`]).
//!
//! Patch directives (`$patch`, `$setElementOrder/…`, `$retainKeys`, `$deleteFromPrimitiveList/…`) never reach the
//! operator: the CRD's `podTemplate` schema is the full `PodSpec`, which prunes unknown keys at admission — in PKO's
//! CRD as in ours.

use serde_json::{Map, Value};

/// The `patchMergeKey` of the list field `field` of a pod template (`k8s.io/api/core/v1` struct tags with
/// `patchStrategy:"merge"`); `None`: the list is replaced whole.
pub fn merge_key(field: &str) -> Option<&'static str> {
    Some(match field {
        // PodSpec
        "containers"
        | "initContainers"
        | "ephemeralContainers"
        | "volumes"
        | "imagePullSecrets"
        | "resourceClaims"
        | "schedulingGates" => "name",
        "hostAliases" => "ip",
        "topologySpreadConstraints" => "topologyKey",
        // Container
        "env" => "name",
        "ports" => "containerPort",
        "volumeMounts" => "mountPath",
        "volumeDevices" => "devicePath",
        _ => return None,
    })
}

/// Merges `patch` into `base` (both JSON objects of the same kind), Kubernetes' strategic merge.
pub fn strategic_merge(base: &mut Value, patch: &Value) {
    match (base, patch) {
        (Value::Object(b), Value::Object(p)) => merge_maps(b, p),
        (b, p) => *b = p.clone(),
    }
}

fn merge_maps(base: &mut Map<String, Value>, patch: &Map<String, Value>) {
    for (k, pv) in patch {
        match pv {
            Value::Null => {
                base.remove(k);
            }
            Value::Object(_) => match base.get_mut(k) {
                Some(bv @ Value::Object(_)) => strategic_merge(bv, pv),
                _ => {
                    base.insert(k.clone(), pv.clone());
                }
            },
            Value::Array(items) => match (merge_key(k), base.get_mut(k)) {
                (Some(key), Some(Value::Array(existing))) => merge_list(existing, items, key),
                _ => {
                    base.insert(k.clone(), pv.clone());
                }
            },
            _ => {
                base.insert(k.clone(), pv.clone());
            }
        }
    }
}

fn merge_list(base: &mut Vec<Value>, patch: &[Value], key: &str) {
    for item in patch {
        let id = item.get(key);
        match base.iter_mut().find(|b| id.is_some() && b.get(key) == id) {
            Some(existing) => strategic_merge(existing, item),
            None => base.push(item.clone()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn lists_with_a_merge_key_merge_element_by_element_and_others_are_replaced() {
        let mut base = json!({
            "initContainers": [{"name": "bootstrap", "image": "agent", "command": ["cp"]}],
            "containers": [{"name": "pulumi", "image": "pulumi", "env": [{"name": "A", "value": "1"}, {"name": "B",
                "value": "2"}],
                            "ports": [{"name": "grpc", "containerPort": 50051}], "volumeMounts": [{"name": "share",
                                "mountPath": "/share"}],
                            "securityContext": {"runAsNonRoot": true, "capabilities": {"drop": ["ALL"]}}}],
            "volumes": [{"name": "share", "emptyDir": {}}],
            "tolerations": [{"key": "a", "operator": "Exists"}],
            "securityContext": {"runAsUser": 1000, "seccompProfile": {"type": "RuntimeDefault"}}
        });
        let patch = json!({
            "initContainers": [{"name": "fetch-extra", "image": "busybox"}],
            "containers": [{"name": "pulumi", "env": [{"name": "B", "value": "two"}, {"name": "C", "value": "3"}],
                            "volumeMounts": [{"name": "cache", "mountPath": "/cache"}],
                            "securityContext": {"readOnlyRootFilesystem": true}},
                           {"name": "sidecar", "image": "envoy"}],
            "volumes": [{"name": "share", "emptyDir": {"medium": "Memory"}}, {"name": "cache", "emptyDir": {}}],
            "tolerations": [{"key": "b", "operator": "Exists"}],
            "securityContext": {"fsGroup": 1000},
            "nodeSelector": {"pool": "pulumi"}
        });
        strategic_merge(&mut base, &patch);
        assert_eq!(
            base["initContainers"],
            json!([{"name": "bootstrap", "image": "agent", "command": ["cp"]}, {"name": "fetch-extra",
                "image": "busybox"}]),
            "built-in first"
        );
        let pulumi = &base["containers"][0];
        assert_eq!(pulumi["image"], "pulumi", "fields the patch leaves alone stay");
        assert_eq!(
            pulumi["env"],
            json!([{"name": "A", "value": "1"}, {"name": "B", "value": "two"}, {"name": "C", "value": "3"}])
        );
        assert_eq!(
            pulumi["volumeMounts"],
            json!([{"name": "share", "mountPath": "/share"}, {"name": "cache", "mountPath": "/cache"}])
        );
        assert_eq!(pulumi["ports"], json!([{"name": "grpc", "containerPort": 50051}]));
        assert_eq!(
            pulumi["securityContext"],
            json!({"runAsNonRoot": true, "capabilities": {"drop": ["ALL"]}, "readOnlyRootFilesystem": true}),
            "maps merge"
        );
        assert_eq!(base["containers"][1], json!({"name": "sidecar", "image": "envoy"}));
        assert_eq!(
            base["volumes"],
            json!([{"name": "share", "emptyDir": {"medium": "Memory"}}, {"name": "cache", "emptyDir": {}}])
        );
        assert_eq!(
            base["tolerations"],
            json!([{"key": "b", "operator": "Exists"}]),
            "no merge key: replaced, as Kubernetes does"
        );
        assert_eq!(
            base["securityContext"],
            json!({"runAsUser": 1000, "seccompProfile": {"type": "RuntimeDefault"}, "fsGroup": 1000})
        );
        assert_eq!(base["nodeSelector"], json!({"pool": "pulumi"}));
    }

    #[test]
    fn null_deletes_and_scalars_replace() {
        let mut base = json!({"dnsPolicy": "ClusterFirst", "terminationGracePeriodSeconds": 600,
            "containers": [{"name": "pulumi", "args": ["serve", "--x"]}]});
        strategic_merge(
            &mut base,
            &json!({"dnsPolicy": null, "terminationGracePeriodSeconds": 30, "containers": [{"name": "pulumi",
                "args": ["serve"]}]}),
        );
        assert_eq!(
            base,
            json!({"terminationGracePeriodSeconds": 30, "containers": [{"name": "pulumi", "args": ["serve"]}]}),
            "args has no merge key: replaced"
        );
    }
}
