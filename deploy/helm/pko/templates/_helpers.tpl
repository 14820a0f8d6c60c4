{{/* The chart's name (nameOverride). */}}
{{- define "pko.name" -}}
{{- default "pko-operator" .Values.nameOverride | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/* The objects' base name: fullnameOverride, else "<release>-operator". */}}
{{- define "pko.fullname" -}}
{{- if .Values.fullnameOverride }}
{{- .Values.fullnameOverride | trunc 63 | trimSuffix "-" }}
{{- else }}
{{- printf "%s-operator" .Release.Name | trunc 63 | trimSuffix "-" }}
{{- end }}
{{- end }}

{{- define "pko.selectorLabels" -}}
app.kubernetes.io/name: {{ include "pko.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end }}

{{/* The bundled Redis' labels (its own name, so the operator's selectors never match it). */}}
{{- define "pko.redisLabels" -}}
app.kubernetes.io/name: {{ include "pko.name" . }}-redis
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end }}

{{- define "pko.labels" -}}
{{ include "pko.selectorLabels" . }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version }}
{{- end }}

{{- define "pko.serviceAccountName" -}}
{{- if .Values.serviceAccount.create }}
{{- default (include "pko.fullname" .) .Values.serviceAccount.name }}
{{- else }}
{{- default "default" .Values.serviceAccount.name }}
{{- end }}
{{- end }}

{{/* registry/repository:tag, the tag defaulting to the appVersion. */}}
{{- define "pko.image" -}}
{{- $tag := default .root.Chart.AppVersion .image.tag }}
{{- if .image.registry }}
{{- printf "%s/%s:%s" .image.registry .image.repository $tag }}
{{- else }}
{{- printf "%s:%s" .image.repository $tag }}
{{- end }}
{{- end }}

{{/* Whether the replicas form a fleet. */}}
{{- define "pko.fleet" -}}
{{- if gt (int .Values.replicaCount) 1 }}true{{ end }}
{{- end }}

{{/* The operator's rules (ClusterRole, or a Role per watched namespace). */}}
{{- define "pko.rules" -}}
- apiGroups: [pulumi.com]
  resources: [stacks, programs, receivers, stackrollouts]
  verbs: [get, list, watch, patch, update]
- apiGroups: [pulumi.com]
  resources: [stacks/status, programs/status, receivers/status, stackrollouts/status, stacks/finalizers, programs/finalizers]
  verbs: [get, patch, update]
- apiGroups: [auto.pulumi.com]
  resources: [workspaces, updates]
  verbs: [get, list, watch, create, patch, update, delete]
- apiGroups: [auto.pulumi.com]
  resources: [workspaces/status, updates/status, workspaces/finalizers, updates/finalizers]
  verbs: [get, patch, update]
- apiGroups: [auto.pulumi.com]
  resources: [workspaces/rpc]
  verbs: [use]
- apiGroups: [apps]
  resources: [statefulsets]
  verbs: [get, list, watch, create, patch, update, delete]
- apiGroups: [""]
  resources: [services]
  verbs: [get, list, watch, create, patch, update, delete]
- apiGroups: [""]
  resources: [secrets]
  verbs: [get, list, watch, create]
- apiGroups: [""]
  resources: [configmaps, pods, serviceaccounts]
  verbs: [get, list, watch]
- apiGroups: [""]
  resources: [namespaces]
  verbs: [get]
- apiGroups: ["", events.k8s.io]
  resources: [events]
  verbs: [create, patch]
- apiGroups: [source.toolkit.fluxcd.io]
  resources: [gitrepositories, ocirepositories, buckets]
  verbs: [get, list, watch]
{{- with .Values.rbac.extraRules }}
{{ toYaml . }}
{{- end }}
{{- end }}
