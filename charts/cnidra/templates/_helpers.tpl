{{- /* the name in labels (nameOverride): app.kubernetes.io/name of the driver's objects */ -}}
{{- define "cnidra.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" }}
{{- end -}}

{{- /* the base of every object's name the release owns alone: fullnameOverride, else the
       release's name, followed by the chart's unless it already holds it (so the release
       "cnidra" keeps the names the docs give: cnidra, cnidra-webhook, ...). 55 characters
       leave room for the longest suffix ("-webhook", "-metrics") in a Service's 63. */ -}}
{{- define "cnidra.fullname" -}}
{{- if .Values.fullnameOverride }}
{{- .Values.fullnameOverride | trunc 55 | trimSuffix "-" }}
{{- else }}
{{- $name := include "cnidra.name" . }}
{{- if contains $name .Release.Name }}
{{- .Release.Name | trunc 55 | trimSuffix "-" }}
{{- else }}
{{- printf "%s-%s" .Release.Name $name | trunc 55 | trimSuffix "-" }}
{{- end }}
{{- end }}
{{- end -}}

{{- define "cnidra.chart" -}}
{{- printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" }}
{{- end -}}

{{- /* the driver's pods: the DaemonSet's selector (immutable: never add to it) */ -}}
{{- define "cnidra.selectorLabels" -}}
app.kubernetes.io/name: {{ include "cnidra.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end -}}

{{- /* the labels every object of the chart carries (with an app.kubernetes.io/component) */ -}}
{{- define "cnidra.labels" -}}
{{ include "cnidra.selectorLabels" . }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
helm.sh/chart: {{ include "cnidra.chart" . }}
app.kubernetes.io/part-of: {{ include "cnidra.name" . }}
{{- end -}}

{{- /* the webhook's objects: app.kubernetes.io/name <name>-webhook, so that its pods never
       match the driver's selector (the DaemonSet, the metrics Service, the PodMonitor) */ -}}
{{- define "cnidra.webhookLabels" -}}
app.kubernetes.io/name: {{ include "cnidra.name" . }}-webhook
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
helm.sh/chart: {{ include "cnidra.chart" . }}
app.kubernetes.io/part-of: {{ include "cnidra.name" . }}
app.kubernetes.io/component: webhook
{{- end -}}

{{- /* the webhook's pods: the Deployment's selector since 0.2 (immutable: never change it);
       the fullname makes it the release's own */ -}}
{{- define "cnidra.webhookSelectorLabels" -}}
app: {{ include "cnidra.fullname" . }}-webhook
{{- end -}}

{{- /* image.digest pins the image (repository@digest); otherwise the tag, by default the
       chart's appVersion ("-cni-plugins" after it with cniPlugins.install) */ -}}
{{- define "cnidra.image" -}}
{{- with .Values.image }}
{{- if .digest }}
{{- .repository }}@{{ .digest }}
{{- else }}
{{- .repository }}:{{ .tag | default (printf "%s%s" $.Chart.AppVersion (ternary "-cni-plugins" "" $.Values.cniPlugins.install)) }}
{{- end }}
{{- end }}
{{- end -}}

{{- define "cnidra.driverName" -}}cni.dra.networking.x-k8s.io{{- end -}}


{{- /* metrics reachable from off the node: the driver listens on the node's address */ -}}
{{- define "cnidra.metricsExposed" -}}
{{- $m := .Values.metrics -}}
{{- if or $m.annotations $m.service.enabled $m.serviceMonitor.enabled $m.podMonitor.enabled -}}true{{- end -}}
{{- end -}}

{{- define "cnidra.httpPort" -}}
{{- splitList ":" .Values.driver.httpAddress | last -}}
{{- end -}}

{{- define "cnidra.httpAddress" -}}
{{- if include "cnidra.metricsExposed" . -}}
$(CNIDRA_POD_IP):{{ include "cnidra.httpPort" . }}
{{- else -}}
{{ .Values.driver.httpAddress }}
{{- end -}}
{{- end -}}
