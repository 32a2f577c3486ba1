{{- define "cnidra.labels" -}}
app.kubernetes.io/name: cnidra
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
{{- end -}}

{{- define "cnidra.image" -}}
{{ .Values.image.repository }}:{{ .Values.image.tag | default (printf "%s%s" .Chart.AppVersion (ternary "-cni-plugins" "" .Values.cniPlugins.install)) }}
{{- end -}}

{{- define "cnidra.driverName" -}}cni.dra.networking.x-k8s.io{{- end -}}
