{{- /*
A worker Deployment; call with (dict "root" $ "component" "worker" "key" "worker" "queues" (list ...)).
`worker` consumes worker.queues; the optional `sweep-worker` pool (values sweepWorker) only sweep.
*/ -}}
{{- define "powerfleet.workerDeployment" -}}
{{- $root := .root }}
{{- $v := index .root.Values .key }}
{{- $c := dict "root" .root "component" .component "key" .key }}
{{- $queues := .queues }}
{{- if not $queues }}{{ fail (printf "%s.queues: give at least one queue (e.g. [control, sweep])" .key) }}{{ end }}
{{- $families := list }}
{{- range $queues }}
{{- if eq . "sweep" }}{{ $families = append $families "sweep" }}
{{- else if hasPrefix "node." . }}{{ $families = append $families "node" }}
{{- else }}{{ $families = append $families "control" }}{{ end }}
{{- end }}
{{- /* Control tasks (budget, retune) call the Kubernetes API; sweep shards never do. */}}
{{- $token := and (eq .component "worker") (include "powerfleet.workerNeedsApi" $root | eq "true") }}
{{- /* The window cut (control) writes and the shards (sweep) read the trace volume. */}}
{{- $traces := and $root.Values.retune.enabled $root.Values.retune.traceVolume }}
{{- /* With retune.window_store: redis the shards read the cut window from Redis, not the volume. */}}
{{- if and (eq .component "sweep-worker") (eq (dig "retune" "window_store" "file" ($root.Values.config | default dict)) "redis") }}
{{- $traces = false }}
{{- end }}
{{- include "powerfleet.serviceAccount" (merge (dict "token" $token) $c) }}
apiVersion: apps/v1
kind: Deployment
metadata:
  name: {{ include "powerfleet.componentName" $c }}
  namespace: {{ $root.Release.Namespace }}
  labels:
    {{- include "powerfleet.labels" $c | nindent 4 }}
spec:
  replicas: {{ int $v.replicas }}
  selector:
    matchLabels:
      {{- include "powerfleet.selectorLabels" $c | nindent 6 }}
  template:
    metadata:
      labels:
        {{- include "powerfleet.labels" $c | nindent 8 }}
      annotations:
        {{- include "powerfleet.checksums" (dict "root" $root "config" "fleet" "secret" true) | trim | nindent 8 }}
        {{- with $v.podAnnotations }}
        {{- toYaml . | nindent 8 }}
        {{- end }}
    spec:
      serviceAccountName: {{ include "powerfleet.serviceAccountName" $c }}
      automountServiceAccountToken: {{ $token }}
      # SIGTERM starts Celery's warm shutdown: running tasks finish (at most their hard time
      # limit) before the process exits, so the grace period must outlast that limit.
      terminationGracePeriodSeconds: {{ include "powerfleet.gracePeriod" (dict "root" $root "component" .key "families" $families "explicit" $v.terminationGracePeriodSeconds "margin" 60) }}
      {{- with $root.Values.imagePullSecrets }}
      imagePullSecrets:
        {{- toYaml . | nindent 8 }}
      {{- end }}
      securityContext:
        {{- toYaml $root.Values.podSecurityContext | nindent 8 }}
      containers:
        - name: worker
          image: {{ include "powerfleet.image" $root }}
          imagePullPolicy: {{ $root.Values.image.pullPolicy }}
          command: ["powerfleet"]
          args:
            - worker
            - --queues
            - {{ join "," $queues | quote }}
            - --name
            - fleet@$(POD_NAME)
            - --concurrency
            - {{ $v.concurrency | quote }}
            - --loglevel
            - {{ $v.loglevel | quote }}
          env:
            - name: POD_NAME
              valueFrom:
                fieldRef:
                  fieldPath: metadata.name
            {{- include "powerfleet.commonEnv" $root | nindent 12 }}
            {{- with $v.extraEnv }}
            {{- toYaml . | nindent 12 }}
            {{- end }}
          {{- with include "powerfleet.metricsPort" $root }}
          ports:
            {{- . | nindent 12 }}
          {{- end }}
          {{- with $v.livenessProbe }}
          {{- if .enabled }}
          # Exec probes get no $(VAR) expansion for downward-API variables, hence sh -c.
          livenessProbe:
            exec:
              command:
                - sh
                - -c
                - exec celery -A powerfleet.workers.entry inspect ping -d "fleet@${POD_NAME}" --timeout 10 >/dev/null
            initialDelaySeconds: {{ int .initialDelaySeconds }}
            periodSeconds: {{ int .periodSeconds }}
            timeoutSeconds: {{ int .timeoutSeconds }}
            failureThreshold: {{ int .failureThreshold }}
          {{- end }}
          {{- end }}
          securityContext:
            {{- toYaml $root.Values.securityContext | nindent 12 }}
          volumeMounts:
            {{- include "powerfleet.configVolumeMounts" $root | nindent 12 }}
            {{- if $traces }}
            - name: traces
              mountPath: {{ $root.Values.retune.traceMountPath }}
            {{- end }}
          resources:
            {{- toYaml $v.resources | nindent 12 }}
      volumes:
        {{- include "powerfleet.configVolumes" (dict "root" $root "file" "fleet.yaml") | nindent 8 }}
        {{- if $traces }}
        - name: traces
          {{- toYaml $root.Values.retune.traceVolume | nindent 10 }}
        {{- end }}
      {{- with $v.nodeSelector }}
      nodeSelector:
        {{- toYaml . | nindent 8 }}
      {{- end }}
      {{- with $v.tolerations }}
      tolerations:
        {{- toYaml . | nindent 8 }}
      {{- end }}
      {{- with $v.affinity }}
      affinity:
        {{- toYaml . | nindent 8 }}
      {{- end }}
{{- if $v.pdb.enabled }}
---
# A drain evicts at most maxUnavailable workers at a time; each finishes its running tasks
# within its grace period (Celery warm shutdown).
apiVersion: policy/v1
kind: PodDisruptionBudget
metadata:
  name: {{ include "powerfleet.componentName" $c }}
  namespace: {{ $root.Release.Namespace }}
  labels:
    {{- include "powerfleet.labels" $c | nindent 4 }}
spec:
  maxUnavailable: {{ $v.pdb.maxUnavailable }}
  selector:
    matchLabels:
      {{- include "powerfleet.selectorLabels" $c | nindent 6 }}
{{- end }}
{{- end }}
