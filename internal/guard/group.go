package guard

import (
	"context"
	"crypto/rand"
	"encoding/binary"
	"maps"
	"net"
	"strconv"
	"sync"
	"time"

	"go.uber.org/zap"

	"github.com/vllm-guard/vllm-guard/internal/cause"
	"github.com/vllm-guard/vllm-guard/internal/config"
	"github.com/vllm-guard/vllm-guard/internal/control"
	"github.com/vllm-guard/vllm-guard/internal/exitcode"
	"github.com/vllm-guard/vllm-guard/internal/group"
	"github.com/vllm-guard/vllm-guard/internal/policy"
	"github.com/vllm-guard/vllm-guard/internal/supervisor"
	"github.com/vllm-guard/vllm-guard/internal/vllmargs"
)

// groupMember is this guard's place in a [group]: the group's machine and its
// transport (internal/group) on one side, this host's supervisor on the
// other: the supervisor's Group, and (as local) the machine's Local.
type groupMember struct {
	cfg config.Group
	log *zap.Logger
	sup *supervisor.Supervisor
	d   *group.Driver

	mu    sync.Mutex
	epoch uint64 // the epoch this host's vLLM was let start for
	addr  string // the leader's guard address, for status
}

// doc is this member's view of the group for status; nil without a group
// (or before it is joined).
func (m *groupMember) doc(now time.Time) *control.Group {
	if m == nil {
		return nil
	}
	m.mu.Lock()
	d, addr := m.d, m.addr
	m.mu.Unlock()
	if d == nil {
		return nil
	}
	s := d.State()
	g := &control.Group{Rank: s.Cfg.Rank, Size: s.Cfg.Size, Leader: addr, Epoch: s.Epoch, Phase: s.Phase.String(), Rung: s.Rung, Ready: s.GroupReady()}
	self := s.Say()
	for r, mem := range s.Members {
		if r == s.Cfg.Rank {
			continue
		}
		gm := control.GroupMember{Rank: r, Heard: mem.Heard, Present: mem.Present(now, s.Cfg.LossTimeout)}
		if mem.Incarnation != 0 {
			gm.Said, gm.Epoch = mem.Said.Kind.String(), mem.Said.Epoch
		} else {
			gm.Heard = time.Time{}
		}
		g.Members = append(g.Members, gm)
	}
	me := control.GroupMember{Rank: s.Cfg.Rank, This: true, Said: self.Kind.String(), Epoch: self.Epoch, Present: true}
	i := min(s.Cfg.Rank, len(g.Members))
	g.Members = append(g.Members[:i], append([]control.GroupMember{me}, g.Members[i:]...)...)
	return g
}

// groupArgs is what a group adds to vLLM's start: the multi-node flags
// appended to extra (a contradiction is the operator's to fix), and the
// shortened engine wait in its environment.
func groupArgs(cfg *config.Config, extra []string) ([]string, error) {
	if !cfg.Group.Enabled {
		return extra, nil
	}
	args, err := cfg.VLLMArgs(extra)
	if err != nil {
		return nil, err
	}
	flags, err := args.GroupFlags(cfg.Group.VLLM())
	if err != nil {
		return nil, &config.Error{File: cfg.Path, Key: "[vllm] command", Msg: err.Error(), Err: err}
	}
	if env := vllmargs.GroupEnv(cfg.Group.EngineReadyTimeout.Duration, vllmargs.EnvOf(cfg.VLLM.Env, vllmargs.OSEnv)); env != nil {
		merged := maps.Clone(cfg.VLLM.Env)
		if merged == nil {
			merged = map[string]string{}
		}
		maps.Copy(merged, env)
		cfg.VLLM.Env = merged
	}
	return append(append([]string(nil), extra...), flags...), nil
}

// startGroup opens the group's transport and runs its machine until ctx
// ends; the returned stop closes the transport once the machine stopped.
// An error (the secret, the leader's port) is the operator's to fix.
func (g *Guard) startGroup(ctx context.Context, background func(func(context.Context))) (func(), int) {
	m := g.member
	gc := m.cfg
	secret, err := group.ReadSecret(gc.SecretFile)
	if err != nil {
		g.log.Error("cannot join the group: fix [group] secret_file", zap.Error(err))
		return nil, exitcode.Config
	}
	addr := net.JoinHostPort(gc.LeaderAddress, strconv.Itoa(gc.Port))
	if gc.Rank == 0 {
		addr = ":" + strconv.Itoa(gc.Port)
	}
	var inc [8]byte
	rand.Read(inc[:])
	node, err := group.Start(group.Options{Rank: gc.Rank, Size: gc.Size, Address: addr, Secret: secret,
		Incarnation: binary.BigEndian.Uint64(inc[:]) | 1, Interval: gc.HeartbeatInterval.Duration, LossTimeout: gc.LossTimeout.Duration,
		Refused: func(peer string, err error) {
			m.log.Warn("a group connection refused", zap.String("peer", peer), zap.Error(err))
		}})
	if err != nil {
		g.log.Error("cannot join the group", zap.Error(err))
		return nil, exitcode.Config
	}
	d := group.NewDriver(group.Config{Rank: gc.Rank, Size: gc.Size, LossTimeout: gc.LossTimeout.Duration}, node, local{m}, gc.HeartbeatInterval.Duration)
	m.mu.Lock()
	m.d, m.addr = d, net.JoinHostPort(gc.LeaderAddress, strconv.Itoa(gc.Port))
	m.mu.Unlock()
	g.log.Info("joined the group", zap.Int("rank", gc.Rank), zap.Int("size", gc.Size), zap.String("guards", addr))
	stopped := make(chan struct{})
	background(func(ctx context.Context) { defer close(stopped); d.Run(ctx) })
	return func() { <-stopped; node.Close() }, 0
}

// local is the machine's Local: what the group asks of this host.
type local struct{ *groupMember }

func (m local) Kill(epoch uint64, c group.Cause) {
	rank := c.Member
	if c.Local() {
		rank = m.cfg.Rank
	}
	m.sup.GroupEnd(cause.GroupEnd{Epoch: epoch, Rank: rank, Said: c.Said().Word(), Why: c.String()})
}

func (m local) Start(epoch uint64, rung int, member int, fault group.Fault) {
	m.mu.Lock()
	m.epoch = epoch
	m.mu.Unlock()
	m.log.Info("the group lets this host's vLLM start", zap.Uint64("epoch", epoch))
	if m.cfg.Rank == 0 && fault != 0 {
		m.log.Warn("a member's guard says its own vLLM ended the last epoch: the group's ladder reacts to its cause",
			zap.Int("member", member), zap.String("cause", fault.Word()))
		m.sup.GroupGoAfter(member, cause.Cause(fault.Word()))
		return
	}
	m.sup.GroupGo(rung)
}

func (m local) Ended(epoch uint64, c group.Cause) {
	m.log.Warn("the group's epoch ended: every host kills its vLLM tree", zap.Uint64("epoch", epoch), zap.Stringer("why", c))
}

// The supervisor's Group: what it tells of this host's vLLM.

func (m *groupMember) Launched(r policy.Rung) {
	if m.cfg.Rank == 0 {
		m.d.LocalLaunched(m.started(), r.Index)
	}
}

func (m *groupMember) Ready() {
	if m.cfg.Rank == 0 {
		m.d.LocalReady(m.started())
	}
}

func (m *groupMember) Ended() { m.d.LocalEnded(false) }
func (m *groupMember) Gone(ended cause.Cause) {
	m.d.LocalGone(group.FaultOf(string(ended)))
}

// GaveUp: the leader's guard gave up: the group hears it, and no epoch
// opens until the leader's guard starts again. A follower's own give-up (a
// GPU of its own that needs a reset) is its host's: it says nothing more.
func (m *groupMember) GaveUp() {
	if m.cfg.Rank == 0 {
		m.d.LocalGaveUp()
	}
}

func (m *groupMember) Follower() bool   { return m.cfg.Rank != 0 }
func (m *groupMember) GroupReady() bool { return m.d != nil && m.d.State().GroupReady() }

func (m *groupMember) started() uint64 {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.epoch
}
