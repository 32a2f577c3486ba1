{{- define "cnidra.labels" -}}
app.kubernetes.io/name: cnidra
app.kubernetes.io/instance: {{ .Release.Name }}
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
