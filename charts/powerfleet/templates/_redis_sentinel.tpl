{{/*
The in-chart Redis in redis.mode=sentinel: three pods, each a Redis node and a Sentinel.
At start each container asks the Sentinels who the master is; when none answers (first
install) pod 0 is the master and the others replicate it. Pods are named by their stable
DNS names (resolve-hostnames/announce-hostnames), so a rescheduled pod keeps its identity.
*/}}

{{/* Shell: sets $self and $master (asking every Sentinel, falling back to pod 0). */}}
{{- define "powerfleet.sentinelDiscovery" -}}
{{- $name := include "powerfleet.componentName" (dict "root" . "component" "redis") -}}
{{- $domain := printf "%s-headless.%s.svc" $name .Release.Namespace -}}
self="$(hostname).{{ $domain }}"
master=""
for i in 0 1 2; do
  out="$(timeout 3 redis-cli -h "{{ $name }}-$i.{{ $domain }}" -p 26379 sentinel get-master-addr-by-name {{ .Values.redis.sentinel.masterName }} 2>/dev/null | head -n 1)"
  if [ -n "$out" ]; then master="$out"; break; fi
done
[ -n "$master" ] || master="{{ $name }}-0.{{ $domain }}"
{{- end }}

{{- define "powerfleet.sentinelContainers" -}}
{{- $s := .Values.redis.sentinel }}
{{- $image := printf "%s:%s" .Values.redis.image.repository (toString .Values.redis.image.tag) }}
- name: redis
  image: {{ $image }}
  imagePullPolicy: {{ .Values.redis.image.pullPolicy }}
  # Passwords go into config files on a memory-backed emptyDir, never onto a command line.
  # AOF always on; min-replicas-to-write makes the master refuse writes (NOREPLICAS, which the
  # fleet retries) rather than acknowledge what a failover would lose.
  command: ["sh", "-c"]
  args:
    - |
      umask 077
      {{- include "powerfleet.sentinelDiscovery" . | nindent 6 }}
      {
        printf 'requirepass "%s"\nmasterauth "%s"\n' "$REDIS_PASSWORD" "$REDIS_PASSWORD"
        printf 'replica-announce-ip %s\n' "$self"
        if [ "$master" != "$self" ]; then printf 'replicaof %s 6379\n' "$master"; fi
      } > /run/redis/redis.conf
      exec redis-server /run/redis/redis.conf \
        --port 6379 \
        --dir /data \
        --maxmemory {{ .Values.redis.maxmemory | quote }} \
        --maxmemory-policy noeviction \
        --maxclients {{ .Values.redis.maxclients | int }} \
        --appendonly yes \
        --save '' \
        --repl-diskless-sync yes \
        --min-replicas-to-write {{ int $s.minReplicasToWrite }} \
        --min-replicas-max-lag {{ int $s.minReplicasMaxLag }}
  env:
    {{- include "powerfleet.redisPasswordEnv" . | nindent 4 }}
  ports:
    - name: redis
      containerPort: 6379
      protocol: TCP
  readinessProbe:
    exec:
      command: ["sh", "-c", "redis-cli -h 127.0.0.1 ping | grep -q PONG"]
    periodSeconds: 10
    timeoutSeconds: 5
  livenessProbe:
    tcpSocket:
      port: redis
    initialDelaySeconds: 15
    periodSeconds: 20
  securityContext:
    {{- toYaml .Values.redis.securityContext | nindent 4 }}
  volumeMounts:
    - name: data
      mountPath: /data
    - name: run
      mountPath: /run/redis
  resources:
    {{- toYaml .Values.redis.resources | nindent 4 }}
- name: sentinel
  image: {{ $image }}
  imagePullPolicy: {{ .Values.redis.image.pullPolicy }}
  command: ["sh", "-c"]
  args:
    - |
      umask 077
      {{- include "powerfleet.sentinelDiscovery" . | nindent 6 }}
      m={{ $s.masterName }}
      {
        printf 'port 26379\nsentinel resolve-hostnames yes\nsentinel announce-hostnames yes\n'
        printf 'sentinel announce-ip %s\n' "$self"
        printf 'requirepass "%s"\nsentinel sentinel-pass "%s"\n' "$REDIS_PASSWORD" "$REDIS_PASSWORD"
        printf 'sentinel monitor %s %s 6379 {{ int $s.quorum }}\n' "$m" "$master"
        printf 'sentinel auth-pass %s "%s"\n' "$m" "$REDIS_PASSWORD"
        printf 'sentinel down-after-milliseconds %s {{ int $s.downAfterMilliseconds }}\n' "$m"
        printf 'sentinel failover-timeout %s {{ int $s.failoverTimeoutMilliseconds }}\n' "$m"
        printf 'sentinel parallel-syncs %s 1\n' "$m"
      } > /run/sentinel/sentinel.conf
      # Sentinel rewrites its file with what it learns (replicas, peers, epochs).
      exec redis-server /run/sentinel/sentinel.conf --sentinel
  env:
    {{- include "powerfleet.redisPasswordEnv" . | nindent 4 }}
  ports:
    - name: sentinel
      containerPort: 26379
      protocol: TCP
  readinessProbe:
    exec:
      command: ["sh", "-c", "redis-cli -h 127.0.0.1 -p 26379 ping | grep -q PONG"]
    periodSeconds: 10
    timeoutSeconds: 5
  livenessProbe:
    tcpSocket:
      port: sentinel
    initialDelaySeconds: 15
    periodSeconds: 20
  securityContext:
    {{- toYaml .Values.redis.securityContext | nindent 4 }}
  volumeMounts:
    - name: sentinel
      mountPath: /run/sentinel
  resources:
    {{- toYaml $s.resources | nindent 4 }}
{{- end }}

{{/* REDIS_PASSWORD (for the config files) and REDISCLI_AUTH (for the probes' redis-cli). */}}
{{- define "powerfleet.redisPasswordEnv" -}}
{{- range $var := list "REDIS_PASSWORD" "REDISCLI_AUTH" }}
- name: {{ $var }}
  valueFrom:
    secretKeyRef:
      name: {{ include "powerfleet.redisSecretName" $ }}
      key: {{ include "powerfleet.redisSecretKey" $ }}
{{- end }}
{{- end }}

{{/* Redis pods on different nodes: one node lost or drained never takes two of them. */}}
{{- define "powerfleet.sentinelAntiAffinity" -}}
{{- $c := dict "root" . "component" "redis" }}
{{- $term := dict "topologyKey" "kubernetes.io/hostname" "labelSelector" (dict "matchLabels" (include "powerfleet.selectorLabels" $c | fromYaml)) }}
podAntiAffinity:
{{- if eq .Values.redis.sentinel.antiAffinity "hard" }}
  requiredDuringSchedulingIgnoredDuringExecution:
    {{- toYaml (list $term) | nindent 4 }}
{{- else }}
  preferredDuringSchedulingIgnoredDuringExecution:
    {{- toYaml (list (dict "weight" 100 "podAffinityTerm" $term)) | nindent 4 }}
{{- end }}
{{- end }}
