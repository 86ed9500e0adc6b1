{{/* Names */}}
{{- define "powerfleet.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" }}
{{- end }}

{{- define "powerfleet.fullname" -}}
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

{{/* A component's resource name: <fullname>-<component>, within 63 characters. */}}
{{- define "powerfleet.componentName" -}}
{{- printf "%s-%s" (include "powerfleet.fullname" .root | trunc (int (sub 62 (len .component))) | trimSuffix "-") .component }}
{{- end }}

{{/* Cluster-scoped names must not collide between releases in different namespaces. */}}
{{- define "powerfleet.clusterName" -}}
{{- printf "%s-%s-%s" .root.Release.Namespace (include "powerfleet.fullname" .root) .component }}
{{- end }}

{{- define "powerfleet.chart" -}}
{{- printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/* Labels; call with (dict "root" $ "component" "worker"). */}}
{{- define "powerfleet.labels" -}}
helm.sh/chart: {{ include "powerfleet.chart" .root }}
{{ include "powerfleet.selectorLabels" . }}
app.kubernetes.io/version: {{ .root.Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .root.Release.Service }}
app.kubernetes.io/part-of: powerfleet
{{- end }}

{{- define "powerfleet.selectorLabels" -}}
app.kubernetes.io/name: {{ include "powerfleet.name" .root }}
app.kubernetes.io/instance: {{ .root.Release.Name }}
app.kubernetes.io/component: {{ .component }}
{{- end }}

{{/* Every pod of this release carries these; the NetworkPolicies admit exactly them. */}}
{{- define "powerfleet.releasePodLabels" -}}
app.kubernetes.io/name: {{ include "powerfleet.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end }}

{{/* repository:tag or repository@digest (the schema admits exactly one of them). */}}
{{- define "powerfleet.image" -}}
{{- if .Values.image.digest }}
{{- printf "%s@%s" .Values.image.repository .Values.image.digest }}
{{- else }}
{{- printf "%s:%s" .Values.image.repository (toString .Values.image.tag) }}
{{- end }}
{{- end }}

{{/* The ServiceAccount a component runs as; call with (dict "root" $ "component" "worker"), plus
"key" when its values key differs from the component name (sweep-worker: sweepWorker). */}}
{{- define "powerfleet.serviceAccountName" -}}
{{- $sa := (index .root.Values (default .component .key)).serviceAccount }}
{{- if $sa.create }}
{{- default (include "powerfleet.componentName" .) $sa.name }}
{{- else }}
{{- default "default" $sa.name }}
{{- end }}
{{- end }}

{{/* The ServiceAccount object when serviceAccount.create; token mounted only when `token` is true. */}}
{{- define "powerfleet.serviceAccount" -}}
{{- $sa := (index .root.Values (default .component .key)).serviceAccount }}
{{- if $sa.create }}
apiVersion: v1
kind: ServiceAccount
metadata:
  name: {{ include "powerfleet.serviceAccountName" . }}
  namespace: {{ .root.Release.Namespace }}
  labels:
    {{- include "powerfleet.labels" . | nindent 4 }}
  {{- with $sa.annotations }}
  annotations:
    {{- toYaml . | nindent 4 }}
  {{- end }}
automountServiceAccountToken: {{ .token }}
---
{{- end }}
{{- end }}

{{- define "powerfleet.configMapName" -}}
{{- include "powerfleet.componentName" (dict "root" . "component" "config") }}
{{- end }}

{{/* ---------- Features: who needs the Kubernetes API ---------- */}}

{{/* "true" when the workers consume the control queue (where budget and retune run). */}}
{{- define "powerfleet.workerRunsControl" -}}
{{- ternary "true" "" (and .Values.worker.enabled (has "control" .Values.worker.queues)) }}
{{- end }}

{{/* "true" when the workers call the Kubernetes API at all (their token is mounted only then). */}}
{{- define "powerfleet.workerNeedsApi" -}}
{{- ternary "true" "" (and (include "powerfleet.workerRunsControl" . | eq "true") (or .Values.budget.enabled .Values.retune.enabled)) }}
{{- end }}

{{/*
Namespaces the control workers reach DGDs, pods and events in without rbac.watchAllNamespaces:
the release namespace and those the config names (budget deployments "namespace/name",
retune per-deployment namespaces). A JSON list.
*/}}
{{- define "powerfleet.workerNamespaces" -}}
{{- $cfg := .Values.config | default dict }}
{{- $out := list .Release.Namespace }}
{{- if .Values.budget.enabled }}
{{- range $key, $_ := (dig "budget" "deployments" dict $cfg) }}
{{- $out = append $out (first (splitList "/" $key)) }}
{{- end }}
{{- end }}
{{- if .Values.retune.enabled }}
{{- range $_, $d := (dig "retune" "per_deployment" dict $cfg) }}
{{- with (get ($d | default dict) "namespace") }}{{ $out = append $out . }}{{ end }}
{{- end }}
{{- end }}
{{- $out | uniq | toJson }}
{{- end }}

{{/* ---------- Config ---------- */}}

{{/* Keys the chart writes into the FleetConfig from its own values; `config` must not set them. */}}
{{- define "powerfleet.checkConfig" -}}
{{- $cfg := .Values.config | default dict }}
{{- $broker := get $cfg "broker" | default dict }}
{{- if or (get $broker "url") (get $broker "result_backend") }}
{{- fail "config.broker.url / config.broker.result_backend must not be set: a broker URL carries a password and would land in a ConfigMap. Put it in a Secret and set broker.existingSecret.name (or use redis.enabled=true)." }}
{{- end }}
{{- $flower := get $cfg "flower" | default dict }}
{{- if get $flower "basic_auth" }}
{{- fail "config.flower.basic_auth must not be set: credentials would land in a ConfigMap. Put them in a Secret and set flower.basicAuthSecret.name." }}
{{- end }}
{{- if hasKey $cfg "metrics" }}
{{- fail "config.metrics must not be set: use .Values.metrics.port (the chart sets the bind address and the container ports from it)." }}
{{- end }}
{{- if and (dig "budget" "deployments" dict $cfg) (not .Values.budget.enabled) }}
{{- fail "config.budget.deployments lists deployments, but budget.enabled=false grants the workers no access to them: set budget.enabled=true" }}
{{- end }}
{{- if and (dig "retune" "deployments" list $cfg) (not .Values.retune.enabled) }}
{{- fail "config.retune.deployments lists deployments, but retune.enabled=false grants the workers no Leases: set retune.enabled=true" }}
{{- end }}
{{- $agent := get $cfg "agent" | default dict }}
{{- range $key, $value := dict "safe_default_watts" "agent.safeDefaultWatts" "state_dir" "agent.stateDir" "proc_root" "agent.hostProcPath" "namespaces" "agent.namespaces" "probe_port" "agent.readinessProbe.port" "probe_address" "agent.readinessProbe.port" "kubeconfig" "the in-cluster ServiceAccount" "enforcement_annotation" "agent.enforcementReport.enabled" }}
{{- if hasKey $agent $key }}
{{- fail (printf "config.agent.%s must not be set: use %s (the chart mounts and grants what it names)." $key $value) }}
{{- end }}
{{- end }}
{{- end }}

{{/* The full FleetConfig (fleet.yaml): .Values.config plus `metrics`. Beat, workers, Flower. */}}
{{- define "powerfleet.fleetConfig" -}}
{{- include "powerfleet.checkConfig" . }}
{{- $cfg := deepCopy (.Values.config | default dict) }}
{{- $port := int .Values.metrics.port }}
{{- $_ := set $cfg "metrics" (dict "port" $port "address" (ternary "0.0.0.0" "127.0.0.1" (gt $port 0))) }}
{{- if .Values.retune.enabled }}
{{- $retune := get $cfg "retune" | default dict }}
{{- /* The retune Leases live in config.retune.namespace; the chart grants them only here. */}}
{{- $ns := get $retune "namespace" | default .Release.Namespace }}
{{- if ne $ns .Release.Namespace }}
{{- fail (printf "config.retune.namespace (%s) holds the retune Leases, which the chart grants only in the release namespace (%s): leave it unset, and name other DGD namespaces in config.retune.per_deployment.<dgd>.namespace" $ns .Release.Namespace) }}
{{- end }}
{{- $_ := set $retune "namespace" $ns }}
{{- if .Values.retune.traceVolume }}
{{- $dir := get $retune "trace_dir" | default .Values.retune.traceMountPath }}
{{- if ne $dir .Values.retune.traceMountPath }}
{{- fail (printf "config.retune.trace_dir (%s) must be where the trace volume is mounted (retune.traceMountPath, %s)" $dir .Values.retune.traceMountPath) }}
{{- end }}
{{- $_ := set $retune "trace_dir" $dir }}
{{- end }}
{{- $_ := set $cfg "retune" $retune }}
{{- end }}
{{- toYaml $cfg }}
{{- end }}

{{/*
The agent's FleetConfig (agent.yaml): only the sections the agent process reads, plus the
agent settings the chart owns. Other sections (retune, budget, flower) stay out, so changing
them does not roll the agents.
*/}}
{{- define "powerfleet.agentSections" -}}
{{- list "broker" "beat" "limits" "nodes" "agent" "power" | toJson }}
{{- end }}

{{- /* The oversubscribed groups only (budget.groups with a budget.group_oversubscription above 1;
the chart's schema takes the plain form of groups): the agent accepts the power guard's overlays
for them and keeps its safe caps across a restart (docs/power.md); other budget settings do not
roll the agents. */}}
{{- define "powerfleet.agentBudget" -}}
{{- $budget := get . "budget" | default dict }}
{{- $ratios := get $budget "group_oversubscription" | default dict }}
{{- $groups := dict }}
{{- $keep := dict }}
{{- range $g, $v := (get $budget "groups" | default dict) }}
{{- if gt (float64 (get $ratios $g | default 1)) 1.0 }}
{{- $_ := set $groups $g $v }}{{ $_ := set $keep $g (get $ratios $g) }}
{{- end }}
{{- end }}
{{- $out := dict }}
{{- if $groups }}{{ $_ := set $out "groups" $groups }}{{ end }}
{{- if $keep }}{{ $_ := set $out "group_oversubscription" $keep }}{{ end }}
{{- toJson $out }}
{{- end }}

{{- define "powerfleet.agentConfig" -}}
{{- $full := include "powerfleet.fleetConfig" . | fromYaml }}
{{- $cfg := dict }}
{{- range (include "powerfleet.agentSections" . | fromJsonArray) }}
{{- if hasKey $full . }}{{ $_ := set $cfg . (get $full .) }}{{ end }}
{{- end }}
{{- $agentBudget := include "powerfleet.agentBudget" $full | fromJson }}
{{- if $agentBudget }}{{ $_ := set $cfg "budget" $agentBudget }}{{ end }}
{{- $agent := deepCopy (get $cfg "agent" | default dict) }}
{{- $_ := set $agent "safe_default_watts" .Values.agent.safeDefaultWatts }}
{{- $_ := set $agent "state_dir" .Values.agent.stateDir }}
{{- $_ := set $agent "proc_root" "/host/proc" }}
{{- $_ := set $agent "namespaces" .Values.agent.namespaces }}
{{- /* /readyz (and the agent's own /metrics) for the kubelet and Prometheus. */}}
{{- $_ := set $agent "probe_port" (int .Values.agent.readinessProbe.port) }}
{{- $_ := set $agent "probe_address" "0.0.0.0" }}
{{- /* Granted (pods get/patch) and guarded (agent-admission.yaml) only together with this. */}}
{{- $_ := set $agent "enforcement_annotation" .Values.agent.enforcementReport.enabled }}
{{- $_ := set $cfg "agent" $agent }}
{{- toYaml $cfg }}
{{- end }}

{{/* A family's hard time limit in whole seconds (defaults as in FleetConfig). */}}
{{- define "powerfleet.hardLimit" -}}
{{- $defaults := dict "control" 90 "sweep" 660 "node" 30 }}
{{- $v := dig "limits" .family "hard_s" (get $defaults .family) (.root.Values.config | default dict) }}
{{- ceil $v | int }}
{{- end }}

{{/* terminationGracePeriodSeconds: explicit (checked) or the hard limit plus a margin. */}}
{{- define "powerfleet.gracePeriod" -}}
{{- $hard := 0 }}
{{- range .families }}
{{- $h := include "powerfleet.hardLimit" (dict "root" $.root "family" .) | int }}
{{- if gt $h $hard }}{{ $hard = $h }}{{ end }}
{{- end }}
{{- if ne (toString .explicit) "" }}
{{- if le (int .explicit) $hard }}
{{- fail (printf "%s.terminationGracePeriodSeconds (%d) must exceed the hard time limit of its tasks (%d s), or Kubernetes kills tasks that Celery would finish" .component (int .explicit) $hard) }}
{{- end }}
{{- int .explicit }}
{{- else }}
{{- add $hard .margin }}
{{- end }}
{{- end }}

{{/* ---------- Secrets ---------- */}}

{{- define "powerfleet.redisSecretName" -}}
{{- if .Values.redis.auth.existingSecret }}
{{- .Values.redis.auth.existingSecret }}
{{- else }}
{{- include "powerfleet.componentName" (dict "root" . "component" "redis") }}
{{- end }}
{{- end }}

{{- define "powerfleet.redisSecretKey" -}}
{{- if .Values.redis.auth.existingSecret }}{{ .Values.redis.auth.existingSecretKey }}{{ else }}redis-password{{ end }}
{{- end }}

{{/*
The in-chart Redis password: redis.auth.password, else the one already in the cluster's Secret
(kept across upgrades), else a new random one. Memoised in .Values for this render, so the
Secret and the checksum/secret annotations see the same value.
*/}}
{{- define "powerfleet.redisPassword" -}}
{{- if not (hasKey .Values.redis.auth "_rendered") }}
{{- $password := .Values.redis.auth.password }}
{{- if not $password }}
{{- $name := include "powerfleet.componentName" (dict "root" . "component" "redis") }}
{{- $existing := lookup "v1" "Secret" .Release.Namespace $name }}
{{- if and $existing (index ($existing.data | default dict) "redis-password") }}
{{- $password = index $existing.data "redis-password" | b64dec }}
{{- else }}
{{- $password = randAlphaNum 32 }}
{{- end }}
{{- end }}
{{- if not (regexMatch "^[A-Za-z0-9._~-]+$" $password) }}
{{- fail "redis.auth.password: use URL-safe characters only (A-Z a-z 0-9 . _ ~ -); it is placed in the broker URL" }}
{{- end }}
{{- $_ := set .Values.redis.auth "_rendered" $password }}
{{- end }}
{{- .Values.redis.auth._rendered }}
{{- end }}

{{/* The Secret the chart creates for its Redis (only without redis.auth.existingSecret). */}}
{{- define "powerfleet.redisSecret" -}}
{{- $c := dict "root" . "component" "redis" }}
apiVersion: v1
kind: Secret
metadata:
  name: {{ include "powerfleet.componentName" $c }}
  namespace: {{ .Release.Namespace }}
  labels:
    {{- include "powerfleet.labels" $c | nindent 4 }}
type: Opaque
data:
  redis-password: {{ include "powerfleet.redisPassword" . | b64enc | quote }}
{{- end }}

{{/*
Pod annotations that roll a pod when what it reads changes: `checksum/config` over its own
config file only, and `checksum/secret` when it reads a Secret the chart renders. Secrets the
chart does not render (broker.existingSecret, flower.basicAuthSecret, redis.auth.existingSecret)
are yours to rotate: `kubectl rollout restart` afterwards (docs/deploy.md).
Call with (dict "root" $ "config" "fleet"|"agent"|"" "secret" true|false).
*/}}
{{- define "powerfleet.checksums" -}}
{{- if eq .config "fleet" }}
checksum/config: {{ include "powerfleet.fleetConfig" .root | sha256sum }}
{{- else if eq .config "agent" }}
checksum/config: {{ include "powerfleet.agentConfig" .root | sha256sum }}
{{- end }}
{{- if and .secret (include "powerfleet.redisInChart" .root) (not .root.Values.redis.auth.existingSecret) }}
checksum/secret: {{ include "powerfleet.redisSecret" .root | sha256sum }}
{{- end }}
{{- end }}

{{/* Bytes of a Redis memory size ("384mb", "1gb", "500m", "1024"); Redis's k/m/g are powers of 1000, kb/mb/gb of 1024. */}}
{{- define "powerfleet.redisBytes" -}}
{{- $n := regexReplaceAll "^([0-9]+).*$" . "${1}" | int64 }}
{{- $unit := regexReplaceAll "^[0-9]+" . "" | lower }}
{{- $mult := dict "" 1 "b" 1 "k" 1000 "kb" 1024 "m" 1000000 "mb" 1048576 "g" 1000000000 "gb" 1073741824 }}
{{- mul $n (get $mult $unit | int64) }}
{{- end }}

{{/* Bytes of a Kubernetes memory quantity, or 0 when it is not one of the plain forms. */}}
{{- define "powerfleet.quantityBytes" -}}
{{- $q := toString . }}
{{- if regexMatch "^[0-9]+(Ki|Mi|Gi|Ti|k|M|G|T)?$" $q }}
{{- $n := regexReplaceAll "^([0-9]+).*$" $q "${1}" | int64 }}
{{- $unit := regexReplaceAll "^[0-9]+" $q "" }}
{{- $mult := dict "" 1 "k" 1000 "M" 1000000 "G" 1000000000 "T" 1000000000000 "Ki" 1024 "Mi" 1048576 "Gi" 1073741824 "Ti" 1099511627776 }}
{{- mul $n (get $mult $unit | int64) }}
{{- else }}0{{ end }}
{{- end }}

{{/* ---------- Environment ---------- */}}

{{/* POWERFLEET_BROKER__URL (and the result backend) from a Secret; never a literal URL with a password. */}}
{{- define "powerfleet.brokerEnv" -}}
{{- $inChart := include "powerfleet.redisInChart" . }}
{{- if and .Values.broker.existingSecret.name $inChart }}
{{- fail "set either broker.existingSecret.name (an external broker) or redis.enabled=true (the in-chart Redis), not both" }}
{{- else if .Values.broker.existingSecret.name }}
- name: POWERFLEET_BROKER__URL
  valueFrom:
    secretKeyRef:
      name: {{ .Values.broker.existingSecret.name }}
      key: {{ .Values.broker.existingSecret.key }}
{{- if .Values.broker.existingSecret.resultBackendKey }}
- name: POWERFLEET_BROKER__RESULT_BACKEND
  valueFrom:
    secretKeyRef:
      name: {{ .Values.broker.existingSecret.name }}
      key: {{ .Values.broker.existingSecret.resultBackendKey }}
{{- end }}
{{- else if $inChart }}
- name: REDIS_PASSWORD
  valueFrom:
    secretKeyRef:
      name: {{ include "powerfleet.redisSecretName" . }}
      key: {{ include "powerfleet.redisSecretKey" . }}
{{- if eq .Values.redis.mode "sentinel" }}
# Every Sentinel, so a client finds the master while any one of them answers. The password in
# the first entry is the Redis nodes'; the Sentinels' own (the same one here) is a variable.
- name: POWERFLEET_BROKER__URL
  value: {{ include "powerfleet.sentinelUrls" . | quote }}
# Single-quoted: POWERFLEET_* values are read as YAML, where 0123 or true would not be strings.
- name: POWERFLEET_BROKER__SENTINEL__MASTER_NAME
  value: {{ printf "'%s'" .Values.redis.sentinel.masterName | quote }}
- name: POWERFLEET_BROKER__SENTINEL__PASSWORD
  value: "'$(REDIS_PASSWORD)'"
{{- else }}
# Kubernetes expands $(REDIS_PASSWORD) when it starts the container; the pod spec holds no password.
- name: POWERFLEET_BROKER__URL
  value: {{ printf "redis://:$(REDIS_PASSWORD)@%s.%s.svc:6379/0" (include "powerfleet.componentName" (dict "root" . "component" "redis")) .Release.Namespace | quote }}
{{- end }}
{{- else if .Values.redis.external.url }}
{{- if regexMatch "@" .Values.redis.external.url }}
{{- fail "redis.external.url must not carry a password (it would sit in the pod spec): put the URL in a Secret and set broker.existingSecret.name" }}
{{- end }}
- name: POWERFLEET_BROKER__URL
  value: {{ .Values.redis.external.url | quote }}
{{- else }}
{{- fail "no broker: set broker.existingSecret.name to a Secret holding the broker URL, redis.external.url (redis.mode=external), or redis.enabled=true" }}
{{- end }}
{{- end }}

{{/* "true" when the chart runs Redis itself (redis.enabled and redis.mode standalone or sentinel), else "". */}}
{{- define "powerfleet.redisInChart" -}}
{{- if and .Values.redis.enabled (ne .Values.redis.mode "external") }}true{{ end }}
{{- end }}

{{/* The in-chart Sentinels as a broker URL: sentinel://:$(REDIS_PASSWORD)@<pod>.<headless>:26379/0;... */}}
{{- define "powerfleet.sentinelUrls" -}}
{{- $name := include "powerfleet.componentName" (dict "root" . "component" "redis") }}
{{- $urls := list }}
{{- range $i := until 3 }}
{{- $auth := ternary ":$(REDIS_PASSWORD)@" "" (eq $i 0) }}
{{- $urls = append $urls (printf "sentinel://%s%s-%d.%s-headless.%s.svc:26379/0" $auth $name $i $name $.Release.Namespace) }}
{{- end }}
{{- join ";" $urls }}
{{- end }}

{{/* Env shared by every powerfleet container: config file, broker. */}}
{{- define "powerfleet.commonEnv" -}}
- name: POWERFLEET_CONFIG
  value: /etc/powerfleet/powerfleet.yaml
{{ include "powerfleet.brokerEnv" . | trim }}
{{- end }}

{{/* The config volume: one file of the ConfigMap (fleet.yaml or agent.yaml) as powerfleet.yaml. */}}
{{- define "powerfleet.configVolumeMounts" -}}
- name: config
  mountPath: /etc/powerfleet
  readOnly: true
- name: tmp
  mountPath: /tmp
{{- end }}

{{- define "powerfleet.configVolumes" -}}
- name: config
  configMap:
    name: {{ include "powerfleet.configMapName" .root }}
    items:
      - key: {{ .file }}
        path: powerfleet.yaml
- name: tmp
  emptyDir: {}
{{- end }}

{{/* The metrics container port, when metrics are on. */}}
{{- define "powerfleet.metricsPort" -}}
{{- if gt (int .Values.metrics.port) 0 }}
- name: metrics
  containerPort: {{ int .Values.metrics.port }}
  protocol: TCP
{{- end }}
{{- end }}
