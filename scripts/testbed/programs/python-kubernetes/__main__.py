"""A Python program of Kubernetes resources, as PKO users write them: a ConfigMap, a Deployment that
reads it and a Service in front of it, with outputs (the tests and benches/real_kubernetes.rs run it)."""
import pulumi
import pulumi_kubernetes as k8s

cfg = pulumi.Config()
ns = cfg.require("ns")
skip_await = {"pulumi.com/skipAwait": "true"}
config = k8s.core.v1.ConfigMap("config", metadata={"name": "py-config", "namespace": ns}, data={"greeting": cfg.require("greeting")})
app = k8s.apps.v1.Deployment(
    "app",
    metadata={"name": "py-app", "namespace": ns, "annotations": skip_await},
    spec={
        "replicas": 0,
        "selector": {"match_labels": {"app": "py-app"}},
        "template": {
            "metadata": {"labels": {"app": "py-app"}},
            "spec": {"containers": [{"name": "app", "image": "pko.local/app:1", "env_from": [{"config_map_ref": {"name": config.metadata.name}}]}]},
        },
    },
)
web = k8s.core.v1.Service(
    "web",
    metadata={"name": "py-web", "namespace": ns, "annotations": skip_await},
    spec={"selector": {"app": "py-app"}, "ports": [{"port": 80, "target_port": 8080}]},
)
pulumi.export("configMap", config.metadata.name)
pulumi.export("deployment", app.metadata.name)
pulumi.export("clusterIP", web.spec.cluster_ip)
