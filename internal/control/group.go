package control

import (
	"fmt"
	"io"
	"text/tabwriter"
	"time"
)

// Group is a vLLM across hosts' part of the status document ([group],
// issue 44), as this member's guard knows it: its place, the group's
// epoch, whether the group is ready, and what it last heard of each
// member (a member's word is a kind, never its text).
type Group struct {
	Rank   int    `json:"rank"`
	Size   int    `json:"size"`
	Leader string `json:"leader"` // the leader's guard address (host:port)
	// Epoch is the leader's current epoch (a follower's: the newest it
	// knows); Phase where this guard is in it.
	Epoch uint64 `json:"epoch"`
	Phase string `json:"phase"`
	Rung  int    `json:"rung"` // the rung the group's epoch runs on
	// Ready: the leader's vLLM of the epoch passed its readiness gate
	// (which implies every rank loaded).
	Ready   bool          `json:"ready"`
	Members []GroupMember `json:"members"`
}

// GroupMember is one member as this guard knows it: the leader knows
// every follower, a follower knows the leader (and itself).
type GroupMember struct {
	Rank int  `json:"rank"`
	This bool `json:"this,omitempty"` // this guard
	// Said is its last word ("open", "ready", "end", "running", "stopping",
	// "ended", "hung", "idle"), at Epoch; "" when never heard.
	Said  string    `json:"said,omitempty"`
	Epoch uint64    `json:"epoch"`
	Heard time.Time `json:"heard,omitzero"` // its last authenticated report
	// Present: heard within the loss timeout.
	Present bool `json:"present"`
}

// writeGroup is the human view's lines for the group.
func writeGroup(w io.Writer, d Doc) {
	g := d.Group
	if g == nil {
		return
	}
	ready := "not ready"
	if g.Ready {
		ready = "ready"
	}
	fmt.Fprintf(w, "Group: rank %d of %d, leader %s; epoch %d (%s) on rung %d; the group is %s\n",
		g.Rank, g.Size, clean(g.Leader), g.Epoch, clean(g.Phase), g.Rung, ready)
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	for _, m := range g.Members {
		who := fmt.Sprintf("member %d", m.Rank)
		if m.Rank == 0 {
			who += " (leader)"
		}
		heard := "this guard"
		if !m.This {
			heard = "never heard"
			if !m.Heard.IsZero() {
				heard = "heard " + at(d.Now, m.Heard)
				if !m.Present {
					heard += ": lost"
				}
			}
		}
		said := "nothing yet"
		if m.Said != "" {
			said = fmt.Sprintf("%s at epoch %d", clean(m.Said), m.Epoch)
		}
		fmt.Fprintf(tw, "  %s\t%s\t%s\n", who, said, heard)
	}
	tw.Flush()
}
