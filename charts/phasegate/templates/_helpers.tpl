{{/* Chart name, truncated to the DNS label limit. */}}
{{- define "phasegate.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/* Fully qualified app name: release-chart, unless the release already contains the chart name. */}}
{{- define "phasegate.fullname" -}}
{{- if .Values.fullnameOverride }}
{{- .Values.fullnameOverride | trunc 63 | trimSuffix "-" }}
{{- else }}
{{- $name := default .Chart.Name .Values.nameOverride }}
{{- if contains $name .Release.Name }}
{{- .Release.Name | trunc 63 | trimSuffix "-" }}
{{- else }}
{{- printf "%s-%s" .Release.Name $name | trunc 63 | trimSuffix "-" }}
{{- end }}
{{- end }}
{{- end }}

{{- define "phasegate.chart" -}}
{{- printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/* Selector labels: stable across upgrades, so never include the version. */}}
{{- define "phasegate.selectorLabels" -}}
app.kubernetes.io/name: {{ include "phasegate.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end }}

{{/* Common labels for every object. */}}
{{- define "phasegate.labels" -}}
helm.sh/chart: {{ include "phasegate.chart" . }}
{{ include "phasegate.selectorLabels" . }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
app.kubernetes.io/part-of: phasegate
{{- with .Values.commonLabels }}
{{ toYaml . }}
{{- end }}
{{- end }}

{{/* Labels of one component; call with (dict "ctx" $ "component" "worker"). */}}
{{- define "phasegate.componentLabels" -}}
{{ include "phasegate.labels" .ctx }}
app.kubernetes.io/component: {{ .component }}
{{- end }}

{{/*
Labels of a pod template; call with (dict "ctx" $ "component" "worker" "extra" .Values.worker.podLabels).
The selector labels, the version and part-of, commonLabels (Fargate profiles select on pod
labels) and the Fargate profile labels. Selectors never include the version.
*/}}
{{- define "phasegate.podLabels" -}}
{{ include "phasegate.componentSelectorLabels" . }}
app.kubernetes.io/version: {{ .ctx.Chart.AppVersion | quote }}
app.kubernetes.io/part-of: phasegate
{{- with .ctx.Values.commonLabels }}
{{ toYaml . }}
{{- end }}
{{- with (include "phasegate.fargateLabels" .ctx) }}
{{ . }}
{{- end }}
{{- with .extra }}
{{ toYaml . }}
{{- end }}
{{- end }}

{{/*
The autoscaler this install renders: hpa, keda or none. "auto" picks KEDA when the cluster
serves its ScaledObject API (helm install/upgrade ask the cluster; helm template needs
--api-versions keda.sh/v1alpha1/ScaledObject), else the native HPA.
*/}}
{{- define "phasegate.autoscalingMode" -}}
{{- $mode := .Values.autoscaling.mode }}
{{- if eq $mode "auto" }}
{{- if .Capabilities.APIVersions.Has "keda.sh/v1alpha1/ScaledObject" }}keda{{ else }}hpa{{ end }}
{{- else }}{{ $mode }}{{ end }}
{{- end }}

{{/* The name of the KEDA (Cluster)TriggerAuthentication the scaler uses. */}}
{{- define "phasegate.kedaAuthName" -}}
{{- default (printf "%s-sqs" (include "phasegate.fullname" .)) .Values.autoscaling.keda.authentication.name }}
{{- end }}

{{- define "phasegate.componentSelectorLabels" -}}
{{ include "phasegate.selectorLabels" .ctx }}
app.kubernetes.io/component: {{ .component }}
{{- end }}

{{/* The worker Deployment's name: the autoscalers target it and the fleet view reads it. */}}
{{- define "phasegate.workerDeploymentName" -}}
{{- printf "%s-worker" (include "phasegate.fullname" .) }}
{{- end }}

{{/* ServiceAccount name of a component; call with (dict "ctx" $ "component" "worker"). */}}
{{- define "phasegate.serviceAccountName" -}}
{{- $sa := index .ctx.Values.serviceAccounts .component }}
{{- if $sa.create }}
{{- default (printf "%s-%s" (include "phasegate.fullname" .ctx) .component) $sa.name }}
{{- else }}
{{- default "default" $sa.name }}
{{- end }}
{{- end }}

{{- define "phasegate.image" -}}
{{- printf "%s:%s" .Values.image.repository (default .Chart.AppVersion .Values.image.tag) }}
{{- end }}

{{- define "phasegate.configMapName" -}}
{{- printf "%s-config" (include "phasegate.fullname" .) }}
{{- end }}

{{/* The Secret and key holding the database DSN. */}}
{{- define "phasegate.databaseSecretName" -}}
{{- if .Values.database.existingSecret }}
{{- .Values.database.existingSecret }}
{{- else }}
{{- printf "%s-database" (include "phasegate.fullname" .) }}
{{- end }}
{{- end }}

{{/* Restricted pod-level security context. */}}
{{- define "phasegate.podSecurityContext" -}}
runAsNonRoot: true
runAsUser: {{ .Values.securityContext.runAsUser }}
runAsGroup: {{ .Values.securityContext.runAsGroup }}
fsGroup: {{ .Values.securityContext.runAsGroup }}
seccompProfile:
  type: RuntimeDefault
{{- end }}

{{/* Restricted container-level security context. */}}
{{- define "phasegate.containerSecurityContext" -}}
runAsNonRoot: true
runAsUser: {{ .Values.securityContext.runAsUser }}
runAsGroup: {{ .Values.securityContext.runAsGroup }}
allowPrivilegeEscalation: false
readOnlyRootFilesystem: true
privileged: false
capabilities:
  drop:
    - ALL
seccompProfile:
  type: RuntimeDefault
{{- end }}

{{/* Pod labels that a Fargate profile selector matches. */}}
{{- define "phasegate.fargateLabels" -}}
{{- if .Values.fargate.enabled }}
{{- toYaml .Values.fargate.profileLabels }}
{{- end }}
{{- end }}

{{/* Environment every phasegate container gets: the DSN from a Secret, never inline. */}}
{{- define "phasegate.databaseEnv" -}}
- name: PHASEGATE_DATABASE_URL
  valueFrom:
    secretKeyRef:
      name: {{ include "phasegate.databaseSecretName" . }}
      key: {{ .Values.database.secretKey }}
{{- end }}

{{/*
Checks that make a bad combination fail at render time with a message saying what to change.
*/}}
{{- define "phasegate.validate" -}}
{{- $w := .Values.worker }}
{{- $needed := addf $w.shutdownGraceSeconds $w.shutdownMarginSeconds }}
{{- if le (float64 $w.terminationGracePeriodSeconds) (float64 $needed) }}
{{- fail (printf "worker.terminationGracePeriodSeconds (%v) must be greater than worker.shutdownGraceSeconds (%v) + worker.shutdownMarginSeconds (%v): otherwise Kubernetes kills a draining worker before it hands its messages back" $w.terminationGracePeriodSeconds $w.shutdownGraceSeconds $w.shutdownMarginSeconds) }}
{{- end }}
{{- if ge (float64 $w.heartbeatSeconds) (float64 $w.visibilityTimeoutSeconds) }}
{{- fail (printf "worker.heartbeatSeconds (%v) must be shorter than worker.visibilityTimeoutSeconds (%v)" $w.heartbeatSeconds $w.visibilityTimeoutSeconds) }}
{{- end }}
{{- if and .Values.database.url .Values.database.existingSecret }}
{{- fail "set only one of database.url and database.existingSecret" }}
{{- end }}
{{- if not (or .Values.database.url .Values.database.existingSecret) }}
{{- fail "set database.url or database.existingSecret (the PostgreSQL DSN)" }}
{{- end }}
{{- if not .Values.config.queueUrl }}
{{- fail "config.queueUrl is required: the URL of the SQS FIFO queue" }}
{{- end }}
{{- if not (hasSuffix ".fifo" .Values.config.queueUrl) }}
{{- fail (printf "config.queueUrl (%s) must name a FIFO queue (ending in .fifo)" .Values.config.queueUrl) }}
{{- end }}
{{- if not .Values.config.awsRegion }}
{{- fail "config.awsRegion is required" }}
{{- end }}
{{- if and .Values.orchestrator.fleetView.enabled (eq (include "phasegate.serviceAccountName" (dict "ctx" . "component" "orchestrator")) "default") }}
{{- fail "orchestrator.fleetView.enabled binds a Role to the orchestrator's ServiceAccount, which would be the namespace's \"default\" one (granting every pod that uses it): set serviceAccounts.orchestrator.create or serviceAccounts.orchestrator.name, or set orchestrator.fleetView.enabled false" }}
{{- end }}
{{- $db := .Values.database }}
{{- if and (eq $db.pooler "none") (gt (int $db.connectionBudget) 0) }}
{{- $workers := ternary .Values.worker.replicas .Values.autoscaling.maxReplicas (eq (include "phasegate.autoscalingMode" .) "none") }}
{{- $orchestrator := mul .Values.orchestrator.replicas (max 2 $db.poolMax) }}
{{- $total := add (mul $workers $db.poolMax) $orchestrator }}
{{- if gt (int $total) (int $db.connectionBudget) }}
{{- fail (printf "database.pooler is none, and %d workers x database.poolMax %d + the orchestrator's %d = %d connections exceed database.connectionBudget (%d): put PgBouncer (transaction mode) or RDS Proxy in front and set database.pooler transaction, or lower autoscaling.maxReplicas or database.poolMax" (int $workers) (int $db.poolMax) (int $orchestrator) (int $total) (int $db.connectionBudget)) }}
{{- end }}
{{- end }}
{{- $hpa := .Values.autoscaling.hpa }}
{{- if and (lt (int $hpa.minReplicas) 1) (not $hpa.scaleToZero) }}
{{- fail "autoscaling.hpa.minReplicas 0 is scale to zero, which the API server rejects without the HPAScaleToZero feature gate (stock EKS does not enable it): set autoscaling.hpa.scaleToZero true if your cluster has the gate, or use KEDA (autoscaling.mode keda or auto) for scale to zero" }}
{{- end }}
{{- $keda := .Values.autoscaling.keda }}
{{- if gt (int $keda.minReplicaCount) (int .Values.autoscaling.maxReplicas) }}
{{- fail (printf "autoscaling.keda.minReplicaCount (%v) must not exceed autoscaling.maxReplicas (%v)" $keda.minReplicaCount .Values.autoscaling.maxReplicas) }}
{{- end }}
{{- if and (not (kindIs "invalid" $keda.idleReplicaCount)) (ge (int $keda.idleReplicaCount) (int $keda.minReplicaCount)) }}
{{- fail (printf "autoscaling.keda.idleReplicaCount (%v) must be below autoscaling.keda.minReplicaCount (%v): KEDA ignores it otherwise" $keda.idleReplicaCount $keda.minReplicaCount) }}
{{- end }}
{{- if and (not $keda.authentication.create) (not $keda.authentication.name) }}
{{- fail "autoscaling.keda.authentication.create is false: set autoscaling.keda.authentication.name to the existing TriggerAuthentication or ClusterTriggerAuthentication" }}
{{- end }}
{{- $pi := .Values.autoscaling.keda.podIdentity }}
{{- if and $pi.roleArn (eq $pi.identityOwner "workload") }}
{{- fail "autoscaling.keda.podIdentity: roleArn and identityOwner=workload are mutually exclusive" }}
{{- end }}
{{- end }}
