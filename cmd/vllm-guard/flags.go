package main

import (
	"errors"
	"flag"
	"fmt"
	"io"

	"github.com/vllm-guard/vllm-guard/internal/config"
	"github.com/vllm-guard/vllm-guard/internal/exitcode"
)

// newFlags makes a subcommand's flag set. Its usage goes to stdout when
// asked for (--help, exit 0) and to stderr after a usage error (exit 2):
// see parse.
func newFlags(name, synopsis string, stderr io.Writer) *flag.FlagSet {
	fs := flag.NewFlagSet(name, flag.ContinueOnError)
	fs.SetOutput(stderr)
	fs.Usage = func() {
		fmt.Fprintf(fs.Output(), "Usage: vllm-guard %s\n\n", synopsis)
		fs.PrintDefaults()
	}
	return fs
}

// parse parses flags; it returns the exit code to use when parsing ended
// the command: --help prints the usage on stdout and exits 0, a bad flag
// prints the error and the usage on stderr and exits 2.
func parse(fs *flag.FlagSet, args []string, stdout io.Writer) (int, bool) {
	usage, errw := fs.Usage, fs.Output()
	fs.Usage = func() {} // printed below, on the right stream
	err := fs.Parse(args)
	fs.Usage = usage
	if err == nil {
		return 0, true
	}
	if errors.Is(err, flag.ErrHelp) {
		fs.SetOutput(stdout)
		fs.Usage()
		fs.SetOutput(errw)
		return exitcode.OK, false
	}
	fs.Usage()
	return exitcode.Usage, false
}

// configFlags are --config and --instance, which every command that reads
// the config takes.
type configFlags struct {
	config, instanceFlag string
}

func addConfigFlags(fs *flag.FlagSet, what string) *configFlags {
	c := &configFlags{}
	fs.StringVar(&c.config, "config", "", "config file"+what+" (default: the instance's "+config.ConfigDir+"/NAME.toml, else $VLLM_GUARD_CONFIG, ./vllm-guard.toml, "+config.ConfigDir+"/vllm-guard.toml)")
	fs.StringVar(&c.instanceFlag, "instance", "", "the guard instance NAME, one of several on this host: config "+config.ConfigDir+"/NAME.toml, socket "+config.RuntimeDir+"/NAME.sock, state "+config.StateRoot+"/NAME (default: $VLLM_GUARD_INSTANCE)")
	return c
}

// resolve returns the instance name and the config path; a bad instance
// name is a usage error (ok false, reported).
func (c *configFlags) resolve(stderr io.Writer) (instance, path string, ok bool) {
	instance, err := config.Instance(c.instanceFlag)
	if err != nil {
		fmt.Fprintf(stderr, "vllm-guard: %v\n", err)
		return "", "", false
	}
	return instance, config.ResolveFor(c.config, instance), true
}

// instanceWarnings says what in the file is allowed but weakens the guard
// (config's Warnings: a trusted_proxies that trusts everyone), and when an
// instance's file sets [control] socket or
// state_dir to the single guard's defaults (a copy of the example
// vllm-guard.toml does): the key wins over the instance's default, so two
// instances would fight over one socket or one state folder.
func instanceWarnings(instance string, cfg *config.Config) []string {
	out := cfg.Warnings()
	if instance == "" {
		return out
	}
	single, own := config.Default().Control, config.DefaultFor(instance).Control
	if cfg.Control.Socket == single.Socket {
		out = append(out, fmt.Sprintf("instance %s: [control] socket is %s, the guard without an instance's: every instance whose file says so shares it; remove the key (the instance's default is %s)",
			instance, single.Socket, own.Socket))
	}
	if cfg.Control.StateDir == single.StateDir {
		out = append(out, fmt.Sprintf("instance %s: [control] state_dir is %s, the guard without an instance's: instances would share their rung and incidents; remove the key (the instance's default is %s)",
			instance, single.StateDir, own.StateDir))
	}
	return out
}
