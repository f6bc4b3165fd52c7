package control

import (
	"strings"
)

// loadBarWidth is the characters the load's bar takes in the human view.
const loadBarWidth = 20

// loadRows writes, while vLLM starts, its load phase with the phase's
// progress where vLLM reports one (a bar, which `status --watch` redraws
// every second), and when it is expected to be ready:
//
//	loading   phase weights: 2/3 shards (67%) ▕█████████████▎      ▏
//	expected  ready in ~41 s (from 3 earlier starts of this model on rung 0)
func loadRows(row func(label, format string, args ...any), d Doc) {
	g := d.Guard
	phase := g.Phase
	if phase == "" {
		phase = "launched"
	}
	if p, ok := g.LoadingProgress(); ok && p.Phase == g.Phase {
		row("loading", "phase %s: %s %s", phase, p.String(), loadBar(p.Ratio(), loadBarWidth))
	} else {
		row("loading", "phase %s", phase)
	}
	if eta := g.ReadyInText(d.Now); eta != "" {
		row("expected", "%s", eta)
	}
}

// loadBar draws ratio (0..1) in width cells, eighths included.
func loadBar(ratio float64, width int) string {
	ratio = min(max(ratio, 0), 1)
	eighths := int(ratio*float64(width*8) + 0.5)
	var b strings.Builder
	b.WriteString("▕")
	b.WriteString(strings.Repeat("█", eighths/8))
	if r := eighths % 8; r > 0 {
		b.WriteRune([]rune(" ▏▎▍▌▋▊▉")[r])
	}
	if pad := width - (eighths+7)/8; pad > 0 {
		b.WriteString(strings.Repeat(" ", pad))
	}
	b.WriteString("▏")
	return b.String()
}
