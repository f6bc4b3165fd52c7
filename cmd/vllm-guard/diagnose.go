package main

import (
	"encoding/json"
	"fmt"
	"github.com/vllm-guard/vllm-guard/internal/exitcode"
	"io"
	"os"
	"strings"

	"go.uber.org/zap"

	"github.com/vllm-guard/vllm-guard/internal/cause"
	"github.com/vllm-guard/vllm-guard/internal/config"
	"github.com/vllm-guard/vllm-guard/internal/state"
)

// cmdDiagnose classifies a saved vLLM log (or the last incident) offline,
// with the same classifier the guard uses live.
func cmdDiagnose(args []string, stdin io.Reader, stdout, stderr io.Writer) int {
	fs := newFlags("diagnose", "diagnose [--log FILE|-] [--json] [--config FILE | --instance NAME]", stderr)
	logPath := fs.String("log", "", "a saved vLLM log (journalctl output is fine); - reads standard input; default: the guard's last incident")
	asJSON := fs.Bool("json", false, "print JSON")
	cf := addConfigFlags(fs, ", to find [control] state_dir when --log is not given")
	if code, ok := parse(fs, args, stdout); !ok {
		return code
	}
	instance, cfgPath, ok := cf.resolve(stderr)
	if !ok {
		return exitcode.Usage
	}
	var in io.Reader
	source := *logPath
	switch *logPath {
	case "-":
		in, source = stdin, "standard input"
	case "":
		text, from, err := lastIncidentLog(cfgPath, instance)
		if err != nil {
			fmt.Fprintf(stderr, "vllm-guard diagnose: %v\n", err)
			return exitcode.Failed
		}
		in, source = strings.NewReader(text), from
	default:
		f, err := os.Open(*logPath)
		if err != nil {
			fmt.Fprintf(stderr, "vllm-guard diagnose: %v\n", err)
			return exitcode.Failed
		}
		defer f.Close()
		in = f
	}
	rep, err := cause.Diagnose(in)
	if err != nil {
		fmt.Fprintf(stderr, "vllm-guard diagnose: reading %s: %v\n", source, err)
		return exitcode.Failed
	}
	if *asJSON {
		enc := json.NewEncoder(stdout)
		enc.SetIndent("", "  ")
		if err := enc.Encode(rep); err != nil {
			return exitcode.Failed
		}
		return exitcode.OK
	}
	if err := writeClean(stdout, func(w io.Writer) error {
		fmt.Fprintf(w, "# %s\n", source)
		return rep.WriteText(w)
	}); err != nil {
		return exitcode.Failed
	}
	return exitcode.OK
}

// lastIncidentLog returns the vLLM output kept in the newest incident record.
func lastIncidentLog(cfgPath, instance string) (string, string, error) {
	cfg, err := config.LoadFor(cfgPath, instance)
	if err != nil {
		return "", "", fmt.Errorf("no --log given and the config does not load, so the incidents cannot be found: %w", err)
	}
	store, _, err := state.Open(cfg.Control.StateDir, zap.NewNop())
	if err != nil {
		return "", "", err
	}
	incs, err := store.Incidents(1)
	if err != nil {
		return "", "", err
	}
	if len(incs) == 0 {
		return "", "", fmt.Errorf("no incident recorded in %s; give a log with --log FILE", cfg.Control.StateDir)
	}
	if why := incs[0].Unreadable; why != "" {
		return "", "", fmt.Errorf("the newest incident record %s cannot be read (%s); give a log with --log FILE", incs[0].ID, why)
	}
	return strings.Join(incs[0].LastLines, "\n") + "\n", "incident " + incs[0].ID, nil
}
