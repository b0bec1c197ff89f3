{{/*
Names, labels, images, security contexts and secret handling shared by every template.
*/}}

{{/* The chart name, or nameOverride. */}}
{{- define "recstore.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{/* The prefix of every object name: the release name, plus the chart name unless the release
name already contains it. Truncated so that suffixes such as "-postgresql" still fit 63. */}}
{{- define "recstore.fullname" -}}
{{- if .Values.fullnameOverride -}}
{{- .Values.fullnameOverride | trunc 40 | trimSuffix "-" -}}
{{- else -}}
{{- $name := default .Chart.Name .Values.nameOverride -}}
{{- if contains $name .Release.Name -}}
{{- .Release.Name | trunc 40 | trimSuffix "-" -}}
{{- else -}}
{{- printf "%s-%s" .Release.Name $name | trunc 40 | trimSuffix "-" -}}
{{- end -}}
{{- end -}}
{{- end -}}

{{- define "recstore.chart" -}}
{{- printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{/* Labels on every object. */}}
{{- define "recstore.labels" -}}
helm.sh/chart: {{ include "recstore.chart" . }}
app.kubernetes.io/name: {{ include "recstore.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
app.kubernetes.io/part-of: recstore
{{- with .Values.commonLabels }}
{{ toYaml . }}
{{- end }}
{{- end -}}

{{/* Selector labels of one component; call with (dict "ctx" $ "component" "admin"). */}}
{{- define "recstore.selectorLabels" -}}
app.kubernetes.io/name: {{ include "recstore.name" .ctx }}
app.kubernetes.io/instance: {{ .ctx.Release.Name }}
app.kubernetes.io/component: {{ .component }}
{{- end -}}

{{/* All labels of one component's objects; same argument as recstore.selectorLabels. */}}
{{- define "recstore.componentLabels" -}}
{{ include "recstore.labels" .ctx }}
app.kubernetes.io/component: {{ .component }}
{{- end -}}

{{/* Object names. */}}
{{- define "recstore.operator.fullname" -}}{{ include "recstore.fullname" . }}-operator{{- end -}}
{{- define "recstore.admin.fullname" -}}{{ include "recstore.fullname" . }}-admin{{- end -}}
{{- define "recstore.postgresql.fullname" -}}{{ include "recstore.fullname" . }}-postgresql{{- end -}}

{{/* The admin API's in-cluster URL (what the operator mirrors status to); https with tls. */}}
{{- define "recstore.admin.url" -}}
{{- printf "%s://%s.%s.svc:%d" (.Values.tls.enabled | ternary "https" "http") (include "recstore.admin.fullname" .) .Release.Namespace (int .Values.admin.service.port) -}}
{{- end -}}

{{/* Namespaces whose tables the operator serves, as a JSON list: operator.watchNamespaces, else
the release namespace. With rbac.clusterWide and no list it serves every namespace; this is
then where the chart puts what tables need (Secret copies, Certificates, NetworkPolicies). */}}
{{- define "recstore.servedNamespaces" -}}
{{- uniq (prepend .Values.operator.watchNamespaces .Release.Namespace) | toJson -}}
{{- end -}}

{{/* Where the TLS Secret (tls.crt, tls.key, ca.crt) is mounted in the chart's pods; the
operator mounts it at the same path in the PS pods (recstore.operator.render.TLS_DIR). */}}
{{- define "recstore.tlsDir" -}}/var/run/secrets/recstore-tls{{- end -}}

{{/* A full image reference; call with (dict "ctx" $ "image" .Values.admin.image). */}}
{{- define "recstore.image" -}}
{{- $tag := .image.tag | default .ctx.Values.image.tag | default .ctx.Chart.AppVersion -}}
{{- printf "%s%s:%s" .ctx.Values.image.registry .image.repository $tag -}}
{{- end -}}

{{/* Pod-level security context: non-root, RuntimeDefault seccomp. Call with a uid. */}}
{{- define "recstore.podSecurityContext" -}}
runAsNonRoot: true
runAsUser: {{ . }}
runAsGroup: {{ . }}
fsGroup: {{ . }}
fsGroupChangePolicy: OnRootMismatch
seccompProfile:
  type: RuntimeDefault
{{- end -}}

{{/* Container-level security context: read-only root, no privilege escalation, no
capabilities. Writable paths are emptyDir or PVC mounts. */}}
{{- define "recstore.containerSecurityContext" -}}
runAsNonRoot: true
allowPrivilegeEscalation: false
readOnlyRootFilesystem: true
privileged: false
capabilities:
  drop:
    - ALL
seccompProfile:
  type: RuntimeDefault
{{- end -}}

{{/* Secret names and the keys the values live under. */}}
{{- define "recstore.bootstrapTokenSecret" -}}
{{- .Values.auth.bootstrapToken.existingSecret | default (printf "%s-admin-token" (include "recstore.fullname" .)) -}}
{{- end -}}

{{- define "recstore.psTokenSecret" -}}
{{- .Values.auth.psToken.existingSecret | default (printf "%s-ps-token" (include "recstore.fullname" .)) -}}
{{- end -}}

{{- define "recstore.operatorTokenSecret" -}}
{{- .Values.auth.operatorToken.existingSecret | default (printf "%s-operator-token" (include "recstore.fullname" .)) -}}
{{- end -}}

{{- define "recstore.tlsSecret" -}}
{{- .Values.tls.existingSecret | default (printf "%s-tls" (include "recstore.fullname" .)) -}}
{{- end -}}

{{- define "recstore.postgresql.secret" -}}
{{- .Values.postgresql.existingSecret | default (include "recstore.postgresql.fullname" .) -}}
{{- end -}}

{{/* A base64 secret value that survives upgrades: the value already stored in the cluster
when the Secret exists (lookup), a fresh random one otherwise. Offline rendering (helm
template, lint) has no cluster, so it always generates. Call with
(dict "ctx" $ "name" "secret-name" "key" "token"). */}}
{{- define "recstore.persistentSecretValue" -}}
{{- $existing := lookup "v1" "Secret" .ctx.Release.Namespace .name | default dict -}}
{{- $stored := dig "data" .key "" $existing -}}
{{- if $stored -}}
{{- $stored -}}
{{- else -}}
{{- randAlphaNum 48 | b64enc -}}
{{- end -}}
{{- end -}}

{{/* Which catalogue database the admin API uses: "external", "postgresql" or "sqlite".
Setting both external and bundled is refused rather than silently picking one. */}}
{{- define "recstore.databaseMode" -}}
{{- $external := .Values.database.external.urlSecret.name -}}
{{- if and $external .Values.postgresql.enabled -}}
{{- fail "database.external.urlSecret.name and postgresql.enabled are mutually exclusive: choose one catalogue database" -}}
{{- else if $external -}}
external
{{- else if .Values.postgresql.enabled -}}
postgresql
{{- else -}}
sqlite
{{- end -}}
{{- end -}}

{{/* Prometheus scrape annotations for a pod serving /metrics on the given port. */}}
{{- define "recstore.scrapeAnnotations" -}}
prometheus.io/scrape: "true"
prometheus.io/port: {{ . | quote }}
prometheus.io/path: /metrics
{{- end -}}

{{/* The namespaced rules the operator needs where it serves tables: its own resource (kopf
patches finalizers, annotations and status; owner references with blockOwnerDeletion need
update on finalizers), the children it creates (merge-patched, never replaced), pods and
claims only to read, events (kopf posts core/v1 events), and, when PS nodes require a token,
that one Secret (the operator authenticates its own CreateTable and Save calls with it). The TLS
Secret is mounted into PS pods by the kubelet: the operator never reads it. */}}
{{- define "recstore.operator.namespacedRules" -}}
- apiGroups: ["recstore.io"]
  resources: ["embeddingtables", "embeddingpools"]
  verbs: ["get", "list", "watch", "patch"]
- apiGroups: ["recstore.io"]
  resources: ["embeddingtables/status", "embeddingpools/status"]
  # update: a reshard's record is written with PUT, against its resourceVersion
  verbs: ["get", "patch", "update"]
- apiGroups: ["recstore.io"]
  resources: ["embeddingtables/finalizers", "embeddingpools/finalizers"]
  verbs: ["update"]
- apiGroups: ["apps"]
  resources: ["statefulsets"]
  verbs: ["get", "list", "watch", "create", "patch", "delete"]
- apiGroups: [""]
  resources: ["services"]
  verbs: ["get", "list", "watch", "create", "patch", "delete"]
- apiGroups: ["policy"]
  resources: ["poddisruptionbudgets"]
  verbs: ["get", "list", "watch", "create", "patch", "delete"]
- apiGroups: [""]
  resources: ["pods", "persistentvolumeclaims"]
  verbs: ["get", "list", "watch"]
- apiGroups: [""]
  resources: ["events"]
  verbs: ["create"]
{{- if .Values.auth.psToken.enabled }}
- apiGroups: [""]
  resources: ["secrets"]
  resourceNames: [{{ include "recstore.psTokenSecret" . | quote }}]
  verbs: ["get"]
{{- end }}
{{- end -}}
