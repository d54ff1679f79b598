{{/*
throttledjob.name: the chart name, or nameOverride; used in app.kubernetes.io/name.
*/}}
{{- define "throttledjob.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{/*
throttledjob.fullname: the prefix of every resource name, so two releases never clash;
"RELEASE" alone when the release name already contains the chart name.
*/}}
{{- define "throttledjob.fullname" -}}
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

{{/*
throttledjob.labels: the recommended labels on every object the chart creates, so
`kubectl get all -l app.kubernetes.io/instance=RELEASE` finds them.
*/}}
{{- define "throttledjob.labels" -}}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" }}
{{ include "throttledjob.selectorLabels" . }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
app.kubernetes.io/part-of: throttledjob
{{- end -}}

{{/*
throttledjob.selectorLabels: the immutable subset the Deployment selects its pods by.
*/}}
{{- define "throttledjob.selectorLabels" -}}
app.kubernetes.io/name: {{ include "throttledjob.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end -}}

{{/*
throttledjob.serviceAccountName: the ServiceAccount the operator runs as.
*/}}
{{- define "throttledjob.serviceAccountName" -}}
{{- if .Values.serviceAccount.create -}}
{{- default (include "throttledjob.fullname" .) .Values.serviceAccount.name -}}
{{- else -}}
{{- required "serviceAccount.name is required when serviceAccount.create is false" .Values.serviceAccount.name -}}
{{- end -}}
{{- end -}}

{{/*
throttledjob.nodeAgentVolumeUsers: the identities that may make objects mounting the node
agent's volume, as a CEL list of usernames (node-agent-admission.yaml): the operator, the
Job controller (its own ServiceAccount, or kube-controller-manager's user where the
controllers share it), the JobSet controller with jobset.enabled, and
gpu.nodeAgent.volumeUsers.
*/}}
{{- define "throttledjob.nodeAgentVolumeUsers" -}}
{{- $users := list
  (printf "system:serviceaccount:%s:%s" .Release.Namespace (include "throttledjob.serviceAccountName" .))
  "system:serviceaccount:kube-system:job-controller"
  "system:kube-controller-manager" -}}
{{- if .Values.jobset.enabled -}}
{{- $users = append $users (printf "system:serviceaccount:%s:%s" .Values.jobset.controllerServiceAccount.namespace .Values.jobset.controllerServiceAccount.name) -}}
{{- end -}}
{{- $users = concat $users .Values.gpu.nodeAgent.volumeUsers -}}
[{{- range $i, $u := $users }}{{ if $i }}, {{ end }}{{ $u | squote }}{{ end -}}]
{{- end -}}

{{/*
throttledjob.imageRef: "repository@digest" or "repository:tag" from an image dict, with
fallbacks; one rule for the operator and the sidecar image.
Arguments: (list IMAGE_DICT DEFAULT_REPOSITORY DEFAULT_TAG).
*/}}
{{- define "throttledjob.imageRef" -}}
{{- $img := index . 0 -}}
{{- $repo := default (index . 1) $img.repository -}}
{{- if $img.digest -}}
{{- printf "%s@%s" $repo $img.digest -}}
{{- else -}}
{{- printf "%s:%s" $repo (default (index . 2) $img.tag) -}}
{{- end -}}
{{- end -}}

{{/*
throttledjob.image / throttledjob.sidecarImage: the operator's image, and the sidecar's,
which defaults to the operator's (one image runs both).
*/}}
{{- define "throttledjob.image" -}}
{{- include "throttledjob.imageRef" (list .Values.image .Values.image.repository .Chart.AppVersion) -}}
{{- end -}}

{{- define "throttledjob.sidecarImage" -}}
{{- $tag := default .Chart.AppVersion .Values.image.tag -}}
{{- if and (not .Values.sidecar.image.repository) (not .Values.sidecar.image.tag) (not .Values.sidecar.image.digest) -}}
{{- include "throttledjob.image" . -}}
{{- else -}}
{{- include "throttledjob.imageRef" (list .Values.sidecar.image .Values.image.repository $tag) -}}
{{- end -}}
{{- end -}}

{{/*
throttledjob.operatorRules: the RBAC rules the operator needs in the namespaces it
watches: exactly the API calls of operator/ (docs/operator.md, "API calls"), checked
by tests/chart/test_rbac.py. kopf patches ThrottledJobs (progress annotations) and
posts Events; operator/kube.py gets, creates and patches the rest.
*/}}
{{- define "throttledjob.operatorRules" -}}
- apiGroups: [throttledjob.io]
  resources: [throttledjobs]
  verbs: [get, list, watch, patch]
- apiGroups: [throttledjob.io]
  resources: [throttledjobs/status]
  verbs: [patch]
# ThrottleBudgets: watched, read by each split, their status written (budget_pass.py).
- apiGroups: [throttledjob.io]
  resources: [throttlebudgets]
  verbs: [get, list, watch]
- apiGroups: [throttledjob.io]
  resources: [throttlebudgets/status]
  verbs: [patch]
# No call: the OwnerReferencesPermissionEnforcement admission plugin (on in OpenShift)
# checks it when the operator makes a Job or ConfigMap whose owner reference blocks the
# ThrottledJob's deletion.
- apiGroups: [throttledjob.io]
  resources: [throttledjobs/finalizers]
  verbs: [update]
- apiGroups: [batch]
  resources: [jobs]
  verbs: [get, list, watch, create, patch]
- apiGroups: [""]
  resources: [configmaps]
  verbs: [get, create, patch]
- apiGroups: [""]
  resources: [pods]
  verbs: [list]
- apiGroups: [""]
  resources: [pods/resize]
  verbs: [patch]
- apiGroups: [""]
  resources: [events]
  verbs: [create]
{{- if .Values.kueue.enabled }}
- apiGroups: [kueue.x-k8s.io]
  resources: [workloads]
  verbs: [list, patch]
{{- end }}
{{- if .Values.jobset.enabled }}
- apiGroups: [jobset.x-k8s.io]
  resources: [jobsets]
  verbs: [get, list, watch, create, patch]
{{- end }}
{{- if .Values.attach.enabled }}
# The webhook reads a new pod's chain of owners for their throttle label: a TrainJob's
# (the Jobs' and JobSets' reads are above).
- apiGroups: [trainer.kubeflow.org]
  resources: [trainjobs]
  verbs: [get]
{{- end }}
{{- end -}}

{{- /*
Stop the install, in one line, where an optional object's kind is not served by the
cluster (its CRDs are missing): Helm's own "no matches for kind" names neither what is
missing nor the value that turns the object off. Args: (list $ "group/version/Kind"
"the.value.that.enables.it" "what serves the kind").
*/}}
{{- define "throttledjob.requireKind" -}}
{{- $root := index . 0 }}{{- $kind := index . 1 }}{{- $value := index . 2 }}
{{- if not ($root.Capabilities.APIVersions.Has $kind) }}
{{- fail (printf "%s=true needs the kind %s, which this cluster does not serve: install %s first, or set %s=false" $value $kind (index . 3) $value) }}
{{- end }}
{{- end }}

{{- /*
Attach mode's webhook (webhook.yaml): its names, and the operator's settings for it.
*/}}
{{- define "throttledjob.webhookName" -}}
{{ include "throttledjob.fullname" . }}-webhook
{{- end }}
{{- define "throttledjob.webhookSecret" -}}
{{ include "throttledjob.fullname" . }}-webhook-tls
{{- end }}
{{- define "throttledjob.webhookEnv" -}}
{{- $svc := include "throttledjob.webhookName" . }}
- name: THROTTLEDJOB_WEBHOOK_PORT
  value: {{ .Values.attach.port | quote }}
- name: THROTTLEDJOB_WEBHOOK_SECRET
  value: {{ printf "%s/%s" .Release.Namespace (include "throttledjob.webhookSecret" .) | quote }}
- name: THROTTLEDJOB_WEBHOOK_HOSTS
  value: {{ printf "%s.%s.svc,%s.%s.svc.cluster.local" $svc .Release.Namespace $svc .Release.Namespace | quote }}
{{- if not .Values.attach.certManager.enabled }}
# The operator makes the certificate and writes its CA into this configuration.
- name: THROTTLEDJOB_WEBHOOK_CONFIG
  value: {{ include "throttledjob.fullname" . | quote }}
{{- end }}
{{- end }}
