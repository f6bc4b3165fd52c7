{{/*
The guard's pod: the Deployment's template, and under multiHost the
LeaderWorkerSet's leader and worker templates. Called with (dict "ctx" $
"role" ROLE): ROLE "single" (the Deployment), "leader" (rank 0: the API,
the proxy, the group's guard port, the state claim) or "worker" (a
follower: vLLM headless, no API port, its state on an emptyDir).
*/}}
{{- define "vllm-guard.podTemplate" -}}
{{- $role := .role }}
{{- with .ctx }}
{{- $fullname := include "vllm-guard.fullname" . }}
{{- $gpus := toString (int .Values.gpus) }}
{{- $resources := deepCopy .Values.resources }}
{{- range $kind := list "requests" "limits" }}
{{- $r := dict }}
{{- if hasKey $resources $kind }}{{ $r = get $resources $kind }}{{ end }}
{{- $_ := set $r "nvidia.com/gpu" $gpus }}
{{- $_ := set $resources $kind $r }}
{{- end }}
metadata:
  labels:
    {{- include "vllm-guard.selectorLabels" . | nindent 4 }}
    {{- with .Values.podLabels }}
    {{- toYaml . | nindent 4 }}
    {{- end }}
  annotations:
    # A changed configuration starts a new pod.
    checksum/config: {{ include "vllm-guard.toml" . | sha256sum }}
    {{- if not .Values.podMonitor.enabled }}
    prometheus.io/scrape: "true"
    prometheus.io/port: {{ include "vllm-guard.controlPort" . | quote }}
    prometheus.io/path: /metrics
    {{- end }}
    {{- with .Values.podAnnotations }}
    {{- toYaml . | nindent 4 }}
    {{- end }}
spec:
  # The guard's stop timeout ({{ include "vllm-guard.stopSeconds" . }}s: stopTimeoutSeconds, or
  # shutdownTimeoutSeconds + 10 when longer) plus
  # terminationGraceMarginSeconds: the guard stops vLLM's process group
  # with SIGTERM, SIGKILLs it after the stop timeout and exits before the
  # kubelet would kill it.
  terminationGracePeriodSeconds: {{ include "vllm-guard.graceSeconds" . }}
  # Neither the guard nor vLLM talks to the Kubernetes API: no token for
  # vLLM (or a model's remote code) to find in the pod.
  automountServiceAccountToken: false
  {{- with .Values.imagePullSecrets }}
  imagePullSecrets:
    {{- toYaml . | nindent 4 }}
  {{- end }}
  securityContext:
    seccompProfile:
      type: RuntimeDefault
    {{- if .Values.nonRoot.enabled }}
    runAsNonRoot: true
    runAsUser: {{ .Values.nonRoot.uid }}
    runAsGroup: {{ .Values.nonRoot.uid }}
    # The volumes are writable by the group; OnRootMismatch spares a model
    # cache of many files a recursive change at every start.
    fsGroup: {{ .Values.nonRoot.uid }}
    fsGroupChangePolicy: OnRootMismatch
    {{- end }}
  containers:
    - name: vllm-guard
      image: "{{ .Values.image.repository }}:{{ .Values.image.tag | default .Chart.AppVersion }}"
      imagePullPolicy: {{ .Values.image.pullPolicy }}
      # The image's entrypoint is ["vllm-guard", "run"].
      args: ["--config", "{{ include "vllm-guard.configDir" . }}/vllm-guard.toml"]
      ports:
        {{- if ne $role "worker" }}
        - name: http
          containerPort: {{ if .Values.proxy }}{{ include "vllm-guard.proxyPort" . }}{{ else }}{{ include "vllm-guard.vllmPort" . }}{{ end }}
        {{- end }}
        - name: guard
          containerPort: {{ include "vllm-guard.controlPort" . }}
        {{- if eq $role "leader" }}
        # The group's guard-to-guard port: the workers' guards connect here.
        - name: group
          containerPort: {{ .Values.multiHost.port }}
        {{- end }}
      env:
        - name: HF_HOME
          value: /data/huggingface
        {{- if .Values.nonRoot.enabled }}
        # vLLM, torch.compile, Triton and FlashInfer cache under HOME;
        # torch asks for the user's name, which uid {{ .Values.nonRoot.uid }} lacks in the image.
        - name: HOME
          value: /home/vllm
        - name: USER
          value: vllm
        {{- end }}
        {{- with .Values.hfTokenSecret.name }}
        - name: HF_TOKEN
          valueFrom:
            secretKeyRef:
              name: {{ . }}
              key: {{ $.ctx.Values.hfTokenSecret.key }}
        {{- end }}
        {{- with .Values.apiKeySecret.name }}
        # vLLM's API key: vLLM requires it of clients, the guard's probes
        # and proxy send it.
        - name: VLLM_API_KEY
          valueFrom:
            secretKeyRef:
              name: {{ . }}
              key: {{ $.ctx.Values.apiKeySecret.key }}
        {{- end }}
        {{- range $e := .Values.env }}
        {{- if and (eq (toString $e.name) "VLLM_API_KEY") (hasKey $e "value") }}
        {{- fail "env: VLLM_API_KEY with a value: set apiKeySecret instead (a key in the values sits in the release's history)" }}
        {{- end }}
        {{- /* --set env[0].value=1 reads a number; Kubernetes wants a string. */}}
        {{- if hasKey $e "value" }}{{ $e = merge (dict "value" (toString $e.value)) $e }}{{ end }}
        - {{ toYaml $e | nindent 10 | trim }}
        {{- end }}
      livenessProbe:
        httpGet:
          path: /livez
          port: guard
        periodSeconds: 10
        timeoutSeconds: 3
        failureThreshold: 3
      readinessProbe:
        httpGet:
          path: /readyz
          port: guard
        periodSeconds: 5
        timeoutSeconds: 3
        failureThreshold: 2
      securityContext:
        allowPrivilegeEscalation: false
        capabilities:
          drop: [ALL]
        {{- if .Values.nonRoot.enabled }}
        # Everything the guard and vLLM write is a volume: the state, the
        # control socket's folder, HOME and its caches, /tmp, /dev/shm,
        # the model cache. (Root keeps the image's writable /root.)
        readOnlyRootFilesystem: true
        {{- end }}
      resources:
        {{- toYaml $resources | nindent 8 }}
      volumeMounts:
        - name: config
          mountPath: {{ include "vllm-guard.configDir" . }}
          readOnly: true
        - name: run
          mountPath: {{ include "vllm-guard.socketDir" . }}
        - name: state
          mountPath: {{ include "vllm-guard.stateDir" . }}
        - name: models
          mountPath: /data
        - name: dshm
          mountPath: /dev/shm
        - name: tmp
          mountPath: /tmp
        {{- if ne $role "single" }}
        - name: group-secret
          mountPath: {{ include "vllm-guard.groupSecretDir" . }}
          readOnly: true
        {{- end }}
        {{- if .Values.nonRoot.enabled }}
        - name: home
          mountPath: /home/vllm
        {{- end }}
  {{- with .Values.nodeSelector }}
  nodeSelector:
    {{- toYaml . | nindent 4 }}
  {{- end }}
  {{- with .Values.tolerations }}
  tolerations:
    {{- toYaml . | nindent 4 }}
  {{- end }}
  {{- with .Values.affinity }}
  affinity:
    {{- toYaml . | nindent 4 }}
  {{- end }}
  volumes:
    - name: config
      configMap:
        name: {{ $fullname }}
        {{- if eq $role "worker" }}
        # A worker's TOML: the leader's without the proxy (a worker serves
        # no client), as the file --config names.
        items:
          - key: vllm-guard-worker.toml
            path: vllm-guard.toml
        {{- end }}
    - name: run
      emptyDir: {}
    {{- range $volume, $p := dict "state" .Values.persistence.state "models" .Values.persistence.modelCache }}
    - name: {{ $volume }}
      {{- /* A worker's guard decides nothing: its state lives with the pod. */}}
      {{- if and $p.enabled (not (and (eq $role "worker") (eq $volume "state"))) }}
      persistentVolumeClaim:
        claimName: {{ $p.existingClaim | default (printf "%s-%s" $fullname $volume) }}
      {{- else }}
      emptyDir: {}
      {{- end }}
    {{- end }}
    - name: dshm
      emptyDir:
        medium: Memory
        sizeLimit: {{ .Values.shmSize }}
    # torch.compile, Triton and Python's tempfile write under /tmp.
    - name: tmp
      emptyDir: {}
    {{- if ne $role "single" }}
    # The group's shared secret ([group] secret_file), readable by the
    # guard's group only.
    - name: group-secret
      secret:
        secretName: {{ .Values.multiHost.secret.name }}
        defaultMode: 0440
    {{- end }}
    {{- if .Values.nonRoot.enabled }}
    - name: home
      emptyDir: {}
    {{- end }}
{{- end }}
{{- end -}}
