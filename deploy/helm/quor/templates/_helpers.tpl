{{/* Names, labels and the pieces every control-plane pod shares. */}}

{{- define "quor.fullname" -}}
{{- if .Values.fullnameOverride -}}
{{- .Values.fullnameOverride | trunc 40 | trimSuffix "-" -}}
{{- else if contains .Chart.Name .Release.Name -}}
{{- .Release.Name | trunc 40 | trimSuffix "-" -}}
{{- else -}}
{{- printf "%s-%s" .Release.Name .Chart.Name | trunc 40 | trimSuffix "-" -}}
{{- end -}}
{{- end -}}

{{- define "quor.image" -}}
{{- printf "%s:%s" .Values.image.repository (.Values.image.tag | default .Chart.AppVersion) -}}
{{- end -}}

{{/* Labels of every object the chart renders. */}}
{{- define "quor.labels" -}}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" }}
app.kubernetes.io/name: quor
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/version: {{ .Values.image.tag | default .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
{{- end -}}

{{/* Selector labels of one component's pods: call with (list $ "web"). */}}
{{- define "quor.selectorLabels" -}}
{{- $root := index . 0 -}}
app.kubernetes.io/name: quor
app.kubernetes.io/instance: {{ $root.Release.Name }}
app.kubernetes.io/component: {{ index . 1 }}
{{- end -}}

{{- define "quor.deployment" -}}
{{- .Values.deployment | default .Release.Name -}}
{{- end -}}

{{- define "quor.secretsName" -}}
{{- .Values.secrets.name | default (printf "%s-secrets" (include "quor.fullname" .)) -}}
{{- end -}}

{{- define "quor.egressCASecretName" -}}
{{- .Values.secrets.egressCA.secretName | default (printf "%s-egress-ca" (include "quor.fullname" .)) -}}
{{- end -}}

{{- define "quor.egressServiceName" -}}
{{- printf "%s-egress-proxy" (include "quor.fullname" .) -}}
{{- end -}}

{{- define "quor.webServiceHost" -}}
{{- printf "%s-web.%s.svc.%s" (include "quor.fullname" .) .Release.Namespace .Values.clusterDomain -}}
{{- end -}}

{{- define "quor.fileStoreClaim" -}}
{{- .Values.fileStore.volume.existingClaim | default (printf "%s-files" (include "quor.fullname" .)) -}}
{{- end -}}

{{/* Paths inside the control-plane containers. */}}
{{- define "quor.egressCADir" -}}/var/lib/quor/egress-ca{{- end -}}
{{- define "quor.fileStoreDir" -}}/var/lib/quor/files{{- end -}}

{{/*
The non-secret settings (QUOR_*), one map of strings as JSON (which, unlike YAML, keeps
"{}" and "true" strings): the ConfigMap holds it, and the migration Job, a pre-install
hook that runs before the ConfigMap exists, gets it inline.
*/}}
{{- define "quor.settingsJson" -}}
{{- $https := eq .Values.scheme "https" -}}
{{- $s := dict
  "QUOR_DEPLOYMENT" (include "quor.deployment" .)
  "QUOR_ALLOWED_HOSTS" .Values.host
  "QUOR_CSRF_TRUSTED_ORIGINS" (printf "%s://%s" .Values.scheme .Values.host)
  "QUOR_PUBLIC_URL" (printf "%s://%s" .Values.scheme .Values.host)
  "QUOR_SSL_REDIRECT" (ternary "true" "false" $https)
  "QUOR_BEHIND_TLS_PROXY" (ternary "true" "false" $https)
  "QUOR_TRUSTED_PROXY_COUNT" (ternary "1" "0" .Values.ingress.enabled)
  "QUOR_SANDBOX_API_URL" (printf "http://%s:8000" (include "quor.webServiceHost" .))
  "QUOR_SANDBOX_BACKEND" "kubernetes"
  "QUOR_SANDBOX_IMAGE" .Values.sandboxes.image
  "QUOR_EGRESS_PROXY_PORT" (toString .Values.egressProxy.port)
  "QUOR_EGRESS_CA_DIR" (include "quor.egressCADir" .)
  "QUOR_METRICS_PORT" "9100"
  "QUOR_KUBERNETES_NAMESPACE" .Values.sandboxes.namespace
  "QUOR_KUBERNETES_KUBECONFIG" ""
  "QUOR_KUBERNETES_EGRESS_SERVICE" (printf "%s/%s" .Release.Namespace (include "quor.egressServiceName" .))
  "QUOR_KUBERNETES_CONTROL_PLANE_CIDR" .Values.sandboxes.controlPlaneCIDR
  "QUOR_KUBERNETES_WORKSPACE_SIZE" .Values.sandboxes.workspaceSize
  "QUOR_KUBERNETES_STORAGE_CLASS" .Values.sandboxes.storageClassName
  "QUOR_KUBERNETES_EPHEMERAL_STORAGE" .Values.sandboxes.ephemeralStorage
  "QUOR_KUBERNETES_NODE_SELECTOR" (toJson .Values.sandboxes.nodeSelector)
  "QUOR_KUBERNETES_TOLERATIONS" (toJson .Values.sandboxes.tolerations)
  "QUOR_KUBERNETES_RUNTIME_CLASS" .Values.sandboxes.runtimeClassName
  "QUOR_KUBERNETES_IMAGE_PULL_POLICY" .Values.sandboxes.imagePullPolicy
  "QUOR_KUBERNETES_USER_NAMESPACES" (ternary "true" "false" .Values.sandboxes.userNamespaces)
-}}
{{- if .Values.webApps.enabled -}}
{{- $_ := set $s "QUOR_WEBAPP_BASE_URL" (printf "%s://%s" .Values.scheme .Values.webApps.domain) -}}
{{- $_ := set $s "QUOR_WEBAPP_PROXY_BIND" "0.0.0.0:8001" -}}
{{- end -}}
{{- if .Values.fileStore.s3.bucket -}}
{{- $_ := set $s "QUOR_FILE_STORE_S3_BUCKET" .Values.fileStore.s3.bucket -}}
{{- $_ := set $s "QUOR_FILE_STORE_S3_ENDPOINT_URL" .Values.fileStore.s3.endpointUrl -}}
{{- $_ := set $s "QUOR_FILE_STORE_S3_REGION" .Values.fileStore.s3.region -}}
{{- else -}}
{{- $_ := set $s "QUOR_FILE_STORE_DIR" (include "quor.fileStoreDir" .) -}}
{{- end -}}
{{- range $key, $value := .Values.config -}}
{{- if hasKey $s $key -}}
{{- fail (printf "config.%s: the chart sets %s from its own values; set those instead (docs/deploy-kubernetes.md)" $key $key) -}}
{{- end -}}
{{- $_ := set $s $key (toString $value) -}}
{{- end -}}
{{- toJson $s -}}
{{- end -}}

{{/* The secret settings, by reference (env entries). */}}
{{- define "quor.secretEnv" -}}
{{- $default := include "quor.secretsName" . -}}
{{- range $name, $entry := dict "QUOR_SECRET_KEY" .Values.secrets.secretKey "QUOR_ENCRYPTION_KEY" .Values.secrets.encryptionKey "DATABASE_URL" .Values.secrets.databaseUrl "REDIS_URL" .Values.secrets.redisUrl }}
- name: {{ $name }}
  valueFrom:
    secretKeyRef:
      name: {{ $entry.secretName | default $default }}
      key: {{ $entry.key }}
{{- end }}
{{- with .Values.fileStore.s3.credentialsSecret.name }}
- name: QUOR_FILE_STORE_S3_ACCESS_KEY_ID
  valueFrom:
    secretKeyRef:
      name: {{ . }}
      key: {{ $.Values.fileStore.s3.credentialsSecret.accessKeyIdKey }}
- name: QUOR_FILE_STORE_S3_SECRET_ACCESS_KEY
  valueFrom:
    secretKeyRef:
      name: {{ . }}
      key: {{ $.Values.fileStore.s3.credentialsSecret.secretAccessKeyKey }}
{{- end }}
# Python, proxy.py and Celery keep their caches under HOME: the writable /tmp.
- name: HOME
  value: /tmp
{{- end -}}

{{- define "quor.podSecurityContext" -}}
runAsNonRoot: true
runAsUser: {{ .Values.controlPlane.runAsUser }}
runAsGroup: {{ .Values.controlPlane.runAsGroup }}
fsGroup: {{ .Values.controlPlane.fsGroup }}
seccompProfile:
  type: RuntimeDefault
{{- end -}}

{{- define "quor.containerSecurityContext" -}}
runAsNonRoot: true
allowPrivilegeEscalation: false
privileged: false
readOnlyRootFilesystem: true
capabilities:
  drop: ["ALL"]
seccompProfile:
  type: RuntimeDefault
{{- end -}}

{{- define "quor.scheduling" -}}
{{- with .Values.controlPlane.nodeSelector }}
nodeSelector:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- with .Values.controlPlane.tolerations }}
tolerations:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- with .Values.imagePullSecrets }}
imagePullSecrets:
  {{- range . }}
  - name: {{ . }}
  {{- end }}
{{- end }}
{{- end -}}

{{/*
A control-plane Deployment. Call with a dict: root, component, replicas, args,
resources, serviceAccount, automount (whether the pod talks to the Kubernetes API),
and optionally ports, probes, egressCA, fileStore, recreate.
*/}}
{{- define "quor.deploymentObject" -}}
{{- $root := .root -}}
apiVersion: apps/v1
kind: Deployment
metadata:
  name: {{ include "quor.fullname" $root }}-{{ .component }}
  namespace: {{ $root.Release.Namespace }}
  labels:
    {{- include "quor.labels" $root | nindent 4 }}
    app.kubernetes.io/component: {{ .component }}
spec:
  replicas: {{ .replicas }}
  revisionHistoryLimit: 5
  {{- if .recreate }}
  strategy:
    type: Recreate
  {{- end }}
  selector:
    matchLabels:
      {{- include "quor.selectorLabels" (list $root .component) | nindent 6 }}
  template:
    metadata:
      labels:
        {{- include "quor.selectorLabels" (list $root .component) | nindent 8 }}
        org.quor.metrics: "true"
      annotations:
        checksum/config: {{ include "quor.settingsJson" $root | sha256sum }}
        {{- with $root.Values.controlPlane.podAnnotations }}
        {{- toYaml . | nindent 8 }}
        {{- end }}
    spec:
      serviceAccountName: {{ .serviceAccount }}
      automountServiceAccountToken: {{ .automount }}
      enableServiceLinks: false
      securityContext:
        {{- include "quor.podSecurityContext" $root | nindent 8 }}
      {{- with include "quor.scheduling" $root }}
      {{- . | nindent 6 }}
      {{- end }}
      containers:
        - name: {{ .component }}
          image: {{ include "quor.image" $root }}
          imagePullPolicy: {{ $root.Values.image.pullPolicy }}
          # args, not command: the image's entrypoint (tini) stays PID 1.
          args:
            {{- toYaml .args | nindent 12 }}
          envFrom:
            - configMapRef:
                name: {{ include "quor.fullname" $root }}-config
          env:
            {{- include "quor.secretEnv" $root | trim | nindent 12 }}
          ports:
            {{- with .ports }}
            {{- toYaml . | nindent 12 }}
            {{- end }}
            - name: metrics
              containerPort: 9100
              protocol: TCP
          {{- with .probes }}
          {{- toYaml . | nindent 10 }}
          {{- end }}
          resources:
            {{- toYaml .resources | nindent 12 }}
          securityContext:
            {{- include "quor.containerSecurityContext" $root | nindent 12 }}
          volumeMounts:
            - name: tmp
              mountPath: /tmp
            {{- if .fileStore }}
            {{- if not $root.Values.fileStore.s3.bucket }}
            - name: files
              mountPath: {{ include "quor.fileStoreDir" $root }}
            {{- end }}
            {{- end }}
            {{- if .egressCA }}
            - name: egress-ca-dir
              mountPath: {{ include "quor.egressCADir" $root }}
            {{- range list "ca.crt" "ca.key" "signing.key" }}
            {{- if or (ne . "signing.key") $root.Values.secrets.egressCA.signingKeyKey }}
            - name: egress-ca
              mountPath: {{ include "quor.egressCADir" $root }}/{{ . }}
              subPath: {{ . }}
              readOnly: true
            {{- end }}
            {{- end }}
            {{- end }}
      volumes:
        - name: tmp
          emptyDir: {}
        {{- if .fileStore }}
        {{- if not $root.Values.fileStore.s3.bucket }}
        - name: files
          persistentVolumeClaim:
            claimName: {{ include "quor.fileStoreClaim" $root }}
        {{- end }}
        {{- end }}
        {{- if .egressCA }}
        # The CA's directory is writable (proxy.py writes leaf certificates there); the
        # CA itself comes read-only from its Secret.
        - name: egress-ca-dir
          emptyDir: {}
        - name: egress-ca
          secret:
            secretName: {{ include "quor.egressCASecretName" $root }}
            defaultMode: 0440
            items:
              - key: {{ $root.Values.secrets.egressCA.certKey }}
                path: ca.crt
              - key: {{ $root.Values.secrets.egressCA.keyKey }}
                path: ca.key
              {{- with $root.Values.secrets.egressCA.signingKeyKey }}
              - key: {{ . }}
                path: signing.key
              {{- end }}
        {{- end }}
{{- end -}}
