{{/* Names: the release name when it contains the chart name, else <release>-harness-engine. */}}
{{- define "he.fullname" -}}
{{- if .Values.fullnameOverride -}}
{{- .Values.fullnameOverride | trunc 50 | trimSuffix "-" -}}
{{- else if contains .Chart.Name .Release.Name -}}
{{- .Release.Name | trunc 50 | trimSuffix "-" -}}
{{- else -}}
{{- printf "%s-%s" .Release.Name .Chart.Name | trunc 50 | trimSuffix "-" -}}
{{- end -}}
{{- end -}}

{{- define "he.selectorLabels" -}}
app.kubernetes.io/name: harness-engine
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end -}}

{{- define "he.labels" -}}
{{ include "he.selectorLabels" . }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version }}
{{- end -}}

{{- define "he.serviceAccount" -}}{{ include "he.fullname" . }}{{- end -}}
{{- define "he.webhookService" -}}{{ include "he.fullname" . }}-webhook{{- end -}}
{{- define "he.webhookSecret" -}}
{{- if eq .Values.webhook.certificates.mode "operator" -}}{{ include "he.fullname" . }}-webhook-managed{{- else -}}{{ include "he.fullname" . }}-webhook-tls{{- end -}}
{{- end -}}
{{- define "he.webhookConfiguration" -}}{{ include "he.fullname" . }}-validating-webhook{{- end -}}
{{- define "he.webhookHosts" -}}
{{- $svc := include "he.webhookService" . -}}
{{ printf "%s.%s.svc" $svc .Release.Namespace }},{{ printf "%s.%s.svc.cluster.local" $svc .Release.Namespace }}
{{- end -}}
{{- define "he.identitySecret" -}}
{{- if .Values.identityKey.existingSecret -}}{{ .Values.identityKey.existingSecret }}{{- else -}}{{ include "he.fullname" . }}-identity{{- end -}}
{{- end -}}

{{- define "he.image" -}}
{{- if .Values.image.digest -}}
{{ .Values.image.repository }}@{{ .Values.image.digest }}
{{- else -}}
{{ .Values.image.repository }}:{{ .Values.image.tag | default .Chart.AppVersion }}
{{- end -}}
{{- end -}}

{{- define "he.mongodb" -}}
{{- if or .Values.store.mongodb.uri .Values.store.mongodb.existingSecret -}}true{{- end -}}
{{- end -}}
