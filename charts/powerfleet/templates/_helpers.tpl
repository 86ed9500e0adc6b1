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

{{- define "powerfleet.image" -}}
{{- printf "%s:%s" .Values.image.repository (default .Chart.AppVersion .Values.image.tag | toString) }}
{{- end }}

{{- define "powerfleet.configMapName" -}}
{{- include "powerfleet.componentName" (dict "root" . "component" "config") }}
{{- end }}

{{/* ---------- Config ---------- */}}

{{/*
The FleetConfig written to the ConfigMap: .Values.config plus `metrics` from .Values.metrics.
Fails on anything secret (broker URLs, Flower credentials): those come from Secrets.
*/}}
{{- define "powerfleet.fleetConfig" -}}
{{- $cfg := deepCopy (.Values.config | default dict) }}
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
{{- $port := int .Values.metrics.port }}
{{- if or (lt $port 0) (gt $port 65535) }}
{{- fail (printf "metrics.port must be 0..65535, got %d" $port) }}
{{- end }}
{{- $_ := set $cfg "metrics" (dict "port" $port "address" (ternary "0.0.0.0" "127.0.0.1" (gt $port 0))) }}
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

{{/* ---------- Environment ---------- */}}

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

{{/* POWERFLEET_BROKER__URL (and the result backend) from a Secret; never a literal URL with a password. */}}
{{- define "powerfleet.brokerEnv" -}}
{{- if and .Values.broker.existingSecret.name .Values.redis.enabled }}
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
{{- else if .Values.redis.enabled }}
- name: REDIS_PASSWORD
  valueFrom:
    secretKeyRef:
      name: {{ include "powerfleet.redisSecretName" . }}
      key: {{ include "powerfleet.redisSecretKey" . }}
# Kubernetes expands $(REDIS_PASSWORD) when it starts the container; the pod spec holds no password.
- name: POWERFLEET_BROKER__URL
  value: {{ printf "redis://:$(REDIS_PASSWORD)@%s.%s.svc:6379/0" (include "powerfleet.componentName" (dict "root" . "component" "redis")) .Release.Namespace | quote }}
{{- else }}
{{- fail "no broker: set broker.existingSecret.name to a Secret holding the broker URL, or redis.enabled=true" }}
{{- end }}
{{- end }}

{{/* Env shared by every powerfleet container: config file, broker. */}}
{{- define "powerfleet.commonEnv" -}}
- name: POWERFLEET_CONFIG
  value: /etc/powerfleet/powerfleet.yaml
{{ include "powerfleet.brokerEnv" . | trim }}
{{- end }}

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
    name: {{ include "powerfleet.configMapName" . }}
- name: tmp
  emptyDir: {}
{{- end }}

{{/* Pod annotation that rolls the pods when the config changes. */}}
{{- define "powerfleet.configChecksum" -}}
checksum/config: {{ include "powerfleet.fleetConfig" . | sha256sum }}
{{- end }}
