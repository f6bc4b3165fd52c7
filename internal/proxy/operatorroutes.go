package proxy

import (
	"net/http"
	"strings"
)

// operatorRoutes are vLLM 0.32.0's routes that change or read the
// engine's own life rather than answer a client (docs/standby-facts.md):
// sleep mode and the other dev-mode routes (served only with
// VLLM_SERVER_DEV_MODE=1, none behind vLLM's API key), the RL weight
// routes, the profiler, elastic scaling and fault-tolerance instructions.
// The guard owns vLLM's life (a sleeping standby, a paused engine, a
// profile that fills the disk): a client of the proxy reaches none of
// them, whatever the method. An operator who must reaches vLLM's own port.
var operatorRoutes = map[string]bool{
	"/sleep": true, "/wake_up": true, "/is_sleeping": true, "/release_kv_cache_memory": true,
	"/collective_rpc": true, "/reset_prefix_cache": true, "/reset_mm_cache": true,
	"/reset_encoder_cache": true, "/server_info": true,
	"/pause": true, "/resume": true, "/abort_requests": true, "/is_paused": true,
	"/init_weight_transfer_engine": true, "/shutdown_weight_transfer_engine": true,
	"/start_weight_update": true, "/start_draft_weight_update": true, "/update_weights": true,
	"/finish_weight_update": true,
	"/start_profile":        true, "/stop_profile": true,
	"/scale_elastic_ep": true, "/is_scaling_elastic_ep": true,
	"/fault_tolerance/apply": true, "/fault_tolerance/status": true,
}

// IsOperatorRoute says whether r names one of vLLM's operator routes, on
// the path as cleanPath leaves it (and as vLLM routes it: percent-decoded),
// compared in any case.
func IsOperatorRoute(r *http.Request) bool {
	return operatorRoutes[strings.ToLower(cleanPath(r.URL.Path))]
}

// refuseOperatorRoute answers a client's request for an operator route.
func (p *Proxy) refuseOperatorRoute(w http.ResponseWriter, r *http.Request) {
	p.lim.reject(reasonOperatorRoute)
	p.m.rejected.WithLabelValues(reasonOperatorRoute).Inc()
	writeError(w, http.StatusForbidden, "permission_error",
		cleanPath(r.URL.Path)+" changes vLLM's own life (sleep, wake, pause, weights, profiler), which vllm-guard owns; "+
			"it is not served through the proxy. Use vllm-guard's commands, or vLLM's own port from the host")
}
