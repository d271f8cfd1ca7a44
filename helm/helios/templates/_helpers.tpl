{{/* Names, labels and the pieces every Helios pod shares. */}}

{{- define "helios.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{- define "helios.fullname" -}}
{{- if .Values.fullnameOverride -}}
{{- .Values.fullnameOverride | trunc 63 | trimSuffix "-" -}}
{{- else -}}
{{- $name := default .Chart.Name .Values.nameOverride -}}
{{- if contains $name .Release.Name -}}
{{- .Release.Name | trunc 63 | trimSuffix "-" -}}
{{- else -}}
{{- printf "%s-%s" .Release.Name $name | trunc 63 | trimSuffix "-" -}}
{{- end -}}
{{- end -}}
{{- end -}}

{{/* The name of one component's objects: helios.component (dict "root" $ "component" "engine") */}}
{{- define "helios.component" -}}
{{- printf "%s-%s" (include "helios.fullname" .root) .component | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{- define "helios.selectorLabels" -}}
app.kubernetes.io/name: {{ include "helios.name" .root }}
app.kubernetes.io/instance: {{ .root.Release.Name }}
app.kubernetes.io/component: {{ .component }}
{{- end -}}

{{- define "helios.labels" -}}
helm.sh/chart: {{ printf "%s-%s" .root.Chart.Name .root.Chart.Version | replace "+" "_" }}
{{ include "helios.selectorLabels" . }}
app.kubernetes.io/version: {{ .root.Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .root.Release.Service }}
app.kubernetes.io/part-of: helios
{{- end -}}

{{- define "helios.serviceAccountName" -}}
{{- if .Values.serviceAccount.create -}}
{{- default (include "helios.fullname" .) .Values.serviceAccount.name -}}
{{- else -}}
{{- default "default" .Values.serviceAccount.name -}}
{{- end -}}
{{- end -}}

{{/* image reference: helios.image (dict "root" $ "repository" "helios-gateway" "tag" "" "suffix" "") */}}
{{- define "helios.image" -}}
{{- $tag := default .root.Values.image.tag .tag | default .root.Chart.AppVersion -}}
{{- $repository := .repository -}}
{{- if .root.Values.image.registry -}}
{{- $repository = printf "%s/%s" (trimSuffix "/" .root.Values.image.registry) .repository -}}
{{- end -}}
{{- printf "%s:%s%s" $repository $tag (default "" .suffix) -}}
{{- end -}}

{{/* The address a caller dials: <component service>:<port> */}}
{{- define "helios.address" -}}
{{- printf "%s:%v" (include "helios.component" (dict "root" .root "component" .component)) (index .root.Values .component).port -}}
{{- end -}}

{{/* The Redis URL one service uses ("" when none): helios.redisURL (dict "root" $ "db" 1).
     The release's own Redis, or redis.url; each service keeps to its own database number. */}}
{{- define "helios.redisURL" -}}
{{- $values := .root.Values.redis -}}
{{- if $values.enabled -}}
{{- printf "redis://%s:6379/%v" (include "helios.component" (dict "root" .root "component" "redis")) .db -}}
{{- else if $values.url -}}
{{- printf "%s/%v" (trimSuffix "/" $values.url) .db -}}
{{- end -}}
{{- end -}}

{{/* Seconds a pod gets to stop: the preStop pause, the service's drain, and time to exit. */}}
{{- define "helios.terminationGrace" -}}
{{- add .preStopSeconds .drainSeconds 15 -}}
{{- end -}}

{{/* Pod-level settings every Helios pod shares. */}}
{{- define "helios.podCommon" -}}
serviceAccountName: {{ include "helios.serviceAccountName" . }}
automountServiceAccountToken: false
# Kubernetes would otherwise inject <SERVICE>_PORT=tcp://... variables, which for a release
# named "helios" collide with HELIOS_* settings (HELIOS_PORT).
enableServiceLinks: false
securityContext:
  {{- toYaml .Values.podSecurityContext | nindent 2 }}
{{- with .Values.imagePullSecrets }}
imagePullSecrets:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- end -}}

{{/* Scheduling for one component: helios.scheduling (dict "values" .Values.gateway) */}}
{{- define "helios.scheduling" -}}
{{- with .values.nodeSelector -}}
nodeSelector:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- with .values.tolerations }}
tolerations:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- with .values.affinity }}
affinity:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- end -}}

{{/* Env shared by every Helios container, then the component's own extra HELIOS_* settings. */}}
{{- define "helios.commonEnv" -}}
- name: HELIOS_LOG_LEVEL
  value: {{ .root.Values.logLevel | quote }}
- name: HELIOS_LOG_FORMAT
  value: json
- name: HELIOS_GRACE_PERIOD_S
  value: {{ .values.drainSeconds | quote }}
{{- range $name, $value := .values.env }}
- name: {{ $name }}
  value: {{ $value | quote }}
{{- end }}
{{- end -}}

{{/* The model volume (/models): the demo core copied in by an init container, or model.volume. */}}
{{- define "helios.modelVolume" -}}
- name: models
{{- if .Values.model.demo.enabled }}
  emptyDir: {}
{{- else if .Values.model.volume }}
  {{- toYaml .Values.model.volume | nindent 2 }}
{{- else }}
{{- fail "model.volume is required when model.demo.enabled is false (e.g. {persistentVolumeClaim: {claimName: models, readOnly: true}})" }}
{{- end }}
{{- end -}}

{{- define "helios.modelInit" -}}
{{- if .Values.model.demo.enabled -}}
initContainers:
  - name: demo-model
    image: {{ include "helios.image" (dict "root" . "repository" .Values.model.demo.image.repository "tag" .Values.model.demo.image.tag) }}
    imagePullPolicy: {{ .Values.image.pullPolicy }}
    securityContext:
      {{- toYaml .Values.securityContext | nindent 6 }}
    resources:
      requests: {cpu: 50m, memory: 64Mi}
      limits: {memory: 256Mi}
    volumeMounts:
      - {name: models, mountPath: /target}
{{- end }}
{{- end -}}

{{/* preStop and grace: helios.lifecycle (dict "values" .Values.engine) */}}
{{- define "helios.lifecycle" -}}
lifecycle:
  preStop:
    sleep:
      seconds: {{ .values.preStopSeconds }}
{{- end -}}

{{/* A gRPC service (h2c) for one component: helios.grpcService (dict "root" $ "component" "engine")
     With "headless" true, DNS answers with every ready pod: gRPC keeps one HTTP/2 connection
     per address, so callers that route per request (the frontend across engine replicas) need
     to see the pods, not one virtual IP. Its `metrics` port is what the ServiceMonitor scrapes. */}}
{{- define "helios.grpcService" -}}
apiVersion: v1
kind: Service
metadata:
  name: {{ include "helios.component" . }}
  labels:
    {{- include "helios.labels" . | nindent 4 }}
    helios.dev/metrics: "true"
spec:
  type: ClusterIP
  {{- if .headless }}
  clusterIP: None
  {{- end }}
  selector:
    {{- include "helios.selectorLabels" . | nindent 4 }}
  ports:
    - name: grpc
      port: {{ (index .root.Values .component).port }}
      targetPort: grpc
      protocol: TCP
      appProtocol: kubernetes.io/h2c
    - name: metrics
      port: {{ .root.Values.metrics.port }}
      targetPort: metrics
      protocol: TCP
      appProtocol: http
{{- end -}}

{{/* A gRPC service's Prometheus endpoint: its env and container port (helios.metricsEnv .) */}}
{{- define "helios.metricsEnv" -}}
- name: HELIOS_METRICS_LISTEN
  value: {{ printf "0.0.0.0:%v" .Values.metrics.port | quote }}
{{- end -}}

{{- define "helios.metricsPort" -}}
- name: metrics
  containerPort: {{ .Values.metrics.port }}
  protocol: TCP
{{- end -}}

{{/* Pod annotations for annotation-based discovery (metrics.scrapeAnnotations), with the port
     the pod serves /metrics on: helios.scrapeAnnotations (dict "root" $ "port" 8000) */}}
{{- define "helios.scrapeAnnotations" -}}
{{- if .root.Values.metrics.scrapeAnnotations -}}
prometheus.io/scrape: "true"
prometheus.io/port: {{ .port | quote }}
prometheus.io/path: /metrics
{{- end -}}
{{- end -}}

{{/* Probes of a gRPC service: ready while grpc.health.v1 says SERVING; alive while it listens
     (a frontend whose engine is down is NOT_SERVING but must not be restarted for it). */}}
{{- define "helios.grpcProbes" -}}
readinessProbe:
  grpc: {port: {{ .port }}}
  periodSeconds: 5
  timeoutSeconds: 3
  failureThreshold: 2
livenessProbe:
  tcpSocket: {port: grpc}
  initialDelaySeconds: 10
  periodSeconds: 10
  failureThreshold: 6
{{- end -}}
