{{/* Kept small and per chart: every numafit chart must also install on its own. */}}

{{- define "svc-scheduler.name" -}}
{{- default (trimPrefix "svc-" .Chart.Name) .Values.nameOverride | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{- define "svc-scheduler.fullname" -}}
{{- if .Values.fullnameOverride -}}
{{- .Values.fullnameOverride | trunc 63 | trimSuffix "-" -}}
{{- else -}}
{{- $name := include "svc-scheduler.name" . -}}
{{- if contains $name .Release.Name -}}
{{- .Release.Name | trunc 63 | trimSuffix "-" -}}
{{- else -}}
{{- printf "%s-%s" .Release.Name $name | trunc 63 | trimSuffix "-" -}}
{{- end -}}
{{- end -}}
{{- end -}}

{{/* Two workloads here: the extender (component extender) and kube-scheduler. */}}
{{- define "svc-scheduler.selectorLabels" -}}
app.kubernetes.io/name: {{ include "svc-scheduler.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/component: extender
{{- end -}}

{{- define "svc-scheduler.kubeSchedulerSelectorLabels" -}}
app.kubernetes.io/name: {{ include "svc-scheduler.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/component: kube-scheduler
{{- end -}}

{{- define "svc-scheduler.kubeSchedulerName" -}}
{{- printf "%s-kube-scheduler" (include "svc-scheduler.fullname" . | trunc 48 | trimSuffix "-") -}}
{{- end -}}

{{- define "svc-scheduler.commonLabels" -}}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" }}
app.kubernetes.io/name: {{ include "svc-scheduler.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/part-of: numafit
app.kubernetes.io/managed-by: {{ .Release.Service }}
{{- end -}}

{{- define "svc-scheduler.kubeSchedulerLabels" -}}
{{ include "svc-scheduler.commonLabels" . }}
app.kubernetes.io/component: kube-scheduler
{{- end -}}

{{- define "svc-scheduler.labels" -}}
{{ include "svc-scheduler.commonLabels" . }}
app.kubernetes.io/component: extender
{{- end -}}

{{- define "svc-scheduler.serviceAccountName" -}}
{{- if .Values.serviceAccount.create -}}
{{- default (include "svc-scheduler.fullname" .) .Values.serviceAccount.name -}}
{{- else -}}
{{- default "default" .Values.serviceAccount.name -}}
{{- end -}}
{{- end -}}

{{- define "svc-scheduler.image" -}}
{{- printf "%s:%s" .Values.image.repository (.Values.image.tag | default .Chart.AppVersion) -}}
{{- end -}}

{{/*
NATS: nats.url, else global.nats.url, else nats://nats.nats.svc:4222 (comma-separated URLs
allowed). With a credentials Secret (nats.auth, else global.nats.auth) the user and password are
read from it and spliced into every URL through Kubernetes' $(VAR) expansion, so they never
appear in the manifest. Store URL-safe (percent-encoded) values.
*/}}
{{- define "svc-scheduler.natsEnv" -}}
{{- $global := dig "nats" dict (.Values.global | default dict) -}}
{{- $url := .Values.nats.url | default (dig "url" "" $global) | default "nats://nats.nats.svc:4222" -}}
{{- $auth := .Values.nats.auth -}}
{{- if not $auth.existingSecret -}}
{{- $auth = dig "auth" dict $global -}}
{{- end -}}
{{- $secret := dig "existingSecret" "" $auth -}}
{{- if $secret -}}
- name: NATS_USER
  valueFrom:
    secretKeyRef:
      name: {{ $secret }}
      key: {{ dig "userKey" "user" $auth }}
- name: NATS_PASSWORD
  valueFrom:
    secretKeyRef:
      name: {{ $secret }}
      key: {{ dig "passwordKey" "password" $auth }}
- name: NUMAFIT_NATS_URL
  value: {{ regexReplaceAll "([a-zA-Z][a-zA-Z0-9+.-]*)://" $url "${1}://$$(NATS_USER):$$(NATS_PASSWORD)@" | quote }}
{{- else -}}
- name: NUMAFIT_NATS_URL
  value: {{ $url | quote }}
{{- end }}
{{- end -}}

{{/* The common service flags (numafit run <svc> --help, "common service options"). */}}
{{- define "svc-scheduler.commonArgs" -}}
- --metrics-port={{ .Values.metrics.port }}
- --log-level={{ .Values.log.level }}
- --log-format={{ .Values.log.format }}
- --grace-seconds={{ .Values.graceSeconds }}
- --nats-connect-timeout={{ .Values.natsConnectTimeout }}
{{- end -}}

{{/* Liveness never depends on NATS or the API server; readiness does. */}}
{{- define "svc-scheduler.probes" -}}
livenessProbe:
  httpGet:
    path: /healthz
    port: metrics
  {{- toYaml .Values.probes.liveness | nindent 2 }}
readinessProbe:
  httpGet:
    path: /readyz
    port: metrics
  {{- toYaml .Values.probes.readiness | nindent 2 }}
{{- if .Values.probes.startup.enabled }}
startupProbe:
  httpGet:
    path: /healthz
    port: metrics
  {{- toYaml (omit .Values.probes.startup "enabled") | nindent 2 }}
{{- end }}
{{- end -}}

{{- define "svc-scheduler.checkGrace" -}}
{{- if not (gt (float64 .Values.terminationGracePeriodSeconds) (float64 .Values.graceSeconds)) -}}
{{- fail "terminationGracePeriodSeconds must be greater than graceSeconds (the service drains for graceSeconds after SIGTERM)" -}}
{{- end -}}
{{- end -}}

{{- define "svc-scheduler.tlsSecretName" -}}
{{- .Values.tls.secretName | default (printf "%s-tls" (include "svc-scheduler.fullname" .)) -}}
{{- end -}}

{{/* The extender's address as kube-scheduler reaches it: this chart's Service. */}}
{{- define "svc-scheduler.urlPrefix" -}}
{{- printf "%s://%s.%s.svc:%v" (ternary "https" "http" .Values.tls.enabled) (include "svc-scheduler.fullname" .) .Release.Namespace .Values.service.port -}}
{{- end -}}

{{/* Refuse combinations that would install but never work. */}}
{{- define "svc-scheduler.checkValues" -}}
{{- include "svc-scheduler.checkGrace" . -}}
{{- if and .Values.webhooks.enabled (not .Values.tls.enabled) -}}
{{- fail "webhooks.enabled needs tls.enabled: the API server calls admission webhooks over HTTPS only" -}}
{{- end -}}
{{- if and .Values.webhooks.enabled (not .Values.certManager.enabled) (not .Values.tls.caBundle) -}}
{{- fail "webhooks.enabled needs a CA for caBundle: set tls.caBundle or certManager.enabled" -}}
{{- end -}}
{{- if and .Values.certManager.enabled (not .Values.tls.enabled) -}}
{{- fail "certManager.enabled needs tls.enabled" -}}
{{- end -}}
{{- if and (gt (int .Values.kubeScheduler.replicaCount) 1) (not .Values.kubeScheduler.leaderElect) -}}
{{- fail "kubeScheduler.replicaCount > 1 needs kubeScheduler.leaderElect" -}}
{{- end -}}
{{- end -}}
