{{/* Names and labels shared by every template. */}}
{{- define "tuneloop.name" -}}
{{- .Chart.Name | trunc 63 | trimSuffix "-" }}
{{- end }}

{{- define "tuneloop.fullname" -}}
{{- if contains .Chart.Name .Release.Name }}
{{- .Release.Name | trunc 63 | trimSuffix "-" }}
{{- else }}
{{- printf "%s-%s" .Release.Name .Chart.Name | trunc 63 | trimSuffix "-" }}
{{- end }}
{{- end }}

{{- define "tuneloop.selectorLabels" -}}
app.kubernetes.io/name: {{ include "tuneloop.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end }}

{{- define "tuneloop.labels" -}}
{{ include "tuneloop.selectorLabels" . }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" }}
{{- end }}

{{- define "tuneloop.serviceAccountName" -}}
{{- if .Values.serviceAccount.create }}
{{- default (include "tuneloop.fullname" .) .Values.serviceAccount.name }}
{{- else }}
{{- default "default" .Values.serviceAccount.name }}
{{- end }}
{{- end }}

{{- define "tuneloop.trainJobNamespace" -}}
{{- default .Release.Namespace .Values.trainJobNamespace }}
{{- end }}

{{- define "tuneloop.rulesConfigMap" -}}
{{- default (printf "%s-rules" (include "tuneloop.fullname" .)) .Values.rules.existingConfigMap }}
{{- end }}
