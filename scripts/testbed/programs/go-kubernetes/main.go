// A Go program of Kubernetes resources, as PKO users write them: a ConfigMap, a Deployment that reads it
// and a Service in front of it, with outputs. The bed builds it once (scripts/testbed/build.sh, step
// pulumi-go) so that the Go module and build caches hold what its `go build` needs; the tests run it.
package main

import (
	appsv1 "github.com/pulumi/pulumi-kubernetes/sdk/v4/go/kubernetes/apps/v1"
	corev1 "github.com/pulumi/pulumi-kubernetes/sdk/v4/go/kubernetes/core/v1"
	metav1 "github.com/pulumi/pulumi-kubernetes/sdk/v4/go/kubernetes/meta/v1"
	"github.com/pulumi/pulumi/sdk/v3/go/pulumi"
	"github.com/pulumi/pulumi/sdk/v3/go/pulumi/config"
)

func main() {
	pulumi.Run(func(ctx *pulumi.Context) error {
		cfg := config.New(ctx, "")
		ns := pulumi.String(cfg.Require("ns"))
		skipAwait := pulumi.StringMap{"pulumi.com/skipAwait": pulumi.String("true")}
		labels := pulumi.StringMap{"app": pulumi.String("go-app")}
		cm, err := corev1.NewConfigMap(ctx, "config", &corev1.ConfigMapArgs{
			Metadata: &metav1.ObjectMetaArgs{Name: pulumi.String("go-config"), Namespace: ns},
			Data:     pulumi.StringMap{"greeting": pulumi.String(cfg.Require("greeting"))},
		})
		if err != nil {
			return err
		}
		container := corev1.ContainerArgs{
			Name:    pulumi.String("app"),
			Image:   pulumi.String("pko.local/app:1"),
			EnvFrom: corev1.EnvFromSourceArray{corev1.EnvFromSourceArgs{ConfigMapRef: &corev1.ConfigMapEnvSourceArgs{Name: cm.Metadata.Name()}}},
		}
		app, err := appsv1.NewDeployment(ctx, "app", &appsv1.DeploymentArgs{
			Metadata: &metav1.ObjectMetaArgs{Name: pulumi.String("go-app"), Namespace: ns, Annotations: skipAwait},
			Spec: &appsv1.DeploymentSpecArgs{
				Replicas: pulumi.Int(0),
				Selector: &metav1.LabelSelectorArgs{MatchLabels: labels},
				Template: &corev1.PodTemplateSpecArgs{
					Metadata: &metav1.ObjectMetaArgs{Labels: labels},
					Spec:     &corev1.PodSpecArgs{Containers: corev1.ContainerArray{container}},
				},
			},
		})
		if err != nil {
			return err
		}
		web, err := corev1.NewService(ctx, "web", &corev1.ServiceArgs{
			Metadata: &metav1.ObjectMetaArgs{Name: pulumi.String("go-web"), Namespace: ns, Annotations: skipAwait},
			Spec: &corev1.ServiceSpecArgs{
				Selector: labels,
				Ports:    corev1.ServicePortArray{corev1.ServicePortArgs{Port: pulumi.Int(80), TargetPort: pulumi.Int(8080)}},
			},
		})
		if err != nil {
			return err
		}
		ctx.Export("configMap", cm.Metadata.Name())
		ctx.Export("deployment", app.Metadata.Name())
		ctx.Export("clusterIP", web.Spec.ClusterIP())
		return nil
	})
}
