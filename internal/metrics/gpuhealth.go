package metrics

import (
	"slices"
	"strconv"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/vllm-guard/vllm-guard/internal/gpumon"
)

// The GPUs' hardware health (issue 33): XIDs counted since the guard
// started, uncorrected ECC counts, remapped rows, retired pages pending, a
// lost GPU. Built from the monitor's Health snapshot at scrape time
// (collector.go), so a device that left it, or a counter its driver does
// not report, simply has no series (never a made-up 0).

var (
	descXID = prometheus.NewDesc(Namespace+"_gpu_xid_total",
		"XID errors the GPU reported through NVML since the guard started, by XID (see NVIDIA's XID catalogue; gpu_fault in how-it-decides.md).",
		[]string{"gpu", "xid"}, nil)
	descECC = prometheus.NewDesc(Namespace+"_gpu_ecc_uncorrected_errors",
		"Uncorrected ECC errors NVML counts on the GPU: counter=\"volatile\" since the driver loaded, \"aggregate\" over its life; absent where ECC is not reported.",
		[]string{"gpu", "uuid", "counter"}, nil)
	descRemapped = prometheus.NewDesc(Namespace+"_gpu_remapped_rows",
		"Memory rows the row remapper replaced, by the error that caused it (kind=\"correctable\"|\"uncorrectable\"); absent where row remapping is not reported.",
		[]string{"gpu", "uuid", "kind"}, nil)
	descRemapPending = prometheus.NewDesc(Namespace+"_gpu_remap_pending",
		"1 while a row remap waits for the next GPU reset (the guard does not start vLLM on it), else 0.",
		[]string{"gpu", "uuid"}, nil)
	descRemapFailure = prometheus.NewDesc(Namespace+"_gpu_remap_failure",
		"1 when row remapping failed on the GPU (no spare rows left), else 0.",
		[]string{"gpu", "uuid"}, nil)
	descRetiredPending = prometheus.NewDesc(Namespace+"_gpu_retired_pages_pending",
		"1 while retired memory pages wait for a reset or reboot (GPUs before A100), else 0; absent where not reported.",
		[]string{"gpu", "uuid"}, nil)
	descThrottle = prometheus.NewDesc(Namespace+"_gpu_hw_throttle",
		"1 while the GPU's clocks are held down for a hardware reason (reason=\"hw_slowdown\"|\"hw_thermal\"|\"hw_power_brake\"|\"sw_thermal\"), else 0; absent where not reported.",
		[]string{"gpu", "uuid", "reason"}, nil)
	descLost = prometheus.NewDesc(Namespace+"_gpu_lost",
		"1 once NVML said the GPU is lost (fallen off the bus, or asking for a reset), else 0.",
		[]string{"gpu", "uuid"}, nil)
)

func describeHealth(ch chan<- *prometheus.Desc) {
	for _, d := range []*prometheus.Desc{descXID, descECC, descRemapped, descRemapPending, descRemapFailure, descRetiredPending, descThrottle, descLost} {
		ch <- d
	}
}

// collectHealth exports a Health snapshot.
func collectHealth(ch chan<- prometheus.Metric, h gpumon.Health) {
	for _, d := range h.Devices {
		gpu := strconv.Itoa(d.Index)
		xids := make([]uint64, 0, len(d.XIDCounts))
		for x := range d.XIDCounts {
			xids = append(xids, x)
		}
		slices.Sort(xids)
		for _, x := range xids {
			ch <- prometheus.MustNewConstMetric(descXID, prometheus.CounterValue, float64(d.XIDCounts[x]), gpu, strconv.FormatUint(x, 10))
		}
		if e := d.ECC; e != nil {
			ch <- prometheus.MustNewConstMetric(descECC, prometheus.GaugeValue, float64(e.VolatileUncorrected), gpu, d.UUID, "volatile")
			ch <- prometheus.MustNewConstMetric(descECC, prometheus.GaugeValue, float64(e.AggregateUncorrected), gpu, d.UUID, "aggregate")
		}
		if r := d.Remap; r != nil {
			ch <- prometheus.MustNewConstMetric(descRemapped, prometheus.GaugeValue, float64(r.Correctable), gpu, d.UUID, "correctable")
			ch <- prometheus.MustNewConstMetric(descRemapped, prometheus.GaugeValue, float64(r.Uncorrectable), gpu, d.UUID, "uncorrectable")
			ch <- prometheus.MustNewConstMetric(descRemapPending, prometheus.GaugeValue, b2f(r.Pending), gpu, d.UUID)
			ch <- prometheus.MustNewConstMetric(descRemapFailure, prometheus.GaugeValue, b2f(r.Failure), gpu, d.UUID)
		}
		if p := d.RetiredPagesPending; p != nil {
			ch <- prometheus.MustNewConstMetric(descRetiredPending, prometheus.GaugeValue, b2f(*p), gpu, d.UUID)
		}
		if d.ThrottleKnown {
			for _, r := range ThrottleReasons {
				ch <- prometheus.MustNewConstMetric(descThrottle, prometheus.GaugeValue, b2f(slices.Contains(d.Throttle, r)), gpu, d.UUID, r)
			}
		}
		ch <- prometheus.MustNewConstMetric(descLost, prometheus.GaugeValue, b2f(d.Lost || d.ResetRequired), gpu, d.UUID)
	}
}

// ThrottleReasons are the hardware clock event reasons exported, in order.
var ThrottleReasons = []string{"hw_slowdown", "hw_thermal", "hw_power_brake", "sw_thermal"}
