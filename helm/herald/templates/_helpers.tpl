{{/* Names */}}
{{- define "herald.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{- define "herald.fullname" -}}
{{- if .Values.fullnameOverride -}}
{{- .Values.fullnameOverride | trunc 36 | trimSuffix "-" -}}
{{- else -}}
{{- $name := default .Chart.Name .Values.nameOverride -}}
{{- if contains $name .Release.Name -}}
{{- .Release.Name | trunc 36 | trimSuffix "-" -}}
{{- else -}}
{{- printf "%s-%s" .Release.Name $name | trunc 36 | trimSuffix "-" -}}
{{- end -}}
{{- end -}}
{{- end -}}

{{- define "herald.chart" -}}
{{- printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{/* Labels. Call with (dict "root" $ "component" "api"). */}}
{{- define "herald.selectorLabels" -}}
app.kubernetes.io/name: {{ include "herald.name" .root }}
app.kubernetes.io/instance: {{ .root.Release.Name }}
app.kubernetes.io/component: {{ .component }}
{{- end -}}

{{- define "herald.labels" -}}
{{ include "herald.selectorLabels" . }}
helm.sh/chart: {{ include "herald.chart" .root }}
app.kubernetes.io/version: {{ .root.Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .root.Release.Service }}
app.kubernetes.io/part-of: herald
{{- with .root.Values.commonLabels }}
{{ toYaml . }}
{{- end }}
{{- end -}}

{{/* The scrape job name the alert rules and dashboards expect (herald-api, herald-poller, …). */}}
{{- define "herald.scrapeJob" -}}
herald-{{ . }}
{{- end -}}

{{/* An image reference: [registry/]repository then @digest, or :tag. The registry is the
     image's own, else global.imageRegistry (a mirror for every image of the release).
     Takes (dict "image" <image values> "root" $ "tag" <default tag>). */}}
{{- define "herald.imageRef" -}}
{{- $image := .image -}}
{{- $registry := $image.registry | default .root.Values.global.imageRegistry -}}
{{- $name := $image.repository -}}
{{- if $registry }}{{ $name = printf "%s/%s" (trimSuffix "/" $registry) $name }}{{ end -}}
{{- if $image.digest -}}
{{- printf "%s@%s" $name $image.digest -}}
{{- else -}}
{{- printf "%s:%s" $name (default .tag $image.tag) -}}
{{- end -}}
{{- end -}}

{{/* Herald's own image; its tag defaults to the chart's appVersion. */}}
{{- define "herald.image" -}}
{{- include "herald.imageRef" (dict "image" .Values.image "root" . "tag" .Chart.AppVersion) -}}
{{- end -}}

{{- define "herald.serviceAccountName" -}}
{{- if .Values.serviceAccount.create -}}
{{- default (include "herald.fullname" .) .Values.serviceAccount.name -}}
{{- else -}}
{{- default "default" .Values.serviceAccount.name -}}
{{- end -}}
{{- end -}}

{{- define "herald.etcdPrefix" -}}
{{- default (printf "/herald/%s/%s" .Release.Namespace .Release.Name) .Values.etcd.prefix -}}
{{- end -}}

{{- define "herald.apiServiceName" -}}
{{- printf "%s-api" (include "herald.fullname" .) -}}
{{- end -}}

{{/* PostgreSQL */}}

{{/* The connection URL without a password (safe for a ConfigMap). Call with
     (dict "root" $ "runtime" bool): with runtime, as the runtime role when one is configured. */}}
{{- define "herald.databaseUrl" -}}
{{- $pg := .root.Values.postgresql -}}
{{- $user := $pg.user -}}
{{- if and .runtime $pg.runtimeRole.name -}}
{{- $user = $pg.runtimeRole.name -}}
{{- end -}}
{{- printf "postgres://%s@%s:%v/%s?sslmode=%s" (urlquery $user) $pg.host $pg.port (urlquery $pg.database) $pg.sslMode -}}
{{- with $pg.tls }}
{{- if .existingSecret }}
{{- if .caKey }}&sslrootcert=/etc/herald/tls/postgresql/ca.crt{{ end }}
{{- if .clientCertificate }}&sslcert=/etc/herald/tls/postgresql/tls.crt&sslkey=/etc/herald/tls/postgresql/tls.key{{ end }}
{{- end }}
{{- end }}
{{- end -}}

{{/* TLS material from Secrets, mounted as files under /etc/herald/tls/<service>/ (ca.crt,
     tls.crt, tls.key) for the services a role connects to: postgresql (named in its URL),
     redis, etcd and provider (named by HERALD_*_FILE variables). */}}
{{- define "herald.tlsSources" -}}
{{- $v := .Values -}}
{{- toYaml (dict "postgresql" $v.postgresql.tls "redis" $v.redis.tls "etcd" $v.etcd.tls "provider" $v.workers.send.providerTls) -}}
{{- end -}}

{{/* Call with (dict "root" $ "uses" (list "postgresql" "redis" …)). */}}
{{- define "herald.tlsVolumes" -}}
{{- $sources := include "herald.tlsSources" .root | fromYaml -}}
{{- range .uses }}
{{- $tls := index $sources . }}
{{- if $tls.existingSecret }}
- name: tls-{{ . }}
  secret:
    secretName: {{ $tls.existingSecret }}
    items:
      {{- if $tls.caKey }}
      - key: {{ $tls.caKey }}
        path: ca.crt
      {{- end }}
      {{- if $tls.clientCertificate }}
      - key: {{ $tls.certKey }}
        path: tls.crt
      - key: {{ $tls.keyKey }}
        path: tls.key
      {{- end }}
{{- end }}
{{- end }}
{{- end -}}

{{- define "herald.tlsVolumeMounts" -}}
{{- $sources := include "herald.tlsSources" .root | fromYaml -}}
{{- range .uses }}
{{- if (index $sources .).existingSecret }}
- name: tls-{{ . }}
  mountPath: /etc/herald/tls/{{ . }}
  readOnly: true
{{- end }}
{{- end }}
{{- end -}}

{{/* The HERALD_<SERVICE>_{CA,CERT,KEY}_FILE variables of the services in .uses (postgresql
     is configured through its URL instead). */}}
{{- define "herald.config.tls" -}}
{{- $sources := include "herald.tlsSources" .root | fromYaml -}}
{{- range .uses }}
{{- $tls := index $sources . }}
{{- if and (ne . "postgresql") $tls.existingSecret }}
{{- $var := upper . }}
{{- if $tls.caKey }}
HERALD_{{ $var }}_CA_FILE: {{ printf "/etc/herald/tls/%s/ca.crt" . | quote }}
{{- end }}
{{- if $tls.clientCertificate }}
HERALD_{{ $var }}_CERT_FILE: {{ printf "/etc/herald/tls/%s/tls.crt" . | quote }}
HERALD_{{ $var }}_KEY_FILE: {{ printf "/etc/herald/tls/%s/tls.key" . | quote }}
{{- end }}
{{- end }}
{{- end }}
{{- end -}}

{{/* Whether the roles connect as the runtime role. */}}
{{- define "herald.runtimeRole" -}}
{{- if .Values.postgresql.runtimeRole.name -}}true{{- end -}}
{{- end -}}

{{- define "herald.postgresSecretName" -}}
{{- if .Values.postgresql.existingSecret -}}
{{- .Values.postgresql.existingSecret -}}
{{- else if .Values.postgresql.password -}}
{{- printf "%s-postgresql" (include "herald.fullname" .) -}}
{{- end -}}
{{- end -}}

{{/* Whether the database URL comes whole from a Secret (then it is not in the ConfigMap). */}}
{{- define "herald.databaseUrlFromSecret" -}}
{{- if and .Values.postgresql.existingSecret .Values.postgresql.existingSecretUrlKey -}}true{{- end -}}
{{- end -}}

{{/* Env entries for the database secret: the whole URL, or PGPASSWORD. Call with
     (dict "root" $ "secret" name "runtime" bool): with runtime, the runtime role's password
     when one is configured. */}}
{{- define "herald.databaseSecretEnv" -}}
{{- $pg := .root.Values.postgresql -}}
{{- if and .runtime (include "herald.runtimeRole" .root) }}
- name: PGPASSWORD
  valueFrom:
    secretKeyRef:
      name: {{ $pg.runtimeRole.existingSecret }}
      key: {{ $pg.runtimeRole.existingSecretPasswordKey }}
{{- else if include "herald.databaseUrlFromSecret" .root }}
- name: HERALD_DATABASE_URL
  valueFrom:
    secretKeyRef:
      name: {{ $pg.existingSecret }}
      key: {{ $pg.existingSecretUrlKey }}
{{- else if .secret }}
- name: PGPASSWORD
  valueFrom:
    secretKeyRef:
      name: {{ .secret }}
      key: {{ ternary $pg.existingSecretPasswordKey "password" (ne $pg.existingSecret "") }}
{{- end }}
{{- end -}}

{{/* One env entry from a Secret key. Call with (dict "var" NAME "secret" s "key" k "optional" bool). */}}
{{- define "herald.secretEnv" -}}
{{- printf "\n- name: %s\n  valueFrom:\n    secretKeyRef:\n      name: %s\n      key: %s" .var .secret .key }}
{{- if .optional }}
{{- printf "\n      optional: true" }}
{{- end }}
{{- end -}}

{{/* Redis: the queue store of one job type. */}}

{{- define "herald.redisName" -}}
{{- printf "%s-redis-%s" (include "herald.fullname" .root) .type -}}
{{- end -}}

{{- define "herald.redisSecretName" -}}
{{- $store := index .root.Values.redis .type -}}
{{- if $store.auth.existingSecret -}}
{{- $store.auth.existingSecret -}}
{{- else -}}
{{- include "herald.redisName" . -}}
{{- end -}}
{{- end -}}

{{- define "herald.redisSecretKey" -}}
{{- $store := index .root.Values.redis .type -}}
{{- ternary $store.auth.existingSecretPasswordKey "redis-password" (ne $store.auth.existingSecret "") -}}
{{- end -}}

{{/* The environment variable that carries this job type's Redis password inside a pod. */}}
{{- define "herald.redisPasswordVar" -}}
{{- printf "REDIS_%s_PASSWORD" (upper .type) -}}
{{- end -}}

{{/* The store's URLs, one per shard, comma-separated. With "auth" true, each URL carries the
     password as $(REDIS_<TYPE>_PASSWORD), which Kubernetes expands in a container's env. */}}
{{- define "herald.redisUrls" -}}
{{- $store := index .root.Values.redis .type -}}
{{- $urls := list -}}
{{- if $store.external.urls -}}
{{- $urls = $store.external.urls -}}
{{- else -}}
{{- $name := include "herald.redisName" . -}}
{{- range $shard := until (int $store.shards) -}}
{{- $urls = append $urls (printf "redis://%s-%d.%s.%s.svc:6379/" $name $shard $name $.root.Release.Namespace) -}}
{{- end -}}
{{- end -}}
{{- $out := list -}}
{{- $var := include "herald.redisPasswordVar" . -}}
{{- range $url := $urls -}}
{{- if $.auth -}}
{{- $parts := splitn "://" 2 $url -}}
{{- $rest := $parts._1 -}}
{{- if contains "@" $rest -}}
{{- $userHost := splitn "@" 2 $rest -}}
{{- $url = printf "%s://%s:$(%s)@%s" $parts._0 $userHost._0 $var $userHost._1 -}}
{{- else -}}
{{- $url = printf "%s://:$(%s)@%s" $parts._0 $var $rest -}}
{{- end -}}
{{- end -}}
{{- $out = append $out $url -}}
{{- end -}}
{{- join "," $out -}}
{{- end -}}

{{/* Env entries for the Redis URL variable of one job type: only when the store has a password
     (otherwise the URL is in the ConfigMap). Call with (dict "root" $ "type" "send" "var" NAME). */}}
{{- define "herald.redisAuthEnv" -}}
{{- $store := index .root.Values.redis .type -}}
{{- if $store.auth.enabled }}
- name: {{ include "herald.redisPasswordVar" . }}
  valueFrom:
    secretKeyRef:
      name: {{ include "herald.redisSecretName" . }}
      key: {{ include "herald.redisSecretKey" . }}
- name: {{ .var }}
  value: {{ include "herald.redisUrls" (dict "root" .root "type" .type "auth" true) | quote }}
{{- end }}
{{- end -}}

{{/* ConfigMap entry for the Redis URL variable of one job type, when it holds no password. */}}
{{- define "herald.redisConfigEntry" -}}
{{- $store := index .root.Values.redis .type -}}
{{- if not $store.auth.enabled }}
{{ .var }}: {{ include "herald.redisUrls" (dict "root" .root "type" .type "auth" false) | quote }}
{{- end }}
{{- end -}}

{{/* The number of shards of one job type's store. */}}
{{- define "herald.redisShards" -}}
{{- $store := index .root.Values.redis .type -}}
{{- if $store.external.urls -}}{{ len $store.external.urls }}{{- else -}}{{ $store.shards }}{{- end -}}
{{- end -}}

{{/* Pod pieces. Call with (dict "root" $ "role" .Values.api). A role's own key wins over global. */}}
{{- define "herald.podPlacement" -}}
{{- $g := .root.Values.global -}}
{{- $r := .role -}}
{{- with (ternary $r.nodeSelector $g.nodeSelector (hasKey $r "nodeSelector")) }}
nodeSelector:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- with (ternary $r.tolerations $g.tolerations (hasKey $r "tolerations")) }}
tolerations:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- with (ternary $r.affinity $g.affinity (hasKey $r "affinity")) }}
affinity:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- with (ternary $r.topologySpreadConstraints $g.topologySpreadConstraints (hasKey $r "topologySpreadConstraints")) }}
{{- /* A constraint without a labelSelector counts no pods: spread the role's own pods. */}}
{{- $selector := include "herald.selectorLabels" (dict "root" $.root "component" $.component) | fromYaml }}
topologySpreadConstraints:
  {{- range . }}
  {{- $constraint := deepCopy . }}
  {{- if not (hasKey $constraint "labelSelector") }}
  {{- $_ := set $constraint "labelSelector" (dict "matchLabels" $selector) }}
  {{- end }}
  - {{ toYaml $constraint | nindent 4 | trim }}
  {{- end }}
{{- end }}
{{- with (ternary $r.priorityClassName $g.priorityClassName (hasKey $r "priorityClassName")) }}
priorityClassName: {{ . }}
{{- end }}
{{- with .root.Values.imagePullSecrets }}
imagePullSecrets:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- end -}}

{{- define "herald.podMetadata" -}}
{{- $g := .root.Values.global -}}
{{- $r := .role -}}
labels:
  {{- include "herald.labels" (dict "root" .root "component" .component) | nindent 2 }}
  herald/scrape-job: {{ include "herald.scrapeJob" .component }}
  {{- with merge (dict) (default (dict) $r.podLabels) $g.podLabels }}
  {{- toYaml . | nindent 2 }}
  {{- end }}
annotations:
  checksum/config: {{ .checksum }}
  {{- with merge (dict) (default (dict) $r.podAnnotations) $g.podAnnotations }}
  {{- toYaml . | nindent 2 }}
  {{- end }}
{{- end -}}

{{/* Probes on the role's HTTP port: /healthz (alive) and /readyz (dependencies answer). */}}
{{- define "herald.probes" -}}
livenessProbe:
  httpGet:
    path: /healthz
    port: {{ . }}
  initialDelaySeconds: 5
  periodSeconds: 10
  timeoutSeconds: 3
  failureThreshold: 3
readinessProbe:
  httpGet:
    path: /readyz
    port: {{ . }}
  initialDelaySeconds: 2
  periodSeconds: 5
  timeoutSeconds: 3
  failureThreshold: 2
{{- end -}}

{{/* A writable /tmp on a read-only root filesystem. */}}
{{- define "herald.tmpVolumeMount" -}}
- name: tmp
  mountPath: /tmp
{{- end -}}
{{- define "herald.tmpVolume" -}}
- name: tmp
  emptyDir:
    sizeLimit: 64Mi
{{- end -}}

{{/* Render-time checks of values that the schema cannot express. */}}
{{- define "herald.validate" -}}
{{- $p := .Values.poller -}}
{{- if and (not .Values.etcd.endpoints) (or $p.autoscaling.enabled (gt (int $p.replicas) 1)) -}}
{{- fail "poller: more than one poller (or autoscaling) needs etcd.endpoints; a poller without etcd owns every partition" -}}
{{- end -}}
{{- if gt (int $p.replicas) (int .Values.partitions) -}}
{{- fail (printf "poller.replicas (%v) must not exceed partitions (%v): a poller beyond the partition count owns nothing" $p.replicas .Values.partitions) -}}
{{- end -}}
{{- if le (int $p.terminationGracePeriodSeconds) (add (int $p.drainTimeoutSeconds) 5 | int) -}}
{{- fail (printf "poller.terminationGracePeriodSeconds (%v) must exceed poller.drainTimeoutSeconds (%v) by more than 5 s, or Kubernetes kills a poller before it released its partitions" $p.terminationGracePeriodSeconds $p.drainTimeoutSeconds) -}}
{{- end -}}
{{- $api := .Values.api -}}
{{- if le (int $api.terminationGracePeriodSeconds) (add (int $api.shutdownDelaySeconds) (int $api.preStopSeconds) 5 | int) -}}
{{- fail (printf "api.terminationGracePeriodSeconds (%v) must exceed api.preStopSeconds (%v) plus api.shutdownDelaySeconds (%v) by more than 5 s, or Kubernetes kills the API before it finished its in-flight requests" $api.terminationGracePeriodSeconds $api.preStopSeconds $api.shutdownDelaySeconds) -}}
{{- end -}}
{{- if eq (int $api.port) (int $api.adminPort) -}}
{{- fail "api.port and api.adminPort must differ" -}}
{{- end -}}
{{- if gt (int $p.autoscaling.minReplicas) (int $p.autoscaling.maxReplicas) -}}
{{- fail "poller.autoscaling.minReplicas must not exceed maxReplicas" -}}
{{- end -}}
{{- if and .Values.metrics.serviceMonitor.enabled .Values.metrics.podMonitor.enabled -}}
{{- fail "metrics: enable either serviceMonitor or podMonitor, not both" -}}
{{- end -}}
{{- if and .Values.postgresql.existingSecretUrlKey (not .Values.postgresql.existingSecret) -}}
{{- fail "postgresql.existingSecretUrlKey needs postgresql.existingSecret" -}}
{{- end -}}
{{- range $type := list "send" "status" -}}
{{- $store := index $.Values.redis $type -}}
{{- if and $store.auth.enabled (not $store.auth.existingSecret) (not $store.auth.password) -}}
{{- fail (printf "redis.%s.auth: give existingSecret or password" $type) -}}
{{- end -}}
{{- if and $store.auth.enabled $store.auth.password (not (regexMatch "^[A-Za-z0-9._~-]+$" $store.auth.password)) -}}
{{- fail (printf "redis.%s.auth.password must be URL-safe (letters, digits, . _ ~ -)" $type) -}}
{{- end -}}
{{- end -}}
{{- $etcdAuth := .Values.etcd.auth -}}
{{- if and $etcdAuth.user (not $etcdAuth.existingSecret) -}}
{{- fail "etcd.auth.user needs etcd.auth.existingSecret (its password)" -}}
{{- end -}}
{{- if and $etcdAuth.existingSecret (not $etcdAuth.user) -}}
{{- fail "etcd.auth.existingSecret needs etcd.auth.user" -}}
{{- end -}}
{{- $tlsSources := include "herald.tlsSources" . | fromYaml -}}
{{- range $service, $tls := $tlsSources -}}
{{- if and $tls.existingSecret (not $tls.caKey) (not $tls.clientCertificate) -}}
{{- fail (printf "%s TLS: existingSecret %s is mounted for nothing: set caKey or clientCertificate" $service $tls.existingSecret) -}}
{{- end -}}
{{- end -}}
{{- if and .Values.postgresql.tls.existingSecret .Values.postgresql.existingSecretUrlKey -}}
{{- fail "postgresql.tls needs host, port, database and user: with existingSecretUrlKey, put sslrootcert in that URL and mount the file with extraVolumes" -}}
{{- end -}}
{{- $runtime := .Values.postgresql.runtimeRole -}}
{{- if and $runtime.name (not $runtime.existingSecret) -}}
{{- fail "postgresql.runtimeRole.name needs postgresql.runtimeRole.existingSecret (its password)" -}}
{{- end -}}
{{- if and $runtime.name .Values.postgresql.existingSecretUrlKey -}}
{{- fail "postgresql.runtimeRole needs host, port, database and user: not existingSecretUrlKey (a whole URL names one user)" -}}
{{- end -}}
{{- if and $runtime.name (eq $runtime.name .Values.postgresql.user) -}}
{{- fail "postgresql.runtimeRole.name must differ from postgresql.user, which owns the schema" -}}
{{- end -}}
{{- end -}}

{{/* The poller's replica ceiling: maxReplicas, never above the partition count. */}}
{{- define "herald.pollerMaxReplicas" -}}
{{- min (int .Values.poller.autoscaling.maxReplicas) (int .Values.partitions) -}}
{{- end -}}

{{/* The backlog query for KEDA: every partition once (max over API replicas), summed. */}}
{{- define "herald.backlogQuery" -}}
{{- default (printf "sum(max by (partition) (herald_outbox_backlog_rows{namespace=%q,service=%q}))" .Release.Namespace (include "herald.apiServiceName" .)) .Values.poller.autoscaling.keda.query -}}
{{- end -}}

{{/* A map of variables as an env list, in key order. */}}
{{- define "herald.envList" -}}
{{- range $k, $v := . }}
- name: {{ $k }}
  value: {{ $v | toString | quote }}
{{- end }}
{{- end -}}

{{/* redis.conf of a chart-run queue store shard. */}}
{{- define "herald.redisConf" -}}
port 6379
bind * -::*
protected-mode no
dir /data
maxmemory {{ .maxmemoryMb | int64 }}mb
maxmemory-policy noeviction
maxclients {{ .maxclients | int64 }}
save ""
{{- if .persistence.enabled }}
appendonly yes
appendfsync everysec
{{- else }}
appendonly no
{{- end }}
{{- end -}}
