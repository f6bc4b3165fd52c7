// Package examples holds the deployment examples (systemd unit, Kubernetes
// manifests, Dockerfile, Prometheus rules, Grafana dashboard); it has no
// code, only tests that check the examples against the tools that read them
// and against the series package metrics exports.
package examples
