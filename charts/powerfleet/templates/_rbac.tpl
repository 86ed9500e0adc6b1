{{- /*
RBAC rule sets, one per feature; rbac.yaml grants their union per ServiceAccount. Each verb must
be one the Kubernetes adapter (src/powerfleet/cluster/) calls for that feature:
tests/charts/test_chart_rbac.py compares them with the adapter's client calls.
*/ -}}
{{- define "powerfleet.rules.budget" -}}
- apiGroups: ["nvidia.com"]
  resources: ["dynamographdeployments"]
  verbs: ["get", "list", "patch"]
- apiGroups: ["nvidia.com"]
  resources: ["dynamographdeployments/status"]
  verbs: ["patch"]
- apiGroups: [""]
  resources: ["pods"]
  verbs: ["list"]
- apiGroups: [""]
  resources: ["events"]
  verbs: ["create"]
- apiGroups: [""]
  resources: ["configmaps"]
  verbs: ["get", "create", "patch"]
- apiGroups: ["nvidia.com"]
  resources: ["dynamographdeploymentscalingadapters"]
  verbs: ["list", "patch"]
- apiGroups: ["resource.k8s.io"]
  resources: ["resourceclaimtemplates"]
  verbs: ["list"]
{{- end }}
{{- /*
Group (rack) budgets: one LIST of the nodes (their group label), and of every DGD and
deployment pod in the cluster, since any tenant's pods on a rack count against its budget.
A ClusterRole whatever rbac.watchAllNamespaces says; only with config.budget.groups. With
config.budget.pod_source "watch" each control process keeps those pods by a WATCH as well.
*/}}
{{- define "powerfleet.rules.budget-groups" -}}
- apiGroups: [""]
  resources: ["nodes"]
  verbs: ["list"]
- apiGroups: ["nvidia.com"]
  resources: ["dynamographdeployments"]
  verbs: ["list"]
- apiGroups: [""]
  resources: ["pods"]
  verbs: {{ if eq (dig "budget" "pod_source" "list" (.Values.config | default dict)) "watch" }}["list", "watch"]{{ else }}["list"]{{ end }}
{{- end }}
{{- define "powerfleet.rules.retune" -}}
- apiGroups: ["nvidia.com"]
  resources: ["dynamographdeployments"]
  verbs: ["get"]
- apiGroups: [""]
  resources: ["pods"]
  verbs: ["list"]
- apiGroups: [""]
  resources: ["events"]
  verbs: ["create"]
{{- end }}
{{- define "powerfleet.rules.leases" -}}
- apiGroups: ["coordination.k8s.io"]
  resources: ["leases"]
  verbs: ["get", "create", "update", "delete"]
{{- end }}
{{- define "powerfleet.rules.agent" -}}
- apiGroups: [""]
  resources: ["pods"]
  verbs: ["list", "watch"]
{{- end }}
{{- /*
The enforcement report annotation (agent.enforcementReport.enabled): a re-read after a 409 and
the patch. RBAC cannot narrow a patch to one annotation or one node; the chart's
ValidatingAdmissionPolicy (agent-admission.yaml) does, for this ServiceAccount.
*/}}
{{- define "powerfleet.rules.agent-report" -}}
- apiGroups: [""]
  resources: ["pods"]
  verbs: ["get", "patch"]
{{- end }}
{{- /* The union of the named rule sets, one rule per (apiGroup, resource). */ -}}
{{- define "powerfleet.mergeRules" -}}
{{- $verbs := dict }}
{{- $order := list }}
{{- range .sets }}
{{- range (include (printf "powerfleet.rules.%s" .) $.root | fromYamlArray) }}
{{- $key := printf "%s|%s" (first .apiGroups) (first .resources) }}
{{- if not (hasKey $verbs $key) }}{{ $order = append $order $key }}{{ end }}
{{- $_ := set $verbs $key (concat (get $verbs $key | default list) .verbs | uniq) }}
{{- end }}
{{- end }}
{{- range $order }}
{{- $parts := splitList "|" . }}
- apiGroups: [{{ index $parts 0 | quote }}]
  resources: [{{ index $parts 1 | quote }}]
  verbs: {{ get $verbs . | toJson }}
{{- end }}
{{- end }}
{{- define "powerfleet.binding" -}}
apiVersion: rbac.authorization.k8s.io/v1
kind: {{ .kind }}Binding
metadata:
  name: {{ .name }}
  {{- with .namespace }}
  namespace: {{ . }}
  {{- end }}
  labels:
    {{- include "powerfleet.labels" .c | nindent 4 }}
roleRef:
  apiGroup: rbac.authorization.k8s.io
  kind: {{ .kind }}
  name: {{ .name }}
subjects:
  - kind: ServiceAccount
    name: {{ include "powerfleet.serviceAccountName" .c }}
    namespace: {{ .c.root.Release.Namespace }}
{{- end }}
