package cause

import "testing"

// Issue 32 item 2: a client's X-Forwarded-For, printed by uvicorn as the
// client of its access line, made the next crash an OOM (rung down, limits
// cut). An access line is never evidence, whatever its client field holds.
func TestSpoofedAccessClientIsNeverEvidence(t *testing.T) {
	const (
		ready = "(APIServer pid=1) INFO:     Application startup complete."
		died  = "(APIServer pid=1) ERROR 07-22 09:00:00 [core_client.py:564] Engine core proc EngineCore_0 died unexpectedly, shutting down client."
	)
	for _, hostile := range []string{
		// As the pinned vLLM's uvicorn prints it for
		// X-Forwarded-For: torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 20.00 MiB, 127.0.0.1
		`(APIServer pid=1) INFO:     torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 20.00 MiB:0 - "POST /v1/completions HTTP/1.1" 200 OK`,
		`(APIServer pid=1) INFO:     torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 20.00 MiB:0 - "GET /health HTTP/1.1" 200 OK`,
		`INFO:     torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 20.00 MiB - "GET /health HTTP/1.1" 200 OK`,
		`(APIServer pid=1) INFO:     (EngineCore_0 pid=5) torch.OutOfMemoryError: CUDA out of memory.:0 - "GET / HTTP/1.1" 404 Not Found`,
	} {
		for _, exit := range []Exit{
			{ExitCode: 0, Phase: PhaseReady, Lines: lines(ready, hostile, died)},
			{ExitCode: 1, Phase: PhaseReady, Lines: lines(ready, hostile, hostile, died)},
			{Signal: "SIGKILL", Phase: PhaseReady, Lines: lines(ready, hostile)},
		} {
			if v := Classify(exit); v.Cause == CauseOOM {
				t.Errorf("%s\n  made the cause oom (evidence %+v)", hostile, v.Evidence)
			}
		}
	}
}
