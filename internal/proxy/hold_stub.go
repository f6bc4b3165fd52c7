// A stand-in for the hold of issue 30 (item 1), which the proxy's
// hold-and-replay work writes in hold.go: resume.go needs only its
// signature. It waits, as retryTransport.waitReady does, for vLLM to be
// ready again, telling the caller every resumeTick so that a held stream
// carries a comment.

package proxy

import (
	"context"
	"errors"
	"time"
)

// holdLimit bounds a hold here; the real hold learns it from the restarts
// seen (issue 30: the longest time-to-ready × 1.5, at least 2 min).
const holdLimit = 10 * time.Minute

// resumeTick is how often a held stream gets its SSE comment.
var resumeTick = 5 * time.Second

var errHoldTimeout = errors.New("vLLM did not come back within the hold limit")

// holdUntilReady waits until vLLM is ready again (at least one readiness
// change or poll first: just after a cut the guard may not have noticed
// the death yet), calling tick every resumeTick.
func (p *Proxy) holdUntilReady(ctx context.Context, st *reqState, tick func(why string)) error {
	const why = "a failure"
	deadline := time.Now().Add(holdLimit)
	ticker := time.NewTicker(resumeTick)
	defer ticker.Stop()
	poll := time.NewTimer(retryPoll)
	defer poll.Stop()
	for first := true; ; first = false {
		if !first && p.readyNow() {
			return nil
		}
		if !time.Now().Before(deadline) {
			return errHoldTimeout
		}
		changed := p.lim.wait()
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-changed:
		case <-poll.C:
			poll.Reset(retryPoll)
		case <-ticker.C:
			tick(why)
		}
		p.refresh()
	}
}
