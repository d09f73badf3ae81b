{{/* The non-secret configuration of each role, as HERALD_* variables (see `herald <role> --help`).
     Rendered into each role's ConfigMap; its checksum rolls the role's pods when it changes. */}}

{{/* Call with (dict "root" $ "pool" n "runtime" bool): a role (runtime true) connects as the
     runtime role when one is configured, the migration as postgresql.user. */}}
{{- define "herald.config.database" -}}
{{- if not (include "herald.databaseUrlFromSecret" .root) }}
HERALD_DATABASE_URL: {{ include "herald.databaseUrl" (dict "root" .root "runtime" .runtime) | quote }}
{{- end }}
HERALD_DATABASE_MAX_CONNECTIONS: {{ .pool | int64 | quote }}
HERALD_LOG_FORMAT: {{ .root.Values.logFormat | quote }}
{{- end -}}

{{- define "herald.config.pressure" -}}
HERALD_QUEUE_FULL_THRESHOLD: {{ .Values.queueFullThreshold | quote }}
HERALD_QUEUE_CHECK_INTERVAL: {{ .Values.queueCheckInterval | quote }}
{{- end -}}

{{- define "herald.config.api" -}}
{{- $api := .Values.api -}}
{{- include "herald.config.database" (dict "root" . "pool" $api.databaseMaxConnections "runtime" true) }}
HERALD_API_LISTEN: {{ printf "0.0.0.0:%v" $api.port | quote }}
HERALD_ADMIN_LISTEN: {{ printf "0.0.0.0:%v" $api.adminPort | quote }}
HERALD_API_SHUTDOWN_DELAY: {{ printf "%vs" $api.shutdownDelaySeconds | quote }}
HERALD_API_MAX_BODY_BYTES: {{ $api.maxBodyBytes | int64 | quote }}
HERALD_API_MAX_BATCH: {{ $api.maxBatch | int64 | quote }}
HERALD_API_GROUP_MAX: {{ $api.groupMax | int64 | quote }}
HERALD_API_GROUP_PARALLEL: {{ $api.groupParallel | int64 | quote }}
HERALD_API_RECEIPT_LINGER: {{ $api.receiptLinger | quote }}
HERALD_API_REQUIRE_IDEMPOTENCY_KEY: {{ $api.requireIdempotencyKey | toString | quote }}
HERALD_API_REQUEST_TIMEOUT: {{ $api.requestTimeout | quote }}
HERALD_API_RATE_LIMIT: {{ $api.rateLimit.perSecond | int64 | quote }}
{{- if and $api.rateLimit.perSecond $api.rateLimit.burst }}
HERALD_API_RATE_LIMIT_BURST: {{ $api.rateLimit.burst | int64 | quote }}
{{- end }}
HERALD_BACKLOG_GAUGE_INTERVAL: {{ $api.backlogGaugeInterval | quote }}
HERALD_RECEIPT_SIGNATURE_WINDOW: {{ $api.auth.signatureWindow | quote }}
{{ include "herald.config.pressure" . }}
{{- include "herald.redisConfigEntry" (dict "root" . "type" "send" "var" "HERALD_REDIS_SEND_URL") }}
{{- include "herald.redisConfigEntry" (dict "root" . "type" "status" "var" "HERALD_REDIS_STATUS_URL") }}
{{- include "herald.config.tls" (dict "root" . "uses" (list "redis")) }}
{{- end -}}

{{- define "herald.config.poller" -}}
{{- $p := .Values.poller -}}
{{- include "herald.config.database" (dict "root" . "pool" $p.databaseMaxConnections "runtime" true) }}
HERALD_ADMIN_LISTEN: {{ printf "0.0.0.0:%v" $p.adminPort | quote }}
HERALD_REDIS_MAX_CONNECTIONS: {{ $p.redisMaxConnections | int64 | quote }}
{{- with .Values.etcd.endpoints }}
HERALD_ETCD_ENDPOINTS: {{ join "," . | quote }}
{{- end }}
HERALD_ETCD_PREFIX: {{ include "herald.etcdPrefix" . | quote }}
HERALD_LEASE_TTL: {{ printf "%vs" $p.leaseTtlSeconds | quote }}
HERALD_DRAIN_TIMEOUT: {{ printf "%vs" $p.drainTimeoutSeconds | quote }}
HERALD_POLLER_BATCH_SIZE: {{ $p.batchSize | int64 | quote }}
HERALD_POLLER_MAX_BATCHES_PER_TICK: {{ $p.maxBatchesPerTick | int64 | quote }}
HERALD_POLLER_PUBLISH_CONCURRENCY: {{ $p.publishConcurrency | int64 | quote }}
HERALD_BATCH_LINGER: {{ $p.batchLinger | quote }}
HERALD_POLLER_POLL_INTERVAL: {{ $p.pollInterval | quote }}
HERALD_POLLER_IDLE_POLL_INTERVAL: {{ $p.idlePollInterval | quote }}
HERALD_POLLER_REDRIVE_INTERVAL: {{ $p.redriveInterval | quote }}
HERALD_POLLER_STALE_AFTER: {{ $p.staleAfter | quote }}
HERALD_RETAIN_DONE_JOBS: {{ $p.retention.doneJobs | quote }}
HERALD_COMPACT_HISTORIES_AFTER: {{ $p.retention.compactHistoriesAfter | quote }}
HERALD_RETAIN_MESSAGES: {{ $p.retention.messages | quote }}
{{- if $p.retention.archive.existingClaim }}
HERALD_ARCHIVE_DIR: {{ $p.retention.archive.mountPath | quote }}
{{- end }}
HERALD_MAINTENANCE_INTERVAL: {{ $p.retention.interval | quote }}
HERALD_MAINTENANCE_BATCH: {{ $p.retention.batch | int64 | quote }}
{{ include "herald.config.pressure" . }}
{{- include "herald.redisConfigEntry" (dict "root" . "type" "send" "var" "HERALD_REDIS_SEND_URL") }}
{{- include "herald.redisConfigEntry" (dict "root" . "type" "status" "var" "HERALD_REDIS_STATUS_URL") }}
{{- include "herald.config.tls" (dict "root" . "uses" (list "redis" "etcd")) }}
{{- with .Values.etcd.auth.user }}
HERALD_ETCD_USER: {{ . | quote }}
{{- end }}
{{- end -}}

{{/* Call with (dict "root" $ "type" "send"). */}}
{{- define "herald.config.worker" -}}
{{- $w := index .root.Values.workers .type -}}
{{- include "herald.config.database" (dict "root" .root "pool" $w.databaseMaxConnections "runtime" true) }}
HERALD_JOB_TYPE: {{ .type | quote }}
HERALD_ADMIN_LISTEN: {{ printf "0.0.0.0:%v" $w.adminPort | quote }}
HERALD_REDIS_MAX_CONNECTIONS: {{ $w.redisMaxConnections | int64 | quote }}
HERALD_WORKER_CONCURRENCY: {{ $w.concurrency | int64 | quote }}
HERALD_WORKER_MAX_BATCH: {{ $w.maxBatch | int64 | quote }}
HERALD_WORKER_BATCHES_IN_FLIGHT: {{ $w.batchesInFlight | int64 | quote }}
HERALD_WORKER_RECLAIM_IDLE: {{ $w.reclaimIdle | quote }}
{{ include "herald.config.pressure" .root }}
{{- if eq .type "send" }}
HERALD_PROVIDER_URL: {{ include "herald.providerUrl" .root | quote }}
HERALD_PROVIDER_TIMEOUT: {{ $w.providerTimeout | quote }}
HERALD_MAX_ATTEMPTS: {{ $w.maxAttempts | int64 | quote }}
HERALD_CLAIM_LEASE: {{ $w.claimLease | quote }}
HERALD_RETRY_BASE: {{ $w.retryBase | quote }}
HERALD_RETRY_MAX: {{ $w.retryMax | quote }}
HERALD_BATCH_LINGER: {{ $w.batchLinger | quote }}
{{- with $w.blockedRecipients }}
HERALD_BLOCKED_RECIPIENTS: {{ join "," . | quote }}
{{- end }}
{{- else }}
HERALD_RECEIPT_WINDOW: {{ $w.receiptWindow | quote }}
HERALD_HOLD_RECEIPTS_FOR: {{ $w.holdReceiptsFor | quote }}
HERALD_RECONCILE_INTERVAL: {{ $w.reconcileInterval | quote }}
{{- with $w.statusAliases }}
HERALD_STATUS_ALIASES: {{ join "," . | quote }}
{{- end }}
{{- end }}
{{- include "herald.redisConfigEntry" (dict "root" .root "type" .type "var" "HERALD_REDIS_URL") }}
{{- include "herald.config.tls" (dict "root" .root "uses" (ternary (list "redis" "provider") (list "redis") (eq .type "send"))) }}
{{- end -}}

{{- define "herald.providerSimName" -}}
{{- printf "%s-provider-sim" (include "herald.fullname" .) -}}
{{- end -}}

{{- define "herald.providerUrl" -}}
{{- if .Values.providerSim.enabled -}}
{{- printf "http://%s.%s.svc:%v" (include "herald.providerSimName" .) .Release.Namespace .Values.providerSim.port -}}
{{- else -}}
{{- .Values.workers.send.providerUrl -}}
{{- end -}}
{{- end -}}

{{- define "herald.config.providerSim" -}}
{{- $s := .Values.providerSim -}}
HERALD_LOG_FORMAT: {{ .Values.logFormat | quote }}
HERALD_SIM_LISTEN: {{ printf "0.0.0.0:%v" $s.port | quote }}
HERALD_SIM_GATEWAYS: {{ join "," $s.gateways | quote }}
HERALD_SIM_ID_WRAP: {{ $s.idWrap | int64 | quote }}
HERALD_SIM_LATENCY: {{ $s.latency | quote }}
HERALD_SIM_JITTER: {{ $s.jitter | quote }}
HERALD_SIM_ERROR_RATE: {{ $s.errorRate | quote }}
HERALD_SIM_TIMEOUT_RATE: {{ $s.timeoutRate | quote }}
HERALD_SIM_REJECT_RATE: {{ $s.rejectRate | quote }}
{{- with $s.refuseStatus }}
HERALD_SIM_REFUSE_STATUS: {{ . | int64 | quote }}
{{- end }}
HERALD_SIM_TIMEOUT_DELAY: {{ $s.timeoutDelay | quote }}
HERALD_SIM_LOG: "/data/provider-sim-submits.jsonl"
{{- if $s.callbacks }}
HERALD_SIM_CALLBACK_URL: {{ printf "http://%s.%s.svc:%v" (include "herald.apiServiceName" .) .Release.Namespace .Values.api.service.port | quote }}
{{- end }}
HERALD_SIM_RECEIPT_DELAY: {{ $s.receiptDelay | quote }}
HERALD_SIM_ENROUTE_RATE: {{ $s.enrouteRate | quote }}
HERALD_SIM_SILENT_RATE: {{ $s.silentRate | quote }}
HERALD_SIM_UNKNOWN_STATUS_RATE: {{ $s.unknownStatusRate | quote }}
HERALD_SIM_BAD_TIMESTAMP_RATE: {{ $s.badTimestampRate | quote }}
HERALD_SIM_UNDELIVERED_RATE: {{ $s.undeliveredRate | quote }}
HERALD_SIM_EXPIRED_RATE: {{ $s.expiredRate | quote }}
HERALD_SIM_RECEIPT_BATCH: {{ $s.receiptBatch | int64 | quote }}
{{- end -}}
