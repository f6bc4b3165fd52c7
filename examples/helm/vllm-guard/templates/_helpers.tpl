{{/*
Names and labels.
*/}}
{{/* Every object is named after the release: helm install vllm ... makes deployment/vllm. */}}
{{- define "vllm-guard.fullname" -}}
{{- .Release.Name | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{- define "vllm-guard.selectorLabels" -}}
app.kubernetes.io/name: {{ .Chart.Name }}
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end -}}

{{- define "vllm-guard.labels" -}}
{{ include "vllm-guard.selectorLabels" . }}
app.kubernetes.io/version: {{ .Values.image.tag | default .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" }}
{{- end -}}

{{/*
The guard's fixed places: the chart's probes, Service, PodMonitor and volumes
use the same ones the TOML names.
*/}}
{{- define "vllm-guard.controlPort" -}}9461{{- end -}}
{{- define "vllm-guard.proxyPort" -}}8080{{- end -}}
{{- define "vllm-guard.vllmPort" -}}8000{{- end -}}
{{- define "vllm-guard.stateDir" -}}/var/lib/vllm-guard{{- end -}}
{{- define "vllm-guard.socketDir" -}}/run/vllm-guard{{- end -}}
{{/*
The socket lives in a folder the guard makes itself (0750, its own) inside the
emptyDir at socketDir: the kubelet makes every emptyDir 0777 (02777 with
fsGroup), a folder anyone could write to, in which the guard refuses to serve
(exit 78). `vllm-guard status` in the pod finds the socket through the
ConfigMap (its default --config).
*/}}
{{- define "vllm-guard.socket" -}}{{ include "vllm-guard.socketDir" . }}/control/guard.sock{{- end -}}
{{- define "vllm-guard.configDir" -}}/etc/vllm-guard{{- end -}}
{{/* multiHost: where the group's Secret is mounted ([group] secret_file is its key there). */}}
{{- define "vllm-guard.groupSecretDir" -}}/etc/vllm-guard-group{{- end -}}

{{/*
The guard's effective stop timeout in seconds, as the supervisor computes it
(supervisor.EffectiveStopTimeout): max(stop_timeout, --shutdown-timeout + 10)
when vLLM is given a shutdown timeout, else stop_timeout.
*/}}
{{- define "vllm-guard.stopSeconds" -}}
{{- $stop := int .Values.stopTimeoutSeconds -}}
{{- $drain := int .Values.shutdownTimeoutSeconds -}}
{{- if gt $drain 0 -}}{{ max $stop (add $drain 10) }}{{- else -}}{{ $stop }}{{- end -}}
{{- end -}}

{{/* terminationGracePeriodSeconds: the stop timeout plus the margin. */}}
{{- define "vllm-guard.graceSeconds" -}}
{{- add (include "vllm-guard.stopSeconds" . | int) (int .Values.terminationGraceMarginSeconds) -}}
{{- end -}}

{{/* The GPUs vLLM spans: the pod's, times the group's size for multiHost "tp". */}}
{{- define "vllm-guard.spannedGPUs" -}}
{{- if and .Values.multiHost.enabled (eq .Values.multiHost.parallelism "tp") -}}
{{- mul (int .Values.gpus) (int .Values.multiHost.size) -}}
{{- else -}}
{{- int .Values.gpus -}}
{{- end -}}
{{- end -}}

{{- define "vllm-guard.tensorParallelSize" -}}
{{- int .Values.tensorParallelSize | default (include "vllm-guard.spannedGPUs" . | int) -}}
{{- end -}}

{{/*
vLLM's command line ([vllm] command), as a JSON array. Flags the chart sets
from other values are refused in extraArgs, so that what the chart derives
(the grace period, the GPU count) is what vLLM runs with. vLLM's parser takes
any unambiguous prefix of a flag for the flag, with underscores for dashes
(--api-ke is --api-key): $shortest is each flag's shortest such prefix among
vLLM's flags, from internal/vllmargs (TestChartKnowsVLLMsAbbreviations keeps
them equal), and every name from it up to the flag is refused.
*/}}
{{- define "vllm-guard.command" -}}
{{- $owned := dict
  "--shutdown-timeout" "shutdownTimeoutSeconds (the pod's grace period follows it)"
  "--tensor-parallel-size" "tensorParallelSize"
  "-tp" "tensorParallelSize"
  "--max-num-seqs" "profile.maxNumSeqs (the guard lowers it after an out-of-memory crash)"
  "--gpu-memory-utilization" "profile.gpuMemoryUtilization (the guard lowers it after an out-of-memory crash)"
  "--api-key" "apiKeySecret: put the key in a Secret (a key in the values sits in the release's history, the ConfigMap and the pod's command line)" -}}
{{- $shortest := dict
  "--shutdown-timeout" "--shu"
  "--tensor-parallel-size" "--te"
  "-tp" "-tp"
  "--max-num-seqs" "--max-num-se"
  "--gpu-memory-utilization" "--gp"
  "--api-key" "--api-k" -}}
{{- $extra := list -}}
{{- range $arg := .Values.extraArgs -}}
{{- $arg = toString $arg -}}
{{- $extra = append $extra $arg -}}
{{- $flag := regexReplaceAll "=.*$" $arg "" | replace "_" "-" -}}
{{- range $owner, $short := $shortest -}}
{{- if and (hasPrefix $short $flag) (hasPrefix $flag $owner) -}}
{{- /* The key itself is not repeated in the error (it lands in CI logs). */}}
{{- $named := ternary $flag $arg (eq $owner "--api-key") -}}
{{- if ne $flag $owner -}}{{- $named = printf "%s (vLLM reads it as %s)" $named $owner -}}{{- end -}}
{{- fail (printf "extraArgs: %s is set by the chart; set %s instead" $named (get $owned $owner)) -}}
{{- end -}}
{{- end -}}
{{- end -}}
{{- $tp := include "vllm-guard.tensorParallelSize" . | int -}}
{{- if gt $tp (include "vllm-guard.spannedGPUs" . | int) -}}
{{- if .Values.multiHost.enabled -}}
{{- fail (printf "tensorParallelSize %d is more than the group's %d GPUs (gpus x multiHost.size with parallelism tp, else gpus): vLLM needs a GPU for each tensor-parallel rank" $tp (include "vllm-guard.spannedGPUs" . | int)) -}}
{{- end -}}
{{- fail (printf "tensorParallelSize %d is more than gpus %d: vLLM needs a GPU for each tensor-parallel rank" $tp (int .Values.gpus)) -}}
{{- end -}}
{{- $cmd := list "vllm" "serve" .Values.model -}}
{{- with .Values.servedModelName -}}{{- $cmd = concat $cmd (list "--served-model-name" .) -}}{{- end -}}
{{- if gt $tp 1 -}}{{- $cmd = concat $cmd (list "--tensor-parallel-size" (toString $tp)) -}}{{- end -}}
{{- if gt (int .Values.shutdownTimeoutSeconds) 0 -}}
{{- $cmd = concat $cmd (list "--shutdown-timeout" (toString (int .Values.shutdownTimeoutSeconds))) -}}
{{- end -}}
{{- concat $cmd $extra | toJson -}}
{{- end -}}

{{/*
The guard's configuration as JSON: what the chart derives from its values,
then guardConfig merged over it table by table, key by key.
*/}}
{{- define "vllm-guard.config" -}}
{{- $vllm := dict
  "command" (include "vllm-guard.command" . | fromJsonArray)
  "host" "127.0.0.1"
  "port" (include "vllm-guard.vllmPort" . | int)
  "stop_timeout" (printf "%ds" (int .Values.stopTimeoutSeconds)) -}}
{{- $cfg := dict
  "vllm" $vllm
  "profile" (dict "max_num_seqs" .Values.profile.maxNumSeqs "gpu_memory_utilization" .Values.profile.gpuMemoryUtilization)
  "readiness" (dict "stall_timeout" "15m")
  "control" (dict
    "socket" (include "vllm-guard.socket" .)
    "http_listen" (printf "0.0.0.0:%s" (include "vllm-guard.controlPort" .))
    "state_dir" (include "vllm-guard.stateDir" .))
  "log" (dict "format" "json") -}}
{{- if .Values.multiHost.enabled -}}
{{- if not .Values.multiHost.secret.name -}}
{{- fail "multiHost.secret.name is empty: the guards sign every message with a shared secret; create a Secret (kubectl create secret generic vllm-group --from-literal=secret=\"$(head -c 32 /dev/urandom | base64)\") and name it there" -}}
{{- end -}}
{{- /* rank, size and leader_address come from LeaderWorkerSet's LWS_* variables. */ -}}
{{- $_ := set $cfg "group" (dict
  "enabled" true
  "parallelism" .Values.multiHost.parallelism
  "port" (int .Values.multiHost.port)
  "secret_file" (printf "%s/%s" (include "vllm-guard.groupSecretDir" .) .Values.multiHost.secret.key)) -}}
{{- $_ := set $cfg "restart" (dict "on_give_up" "stay") -}}
{{- end -}}
{{- if .Values.proxy -}}
{{- $_ := set $cfg "proxy" (dict "listen" (printf "0.0.0.0:%s" (include "vllm-guard.proxyPort" .))) -}}
{{- else -}}
{{- $_ := set $vllm "host" "0.0.0.0" -}}
{{- end -}}
{{- $owned := dict
  "vllm.command" "set model, servedModelName, gpus, tensorParallelSize, shutdownTimeoutSeconds or extraArgs instead"
  "vllm.stop_timeout" "set stopTimeoutSeconds instead (the pod's grace period follows it)"
  "control.socket" "it lies in a folder the guard makes inside the emptyDir the chart mounts"
  "control.http_listen" "the probes, the Service and the PodMonitor use port 9461"
  "control.state_dir" "the chart mounts the state volume there"
  "proxy.listen" "set proxy: true or false instead" -}}
{{- if .Values.multiHost.enabled -}}
{{- range $key, $how := dict "enabled" "set multiHost.enabled instead" "rank" "LeaderWorkerSet gives it (LWS_WORKER_INDEX)" "size" "set multiHost.size instead" "leader_address" "LeaderWorkerSet gives it (LWS_LEADER_ADDRESS)" "port" "set multiHost.port instead" "parallelism" "set multiHost.parallelism instead" "secret_file" "set multiHost.secret instead" -}}
{{- $_ := set $owned (printf "group.%s" $key) $how -}}
{{- end -}}
{{- $restart := get .Values.guardConfig "restart" | default dict -}}
{{- if and (kindIs "map" $restart) (hasKey $restart "on_give_up") (ne (toString (get $restart "on_give_up")) "stay") -}}
{{- fail (printf "guardConfig.restart.on_give_up %q with multiHost: a guard that exits on giving up restarts its container, LeaderWorkerSet recreates the group and the same failure starts again, in a loop; keep \"stay\" (the leader stays up, failed, not ready, until you act)" (toString (get $restart "on_give_up"))) -}}
{{- end -}}
{{- end -}}
{{- range $table, $keys := .Values.guardConfig -}}
{{- if not (kindIs "map" $keys) -}}
{{- fail (printf "guardConfig.%s: write a table of the guard's settings, such as guardConfig.readiness.stall_timeout" $table) -}}
{{- end -}}
{{- $into := dict -}}
{{- if hasKey $cfg $table -}}{{- $into = get $cfg $table -}}{{- end -}}
{{- range $key, $value := $keys -}}
{{- $path := printf "%s.%s" $table $key -}}
{{- if hasKey $owned $path -}}
{{- fail (printf "guardConfig.%s is set by the chart: %s" $path (get $owned $path)) -}}
{{- end -}}
{{- if and (eq $path "vllm.env") (kindIs "map" $value) (hasKey $value "VLLM_API_KEY") -}}
{{- fail "guardConfig.vllm.env.VLLM_API_KEY: set apiKeySecret instead: a key in the values sits in the release's history and the ConfigMap" -}}
{{- end -}}
{{- $_ := set $into $key $value -}}
{{- end -}}
{{- $_ := set $cfg $table $into -}}
{{- end -}}
{{- toJson $cfg -}}
{{- end -}}

{{/*
The guard's TOML, from vllm-guard.config: the tables in the order
vllm-guard.toml documents them (any other after, for the guard to refuse by
name), keys sorted.
*/}}
{{- define "vllm-guard.toml" -}}
{{- include "vllm-guard.tomlOf" (include "vllm-guard.config" . | fromJson) -}}
{{- end -}}

{{/* A multiHost worker's TOML: the leader's without the proxy. */}}
{{- define "vllm-guard.workerToml" -}}
{{- include "vllm-guard.tomlOf" (omit (include "vllm-guard.config" . | fromJson) "proxy") -}}
{{- end -}}

{{- define "vllm-guard.tomlOf" -}}
{{- $cfg := . -}}
{{- $order := list "vllm" "profile" "readiness" "liveness" "gpu" "restart" "control" "alerts" "proxy" "log" "group" -}}
{{- $tables := list -}}
{{- range $name := $order -}}{{- if hasKey $cfg $name -}}{{- $tables = append $tables $name -}}{{- end -}}{{- end -}}
{{- range $name := keys $cfg | sortAlpha -}}{{- if not (has $name $order) -}}{{- $tables = append $tables $name -}}{{- end -}}{{- end -}}
# Written by the vllm-guard chart from its values (guardConfig for the rest).
# vllm-guard.toml in the repository documents every key.
{{- range $name := $tables }}
{{- $table := get $cfg $name }}

[{{ $name }}]
{{- range $key := keys $table | sortAlpha }}
{{- $value := get $table $key }}
{{- if not (kindIs "invalid" $value) }}
{{ include "vllm-guard.tomlKey" $key }} = {{ include "vllm-guard.tomlValue" (dict "path" (printf "%s.%s" $name $key) "value" $value) }}
{{- end }}
{{- end }}
{{- end }}
{{ end -}}

{{- define "vllm-guard.tomlKey" -}}
{{- if regexMatch "^[A-Za-z0-9_-]+$" . -}}{{ . }}{{- else -}}{{ toJson . }}{{- end -}}
{{- end -}}

{{/*
One TOML value: a string, number or boolean (JSON writes them as TOML reads
them: whole numbers without a fraction, so they decode as integers), an
array of those, or an inline table of those ([vllm] env).
*/}}
{{- define "vllm-guard.tomlValue" -}}
{{- $v := .value -}}
{{- if kindIs "map" $v -}}
{{- $path := .path -}}
{ {{- range $i, $k := keys $v | sortAlpha }}{{ if $i }},{{ end }} {{ include "vllm-guard.tomlKey" $k }} = {{ include "vllm-guard.tomlScalar" (dict "path" (printf "%s.%s" $path $k) "value" (get $v $k)) }}{{ end }} }
{{- else if kindIs "slice" $v -}}
{{- range $e := $v -}}
{{- if or (kindIs "map" $e) (kindIs "slice" $e) -}}
{{- fail (printf "guardConfig.%s: an array of tables or arrays is no setting of the guard; write an array of strings" $.path) -}}
{{- end -}}
{{- end -}}
[{{ range $i, $e := $v }}{{ if $i }}, {{ end }}{{ toJson $e }}{{ end }}]
{{- else -}}
{{- include "vllm-guard.tomlScalar" . -}}
{{- end -}}
{{- end -}}

{{- define "vllm-guard.tomlScalar" -}}
{{- if or (kindIs "map" .value) (kindIs "slice" .value) -}}
{{- fail (printf "guardConfig.%s: a table or array inside a table's value is no setting of the guard" .path) -}}
{{- end -}}
{{- toJson .value -}}
{{- end -}}
