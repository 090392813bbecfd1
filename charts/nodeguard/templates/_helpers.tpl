{{- define "nodeguard.labels" -}}
app.kubernetes.io/name: nodeguard
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/version: {{ .Values.image.tag | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version }}
{{- end }}

{{- define "nodeguard.selector" -}}
app.kubernetes.io/name: nodeguard
{{- end }}

{{- define "nodeguard.image" -}}
{{- if .Values.image.digest -}}
{{ .Values.image.repository }}:{{ .Values.image.tag }}@{{ .Values.image.digest }}
{{- else -}}
{{ .Values.image.repository }}:{{ .Values.image.tag }}
{{- end -}}
{{- end }}

{{/*
"true" when ghost Nodes are detected (a window, and the orphan scan, which
runs them, on), else "".
*/}}
{{- define "nodeguard.ghosts" -}}
{{- $zero := "^0+(\\.0+)?(ns|us|µs|ms|s|m|h)?$" -}}
{{- $flags := .Values.flags | default dict -}}
{{- $scanOff := and (hasKey $flags "orphan-scan-interval") (regexMatch $zero (toString (index $flags "orphan-scan-interval"))) -}}
{{- if and (not (regexMatch $zero (toString .Values.ghosts.window))) (not $scanOff) -}}
true
{{- end -}}
{{- end }}

{{/*
The registration webhook's match condition: admission.RegistersCondition
(a test keeps them equal).
*/}}
{{- define "nodeguard.registersCondition" -}}
request.operation == 'CREATE' || ((!has(oldObject.spec) || !has(oldObject.spec.providerID) || oldObject.spec.providerID == '') && has(object.spec) && has(object.spec.providerID) && object.spec.providerID != '')
{{- end }}

{{/*
The fleet's verbs on Secrets in the Clusters' namespaces: get (the
kubeconfig Secrets) and, issuing each workload API server its own client
certificate, create and patch (server-side apply of
<name>-nodeguard-webhook-client; create cannot be limited by name).
*/}}
{{- define "nodeguard.fleetSecretVerbs" -}}
{{- if .Values.fleet.clientCertificates.caSecretName -}}
["get", "create", "patch"]
{{- else -}}
["get"]
{{- end -}}
{{- end }}

{{/*
The name of an object several releases of this chart would otherwise share
(cluster-scoped, or in fleet.secretNamespaces): with fleet.watchFilter, each
shard's release has its own ("NAME-VALUE").
*/}}
{{- define "nodeguard.clusterScoped" -}}
{{- $root := index . 0 -}}
{{- $name := index . 1 -}}
{{- if and $root.Values.fleet.enabled $root.Values.fleet.watchFilter -}}
{{ printf "%s-%s" $name $root.Values.fleet.watchFilter }}
{{- else -}}
{{ $name }}
{{- end -}}
{{- end }}
