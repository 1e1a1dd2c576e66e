{{/* Kept small and per chart: every numafit chart must also install on its own. */}}

{{- define "svc-accounting.name" -}}
{{- default (trimPrefix "svc-" .Chart.Name) .Values.nameOverride | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{- define "svc-accounting.fullname" -}}
{{- if .Values.fullnameOverride -}}
{{- .Values.fullnameOverride | trunc 63 | trimSuffix "-" -}}
{{- else -}}
{{- $name := include "svc-accounting.name" . -}}
{{- if contains $name .Release.Name -}}
{{- .Release.Name | trunc 63 | trimSuffix "-" -}}
{{- else -}}
{{- printf "%s-%s" .Release.Name $name | trunc 63 | trimSuffix "-" -}}
{{- end -}}
{{- end -}}
{{- end -}}

{{- define "svc-accounting.selectorLabels" -}}
app.kubernetes.io/name: {{ include "svc-accounting.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end -}}

{{- define "svc-accounting.labels" -}}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" }}
{{ include "svc-accounting.selectorLabels" . }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/part-of: numafit
app.kubernetes.io/managed-by: {{ .Release.Service }}
{{- end -}}

{{- define "svc-accounting.serviceAccountName" -}}
{{- if .Values.serviceAccount.create -}}
{{- default (include "svc-accounting.fullname" .) .Values.serviceAccount.name -}}
{{- else -}}
{{- default "default" .Values.serviceAccount.name -}}
{{- end -}}
{{- end -}}

{{- define "svc-accounting.image" -}}
{{- printf "%s:%s" .Values.image.repository (.Values.image.tag | default .Chart.AppVersion) -}}
{{- end -}}

{{/*
NATS: nats.url, else global.nats.url, else nats://nats.nats.svc:4222 (comma-separated URLs
allowed). With a credentials Secret (nats.auth, else global.nats.auth) the user and password are
read from it and spliced into every URL through Kubernetes' $(VAR) expansion, so they never
appear in the manifest. Store URL-safe (percent-encoded) values.
*/}}
{{- define "svc-accounting.natsEnv" -}}
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
{{- define "svc-accounting.commonArgs" -}}
- --metrics-port={{ .Values.metrics.port }}
- --log-level={{ .Values.log.level }}
- --log-format={{ .Values.log.format }}
- --grace-seconds={{ .Values.graceSeconds }}
- --nats-connect-timeout={{ .Values.natsConnectTimeout }}
{{- end -}}

{{/* Liveness never depends on NATS or the API server; readiness does. */}}
{{- define "svc-accounting.probes" -}}
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

{{- define "svc-accounting.checkGrace" -}}
{{- if not (gt (float64 .Values.terminationGracePeriodSeconds) (float64 .Values.graceSeconds)) -}}
{{- fail "terminationGracePeriodSeconds must be greater than graceSeconds (the service drains for graceSeconds after SIGTERM)" -}}
{{- end -}}
{{- end -}}

{{/*
The pod's affinity: .Values.affinity, plus anti-affinity between the replicas across nodes
(podAntiAffinity: preferred | required | none) unless it sets podAntiAffinity itself.
*/}}
{{- define "svc-accounting.affinity" -}}
{{- $affinity := deepCopy (.Values.affinity | default dict) -}}
{{- $mode := .Values.podAntiAffinity -}}
{{- if and (ne $mode "none") (not (hasKey $affinity "podAntiAffinity")) (ne (int .Values.partitions) 0) -}}
{{- $term := dict "topologyKey" "kubernetes.io/hostname" "labelSelector" (dict "matchLabels" (include "svc-accounting.selectorLabels" . | fromYaml)) -}}
{{- if eq $mode "required" -}}
{{- $_ := set $affinity "podAntiAffinity" (dict "requiredDuringSchedulingIgnoredDuringExecution" (list $term)) -}}
{{- else -}}
{{- $weighted := dict "weight" 100 "podAffinityTerm" $term -}}
{{- $_ := set $affinity "podAntiAffinity" (dict "preferredDuringSchedulingIgnoredDuringExecution" (list $weighted)) -}}
{{- end -}}
{{- end -}}
{{- toYaml $affinity -}}
{{- end -}}

{{- define "svc-accounting.checkReplicas" -}}
{{- if and (eq (int .Values.partitions) 0) (ne (int .Values.replicaCount) 1) -}}
{{- fail "partitions: 0 (one replica owns every node, without leases) needs replicaCount: 1" -}}
{{- end -}}
{{- if and (gt (int .Values.partitions) 0) .Values.podDisruptionBudget.enabled (gt (int .Values.replicaCount) 1) (ge (int .Values.podDisruptionBudget.minAvailable) (int .Values.replicaCount)) -}}
{{- fail "podDisruptionBudget.minAvailable must be below replicaCount, or no node could ever be drained" -}}
{{- end -}}
{{- end -}}
