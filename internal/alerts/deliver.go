package alerts

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/cenkalti/backoff/v4"
	"go.uber.org/zap"

	"github.com/vllm-guard/vllm-guard/internal/proctree"
	"github.com/vllm-guard/vllm-guard/internal/redact"
)

// runCommand runs the [alerts] command with the event on stdin. The command
// runs in its own process group, and a timeout (or the guard's shutdown)
// kills its whole tree (killTree): whatever it started too (a shell script's
// curl), descendants that left the group with setsid included.
func (d *Dispatcher) runCommand(ctx context.Context, e Event, body []byte, command []string) {
	ctx, cancel := context.WithTimeout(ctx, d.commandTimeout)
	defer cancel()
	cmd := exec.CommandContext(ctx, command[0], command[1:]...)
	cmd.Stdin = bytes.NewReader(body)
	stderr := &tail{n: tailBytes}
	cmd.Stderr = stderr
	cmd.Env = append(childEnv(), "VLLM_GUARD_ALERT="+e.Alert, "VLLM_GUARD_ALERT_ACTIVE="+strconv.FormatBool(e.Active),
		"VLLM_GUARD_ALERT_SEVERITY="+e.Severity)
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	cmd.Cancel = func() error {
		if left := killTree(cmd.Process.Pid); len(left) > 0 {
			d.log.Error("alert command: processes of its tree survived SIGKILL; kill them by hand",
				zap.String("alert", e.Alert), zap.Ints("pids", left))
		}
		return nil
	}
	cmd.WaitDelay = time.Second // a grandchild that escaped the group may hold stderr open
	start := time.Now()
	// StartCommand registers the pid with the guard's reaper, which would
	// otherwise take the exit status Wait needs when the guard is PID 1.
	if err := proctree.StartCommand(cmd); err != nil {
		d.log.Error("alert command could not start; check [alerts] command", zap.String("alert", e.Alert),
			zap.Strings("command", command), zap.Error(err))
		return
	}
	err := cmd.Wait()
	proctree.ForgetCommand(cmd)
	took := time.Since(start)
	switch {
	case errors.Is(ctx.Err(), context.DeadlineExceeded):
		d.log.Error("alert command timed out and was killed; make it finish within the limit (run slow work in the background)",
			zap.String("alert", e.Alert), zap.Strings("command", command), zap.Duration("limit", d.commandTimeout),
			zap.String("stderr", stderr.String()))
	case ctx.Err() != nil:
		d.log.Warn("alert command stopped: the guard is shutting down", zap.String("alert", e.Alert), zap.Strings("command", command))
	case err != nil:
		d.log.Error("alert command failed", zap.String("alert", e.Alert), zap.Strings("command", command),
			zap.String("exit", exitText(err)), zap.Duration("took", took), zap.String("stderr", stderr.String()))
	default:
		d.log.Debug("alert command ran", zap.String("alert", e.Alert), zap.Duration("took", took))
	}
}

// childEnv is the guard's environment less what belongs to the guard's own
// service manager: a child must not send sd_notify messages as the guard.
func childEnv() []string {
	var out []string
	for _, kv := range os.Environ() {
		k, _, _ := strings.Cut(kv, "=")
		switch k {
		case "NOTIFY_SOCKET", "WATCHDOG_USEC", "WATCHDOG_PID", "LISTEN_FDS", "LISTEN_PID", "LISTEN_FDNAMES":
			continue
		}
		out = append(out, kv)
	}
	return out
}

func exitText(err error) string {
	var ee *exec.ExitError
	if errors.As(err, &ee) {
		if ws, ok := ee.Sys().(syscall.WaitStatus); ok && ws.Signaled() {
			return "killed by " + ws.Signal().String()
		}
		return fmt.Sprintf("exit code %d", ee.ExitCode())
	}
	return err.Error()
}

// postWebhook POSTs the event, retrying network errors, timeouts, 429 and
// 5xx answers with exponential backoff; other 4xx answers are final.
func (d *Dispatcher) postWebhook(ctx context.Context, e Event, body []byte, webhook string) {
	tries := 0
	op := func() error {
		tries++
		tctx, cancel := context.WithTimeout(ctx, d.webhookTimeout)
		defer cancel()
		req, err := http.NewRequestWithContext(tctx, http.MethodPost, webhook, bytes.NewReader(body))
		if err != nil {
			return backoff.Permanent(err)
		}
		req.Header.Set("Content-Type", "application/json")
		req.Header.Set("User-Agent", "vllm-guard")
		resp, err := d.client.Do(req)
		if err != nil {
			var ue *url.Error // its text holds the whole URL, token included
			if errors.As(err, &ue) {
				err = fmt.Errorf("%s %s: %w", ue.Op, redactURL(webhook), ue.Err)
			}
			return err
		}
		defer resp.Body.Close()
		snippet, _ := io.ReadAll(io.LimitReader(resp.Body, 512))
		_, _ = io.Copy(io.Discard, io.LimitReader(resp.Body, 64<<10))
		if resp.StatusCode >= 200 && resp.StatusCode < 300 {
			return nil
		}
		if resp.StatusCode >= 300 && resp.StatusCode < 400 {
			return backoff.Permanent(fmt.Errorf("webhook answered %s, a redirect to %s: refused, the alert was not re-sent there (a redirect could send it to another host, or from https to http); set [alerts] webhook to the final URL",
				resp.Status, redirectTarget(resp.Header.Get("Location"))))
		}
		err = fmt.Errorf("webhook answered %s: %s", resp.Status, strings.TrimSpace(string(snippet)))
		if resp.StatusCode == http.StatusTooManyRequests || resp.StatusCode == http.StatusRequestTimeout || resp.StatusCode >= 500 {
			return err
		}
		return backoff.Permanent(err)
	}
	b := backoff.NewExponentialBackOff(backoff.WithInitialInterval(d.retryInitial), backoff.WithMaxElapsedTime(0))
	retry := backoff.WithContext(backoff.WithMaxRetries(b, uint64(max(d.webhookTries-1, 0))), ctx)
	err := backoff.RetryNotify(op, retry, func(err error, next time.Duration) {
		d.log.Warn("alert webhook try failed; retrying", zap.String("alert", e.Alert), zap.String("webhook", redactURL(webhook)),
			zap.Int("try", tries), zap.Duration("retry_in", next), zap.Error(err))
	})
	if err != nil {
		d.log.Error("alert webhook failed; alert not delivered there", zap.String("alert", e.Alert),
			zap.String("webhook", redactURL(webhook)), zap.Int("tries", tries), zap.Error(err))
		return
	}
	d.log.Debug("alert posted", zap.String("alert", e.Alert), zap.Int("tries", tries))
}

// refuseRedirect stops the client at a redirect: the 3xx answer is the
// result, and postWebhook counts it as a failed delivery. Following it
// would POST the alert (and whatever the URL carries) somewhere the
// operator did not configure.
func refuseRedirect(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }

// redirectTarget names where a redirect pointed, without its path and
// query (they may carry a token).
func redirectTarget(loc string) string {
	if loc == "" {
		return "nowhere (no Location)"
	}
	if u, err := url.Parse(loc); err == nil && u.Host == "" {
		return "another path on the same host"
	}
	return redact.String(redactURL(loc))
}

// redactURL keeps the scheme and host of a webhook URL: its path and query
// often carry a token (Slack, PagerDuty) that must not reach the logs.
func redactURL(raw string) string {
	u, err := url.Parse(raw)
	if err != nil || u.Host == "" {
		return "(unparsable URL)"
	}
	return u.Scheme + "://" + u.Host + "/…"
}
