{{/* The operator's image: the Deployment and the agent DaemonSets run the same one. */}}
{{- define "mpijob-operator.image" -}}
{{ .Values.image.repository }}:{{ .Values.image.tag | default .Chart.AppVersion }}
{{- end }}

{{/* `mpijob-operator run`'s flags, in the order the overlays append them. */}}
{{- define "mpijob-operator.args" -}}
{{- if and (gt (int .Values.replicas) 1) (not .Values.leaderElection) }}
{{- fail "replicas > 1 needs leaderElection: true (only the Lease holder may write)" }}
{{- end }}
- run
- --lock-namespace={{ .Release.Namespace }}
- --monitoring-port=8080
- --health-port=8081
{{- with .Values.gangScheduler }}
- --gang-scheduling={{ . }}
{{- end }}
{{- if .Values.gpuShares.enabled }}
- --fractional-gpus
{{- with .Values.gpuShares.runtimeClass }}
- --gpu-share-runtime-class={{ . }}
{{- end }}
- --webhook-cert-dir=/etc/mpijob/webhook-tls
{{- if .Values.gpuShares.clientCAConfigMap }}
- --webhook-client-ca=/etc/mpijob/webhook-client-ca/ca.crt
{{- end }}
{{- end }}
{{- with .Values.gpuBinding }}
- --gpu-binding={{ . }}
{{- end }}
{{- with .Values.fabric }}
- --fabric={{ . }}
{{- end }}
{{- range .Values.namespaces }}
- --namespace={{ . }}
{{- end }}
{{- if not .Values.leaderElection }}
- --no-leader-elect
{{- end }}
{{- range .Values.extraArgs }}
- {{ . | quote }}
{{- end }}
{{- end }}

{{- define "mpijob-operator.ports" -}}
- name: metrics
  containerPort: 8080
  protocol: TCP
- name: health
  containerPort: 8081
  protocol: TCP
{{- if .Values.gpuShares.enabled }}
- name: webhooks
  containerPort: 9443
  protocol: TCP
{{- end }}
{{- end }}

{{- define "mpijob-operator.volumeMounts" -}}
- name: tmp
  mountPath: /tmp
{{- if .Values.gpuShares.enabled }}
- name: webhook-tls
  mountPath: /etc/mpijob/webhook-tls
  readOnly: true
{{- if .Values.gpuShares.clientCAConfigMap }}
- name: webhook-client-ca
  mountPath: /etc/mpijob/webhook-client-ca
  readOnly: true
{{- end }}
{{- end }}
{{- end }}

{{- define "mpijob-operator.volumes" -}}
# The only writable path, a scratch directory: the root filesystem is read-only.
- name: tmp
  emptyDir:
    sizeLimit: 16Mi
{{- if .Values.gpuShares.enabled }}
- name: webhook-tls
  secret:
    secretName: {{ .Values.gpuShares.certificateSecret }}
{{- if .Values.gpuShares.clientCAConfigMap }}
- name: webhook-client-ca
  configMap:
    name: {{ .Values.gpuShares.clientCAConfigMap }}
{{- end }}
{{- end }}
{{- end }}
