package main
import (
 _ "go.uber.org/zap"
 _ "github.com/BurntSushi/toml"
 _ "github.com/cenkalti/backoff/v4"
 _ "github.com/coreos/go-systemd/v22/daemon"
 _ "github.com/coreos/go-systemd/v22/journal"
 _ "github.com/NVIDIA/go-nvml/pkg/nvml"
 _ "github.com/prometheus/client_golang/prometheus"
 _ "github.com/prometheus/client_golang/prometheus/promhttp"
 _ "github.com/prometheus/common/expfmt"
 _ "go.uber.org/goleak"
)
func main(){}
