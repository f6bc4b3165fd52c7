package main

import (
	"errors"
	"flag"
	"fmt"
	"io"

	"github.com/vllm-guard/vllm-guard/config"
	"github.com/vllm-guard/vllm-guard/exitcode"
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
