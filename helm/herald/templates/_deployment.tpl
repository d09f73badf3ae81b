{{/* One Herald role's Deployment. Call with a dict:
     root, component (api, poller, worker-send, …), role (its values), args (list), port,
     portName, adminPort (optional: a second port named admin, where the probes go), config (the role's config text, for the checksum), env (extra env entries as
     YAML text), replicas (omitted when an autoscaler owns them), grace (seconds),
     volumes / volumeMounts (extra, as YAML text), strategy (YAML text), tls (the services
     whose TLS Secrets it mounts: postgresql, redis, etcd, provider). */}}
{{- define "herald.deployment" -}}
{{- $root := .root -}}
{{- $name := printf "%s-%s" (include "herald.fullname" $root) .component -}}
apiVersion: apps/v1
kind: Deployment
metadata:
  name: {{ $name }}
  namespace: {{ $root.Release.Namespace }}
  labels:
    {{- include "herald.labels" (dict "root" $root "component" .component) | nindent 4 }}
spec:
  {{- if not (kindIs "invalid" .replicas) }}
  replicas: {{ .replicas }}
  {{- end }}
  revisionHistoryLimit: 5
  selector:
    matchLabels:
      {{- include "herald.selectorLabels" (dict "root" $root "component" .component) | nindent 6 }}
  strategy:
    {{- .strategy | nindent 4 }}
  template:
    metadata:
      {{- include "herald.podMetadata" (dict "root" $root "role" .role "component" .component "checksum" (.config | sha256sum)) | nindent 6 }}
    spec:
      serviceAccountName: {{ include "herald.serviceAccountName" $root }}
      automountServiceAccountToken: false
      terminationGracePeriodSeconds: {{ .grace }}
      securityContext:
        {{- toYaml $root.Values.podSecurityContext | nindent 8 }}
      {{- with include "herald.podPlacement" (dict "root" $root "role" .role "component" .component) | trim }}
{{- . | nindent 6 }}
{{- end }}
      containers:
        - name: {{ .component }}
          image: {{ include "herald.image" $root | quote }}
          imagePullPolicy: {{ $root.Values.image.pullPolicy }}
          args:
            {{- toYaml .args | nindent 12 }}
          ports:
            - name: {{ .portName }}
              containerPort: {{ .port }}
              protocol: TCP
            {{- with .adminPort }}
            - name: admin
              containerPort: {{ . }}
              protocol: TCP
            {{- end }}
          envFrom:
            - configMapRef:
                name: {{ $name }}
          {{- $env := trim (default "" .env) }}
          {{- if or $env .role.extraEnv }}
          env:
            {{- with $env }}
            {{- . | nindent 12 }}
            {{- end }}
            {{- with .role.extraEnv }}
            {{- toYaml . | nindent 12 }}
            {{- end }}
          {{- end }}
          {{- include "herald.probes" (ternary "admin" .portName (not (empty .adminPort))) | nindent 10 }}
          {{- with .preStopSeconds }}
          lifecycle:
            # Belt and braces with the API's own --shutdown-delay: the kubelet waits before
            # sending SIGTERM, so a replica leaves the endpoints before anything changes.
            preStop:
              sleep:
                seconds: {{ . }}
          {{- end }}
          resources:
            {{- toYaml .role.resources | nindent 12 }}
          securityContext:
            {{- toYaml $root.Values.securityContext | nindent 12 }}
          volumeMounts:
            {{- include "herald.tmpVolumeMount" . | nindent 12 }}
            {{- with include "herald.tlsVolumeMounts" (dict "root" $root "uses" .tls) | trim }}
            {{- . | nindent 12 }}
            {{- end }}
            {{- with .volumeMounts }}
            {{- . | nindent 12 }}
            {{- end }}
      volumes:
        {{- include "herald.tmpVolume" . | nindent 8 }}
        {{- with include "herald.tlsVolumes" (dict "root" $root "uses" .tls) | trim }}
        {{- . | nindent 8 }}
        {{- end }}
        {{- with .volumes }}
        {{- . | nindent 8 }}
        {{- end }}
{{- end -}}

{{/* Surge one new pod, keep every old one until it is ready. */}}
{{- define "herald.surgeOne" -}}
type: RollingUpdate
rollingUpdate:
  maxSurge: 1
  maxUnavailable: 0
{{- end -}}

{{/* The ClusterIP Service of one role. Call with (dict "root" $ "component" c "port" p "portName" n "servicePort" sp "type" t "annotations" a). */}}
{{- define "herald.service" -}}
apiVersion: v1
kind: Service
metadata:
  name: {{ include "herald.fullname" .root }}-{{ .component }}
  namespace: {{ .root.Release.Namespace }}
  labels:
    {{- include "herald.labels" (dict "root" .root "component" .component) | nindent 4 }}
    herald/scrape-job: {{ include "herald.scrapeJob" .component }}
  {{- with .annotations }}
  annotations:
    {{- toYaml . | nindent 4 }}
  {{- end }}
spec:
  type: {{ default "ClusterIP" .type }}
  selector:
    {{- include "herald.selectorLabels" (dict "root" .root "component" .component) | nindent 4 }}
  ports:
    - name: {{ .portName }}
      port: {{ default .port .servicePort }}
      targetPort: {{ .portName }}
      protocol: TCP
    {{- with .adminPort }}
    - name: admin
      port: {{ . }}
      targetPort: admin
      protocol: TCP
    {{- end }}
{{- end -}}
