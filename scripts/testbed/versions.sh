# Pinned versions of the test bed's third-party components (sourced by the other scripts).
# Changing any of these changes the cache stamp, so a new cache directory is built.
K8S_VERSION=v1.34.4          # kube-apiserver, kube-controller-manager, kube-scheduler, kubectl
PULUMI_VERSION=v3.259.0      # pulumi CLI + nodejs/python language hosts
PULUMI_YAML_VERSION=v1.38.1  # pulumi-language-yaml
PULUMI_COMMAND_VERSION=v1.2.1 # pulumi-resource-command
PULUMI_NODEJS_HOST_SDK=v3.68.0 # pulumi-language-nodejs: last SDK release that holds the host inside the sdk module
PULUMI_GO_HOST_SDK=v3.66.0  # pulumi-language-go: last SDK release that holds the Go host inside the sdk module; not part of the cache stamp
HELM_VERSION=v3.21.4         # helm (chart lint/template/install tests); not part of the cache stamp: built as its own step
FLUX_SOURCE_CONTROLLER_VERSION=v1.8.0 # Flux source-controller (Flux source tests); not part of the cache stamp. The module proxy
                                      # refuses several newer tags ("This module version is not available") and their deps
COREDNS_VERSION=v1.14.7     # CoreDNS on the node (Service names in pods); not part of the cache stamp: built as its own step
# pulumi-resource-kubernetes, the real Kubernetes provider (issue 36): the module proxy serves the provider
# module only at this pseudo-version (commit f47bc2d6f199 of 2026-01-15, between the v4.24 and v4.25
# releases); not part of the cache stamp: built as its own step. The plugin reports PULUMI_KUBERNETES_VERSION.
PULUMI_KUBERNETES_MODULE_VERSION=v4.0.0-20260115033456-f47bc2d6f199
PULUMI_KUBERNETES_VERSION=4.25.0-alpha.1768447496+f47bc2d6f199
PULUMI_KUBERNETES_PYTHON_VERSION=4.24.0 # the PyPI pulumi-kubernetes SDK in the bed's virtualenv (not newer than the provider above)
