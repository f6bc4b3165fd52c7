package main

import (
	"slices"
	"time"
)

// supervisordProgram is one [program:x] section with supervisord's defaults
// (startsecs=1, startretries=3, autorestart=unexpected, exitcodes=0,
// stopasgroup=false, killasgroup=false): its process state machine from
// supervisor/process.py, without the clock.
type supervisordProgram struct {
	startsecs    time.Duration
	startretries int
	exitcodes    []int
	second       time.Duration // one second, scaled: BACKOFF waits backoff × second
	state        string        // STARTING, RUNNING, BACKOFF, EXITED, FATAL
	backoff      int
	laststart    time.Time
}

// spawned records a start.
func (p *supervisordProgram) spawned(now time.Time) {
	p.state, p.laststart = "STARTING", now
}

// supervisordNext is what supervisord does after an exit.
type supervisordNext struct {
	respawn bool
	after   time.Duration // delay before the respawn
	state   string        // the state the program is left in
}

// exited is finish() then transition(): an exit within startsecs is a
// failed start (BACKOFF, retried after 1, 2, 3 … s, FATAL after
// startretries); an exit after that is EXITED, respawned at once when the
// code is not in exitcodes. code is -1 for a death by signal.
func (p *supervisordProgram) exited(now time.Time, code int) supervisordNext {
	if now.Sub(p.laststart) < p.startsecs {
		p.backoff++
		if p.backoff > p.startretries {
			p.state = "FATAL"
			return supervisordNext{state: p.state}
		}
		p.state = "BACKOFF"
		return supervisordNext{respawn: true, after: time.Duration(p.backoff) * p.second, state: p.state}
	}
	p.backoff = 0
	p.state = "EXITED"
	if slices.Contains(p.exitcodes, code) {
		return supervisordNext{state: p.state}
	}
	return supervisordNext{respawn: true, state: p.state}
}
