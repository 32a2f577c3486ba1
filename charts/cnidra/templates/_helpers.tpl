{{- /* the name in labels (nameOverride), and the base of every object's name
       (fullnameOverride; by default the chart's name, not the release's: one DRA driver per
       cluster, and its objects keep the names the docs give) */ -}}
{{- define "cnidra.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" }}
{{- end -}}

{{- define "cnidra.fullname" -}}
{{- default (include "cnidra.name" .) .Values.fullnameOverride | trunc 55 | trimSuffix "-" }}
{{- end -}}

{{- define "cnidra.selectorLabels" -}}
app.kubernetes.io/name: {{ include "cnidra.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end -}}

{{- define "cnidra.labels" -}}
{{ include "cnidra.selectorLabels" . }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" }}
{{- end -}}

{{- /* what every pod of the chart gets besides its containers: pull secrets, affinity */ -}}
{{- define "cnidra.podExtras" -}}
{{- with .Values.imagePullSecrets }}
imagePullSecrets:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- with .Values.affinity }}
affinity:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- end -}}

{{- define "cnidra.image" -}}
{{ .Values.image.repository }}:{{ .Values.image.tag | default (printf "%s%s" .Chart.AppVersion (ternary "-cni-plugins" "" .Values.cniPlugins.install)) }}
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
