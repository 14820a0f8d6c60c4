// A TypeScript program of Kubernetes resources, as PKO users write them: a ConfigMap, a Deployment that
// reads it and a Service in front of it, with outputs (the tests and benches/real_kubernetes.rs run it).
import * as pulumi from "@pulumi/pulumi";
import * as k8s from "@pulumi/kubernetes";

const config = new pulumi.Config();
const ns = config.require("ns");
const skipAwait = { "pulumi.com/skipAwait": "true" };
const cm = new k8s.core.v1.ConfigMap("config", { metadata: { name: "ts-config", namespace: ns }, data: { greeting: config.require("greeting") } });
const app = new k8s.apps.v1.Deployment("app", {
    metadata: { name: "ts-app", namespace: ns, annotations: skipAwait },
    spec: {
        replicas: 0,
        selector: { matchLabels: { app: "ts-app" } },
        template: { metadata: { labels: { app: "ts-app" } }, spec: { containers: [{ name: "app", image: "pko.local/app:1", envFrom: [{ configMapRef: { name: cm.metadata.name } }] }] } },
    },
});
const web = new k8s.core.v1.Service("web", {
    metadata: { name: "ts-web", namespace: ns, annotations: skipAwait },
    spec: { selector: { app: "ts-app" }, ports: [{ port: 80, targetPort: 8080 }] },
});
export const configMap = cm.metadata.name;
export const deployment = app.metadata.name;
export const clusterIP = web.spec.clusterIP;
