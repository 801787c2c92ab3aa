{{- define "wasmop.labels" -}}
app.kubernetes.io/name: wasmop
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version }}
{{- end -}}

{{- define "wasmop.selector" -}}
app.kubernetes.io/name: wasmop
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end -}}

{{- define "wasmop.leaderElect" -}}
{{- if or .Values.leaderElection.enabled (gt (int .Values.replicaCount) 1) .Values.sharding.enabled }}true{{ end -}}
{{- end -}}
