// Package examples holds the deployment examples (systemd units, Kubernetes
// manifests, the Helm chart, Dockerfile, Prometheus rules, Grafana
// dashboard); it has no code, only tests that check the examples against
// the tools that read them and against the series package metrics exports.
// The Kubernetes manifests and the Helm chart are checked by examples/helm,
// a Go module of its own (Helm and the Kubernetes API types stay out of the
// guard's module).
package examples
