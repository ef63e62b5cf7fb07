{{/*
Names are fixed (deviceshare-operator, deviceshare-webhook, ...): cluster-scoped objects (the CRD,
ClusterRoles, webhook configurations) allow one deviceshare per cluster, and the kustomize base is
rendered from these templates with the same names.
*/}}

{{/* Labels of every object; `component` is the part (operator, webhook, crd...). */}}
{{- define "deviceshare.labels" -}}
app.kubernetes.io/name: deviceshare
app.kubernetes.io/component: {{ .component }}
app.kubernetes.io/part-of: deviceshare
app.kubernetes.io/managed-by: {{ .root.Release.Service }}
helm.sh/chart: {{ printf "%s-%s" .root.Chart.Name .root.Chart.Version }}
{{- end }}

{{/* Labels that select a component's pods (the same in every release of the chart). */}}
{{- define "deviceshare.selector" -}}
app.kubernetes.io/name: deviceshare
app.kubernetes.io/component: {{ . }}
{{- end }}

{{- define "deviceshare.image" -}}
{{ .Values.image.repository }}:{{ .Values.image.tag | default .Chart.AppVersion }}
{{- end }}

{{/* The operator's identity, which the admission policies trust. */}}
{{- define "deviceshare.operatorUser" -}}
system:serviceaccount:{{ .Release.Namespace }}:deviceshare-operator
{{- end }}

{{/* Pod placement shared by both Deployments. */}}
{{- define "deviceshare.placement" -}}
{{- with .Values.nodeSelector }}
nodeSelector:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- with .Values.tolerations }}
tolerations:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- end }}

{{/*
The webhook's serving certificate in self-signed mode, made once per render and kept in .Values
(shared by the Secret and both webhook configurations): the Secret already in the cluster if there is
one (an upgrade keeps it), else a new CA and a certificate for the Service's DNS names.
*/}}
{{- define "deviceshare.selfSignedTLS" -}}
{{- if not .Values._selfSignedTLS }}
{{- $found := lookup "v1" "Secret" .Release.Namespace "deviceshare-webhook-tls" }}
{{- if and $found (index ($found.data | default dict) "ca.crt") }}
{{- $_ := set .Values "_selfSignedTLS" (dict "ca" (index $found.data "ca.crt") "crt" (index $found.data "tls.crt") "key" (index $found.data "tls.key")) }}
{{- else }}
{{- $service := printf "deviceshare-webhook.%s.svc" .Release.Namespace }}
{{- $ca := genCA "deviceshare-ca" 3650 }}
{{- $cert := genSignedCert $service nil (list $service (printf "%s.cluster.local" $service)) 3650 $ca }}
{{- $_ := set .Values "_selfSignedTLS" (dict "ca" ($ca.Cert | b64enc) "crt" ($cert.Cert | b64enc) "key" ($cert.Key | b64enc)) }}
{{- end }}
{{- end }}
{{- end }}

{{/* clientConfig.caBundle (or the cert-manager annotation) for a webhook configuration. */}}
{{- define "deviceshare.caBundle" -}}
{{- if eq .Values.webhook.certificates "self-signed" }}
{{- include "deviceshare.selfSignedTLS" . }}
caBundle: {{ .Values._selfSignedTLS.ca }}
{{- else if and (eq .Values.webhook.certificates "external") .Values.webhook.caBundle }}
caBundle: {{ .Values.webhook.caBundle }}
{{- end }}
{{- end }}

{{- define "deviceshare.caInjection" -}}
{{- if eq .Values.webhook.certificates "cert-manager" }}
annotations:
  # namespace/name of the serving Certificate whose CA goes into every webhook's caBundle.
  cert-manager.io/inject-ca-from: {{ .Release.Namespace }}/deviceshare-webhook
{{- end }}
{{- end }}

{{/* Refuse values whose parts are not in this chart version yet, rather than ignore them. */}}
{{- define "deviceshare.notYet" -}}
{{- if and .Values.mps.enabled (not .Values.nodeAgent.enabled) }}
{{- fail "mps.enabled needs nodeAgent.enabled: the node agent tells which nodes run the MPS daemon (deviceshare.io/mps: ready)" }}
{{- end }}
{{- if and (gt (int .Values.operator.replicas) 1) (not .Values.operator.leaderElect) }}
{{- fail "operator.replicas > 1 needs operator.leaderElect: true (two schedulers would place groups twice)" }}
{{- end }}
{{- end }}

{{/*
"true" when the cluster already has the SharedDeviceGroup CRD and another owner put it there (`kubectl
apply -f crds/`, `deviceshare sandbox`, another release): Helm refuses to adopt an object without its
ownership metadata (meta.helm.sh/release-name and -namespace), so the chart leaves that CRD alone.
Empty when the CRD is absent, is this release's, or there is no cluster to ask (`helm template`).
*/}}
{{- define "deviceshare.crdOwnedElsewhere" -}}
{{- $crd := lookup "apiextensions.k8s.io/v1" "CustomResourceDefinition" "" "shareddevicegroups.deviceshare.io" }}
{{- if $crd }}
{{- $annotations := $crd.metadata.annotations | default dict }}
{{- if or (ne (get $annotations "meta.helm.sh/release-name") .Release.Name) (ne (get $annotations "meta.helm.sh/release-namespace") .Release.Namespace) }}true{{ end }}
{{- end }}
{{- end }}

{{/*
Fails the install, naming the value and what to install, when a cluster is there to ask (not under
`helm template`) and it lacks a CRD the value's objects need; the API server would only answer "the server
could not find the requested resource". Args: root, crd (its name), value (the setting), from (what brings it).
*/}}
{{- define "deviceshare.requireCRD" -}}
{{- if and (lookup "v1" "Namespace" "" "kube-system") (not (lookup "apiextensions.k8s.io/v1" "CustomResourceDefinition" "" .crd)) }}
{{- fail (printf "%s needs the CustomResourceDefinition %s, which this cluster does not have: install %s first, or leave %s unset" .value .crd .from .value) }}
{{- end }}
{{- end }}
