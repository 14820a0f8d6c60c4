# Pinned versions of the test bed's third-party components (sourced by the other scripts).
# Changing any of these changes the cache stamp, so a new cache directory is built.
K8S_VERSION=v1.34.4          # kube-apiserver, kube-controller-manager, kube-scheduler, kubectl
PULUMI_VERSION=v3.259.0      # pulumi CLI + nodejs/python language hosts
PULUMI_YAML_VERSION=v1.38.1  # pulumi-language-yaml
PULUMI_COMMAND_VERSION=v1.2.1 # pulumi-resource-command
PULUMI_NODEJS_HOST_SDK=v3.68.0 # pulumi-language-nodejs: last SDK release that holds the host inside the sdk module
HELM_VERSION=v3.21.4         # helm (chart lint/template/install tests); not part of the cache stamp: built as its own step
FLUX_SOURCE_CONTROLLER_VERSION=v1.8.0 # Flux source-controller (Flux source tests); not part of the cache stamp. The module proxy
                                      # refuses several newer tags ("This module version is not available") and their deps
COREDNS_VERSION=v1.14.7     # CoreDNS on the node (Service names in pods); not part of the cache stamp: built as its own step
