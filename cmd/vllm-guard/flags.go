package main

import (
	"errors"
	"flag"
	"fmt"
	"github.com/vllm-guard/vllm-guard/exitcode"
	"io"
)

// newFlags makes a subcommand's flag set with a --help that prints its usage.
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
// the command (help: 0, bad flags: 2).
func parse(fs *flag.FlagSet, args []string) (int, bool) {
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return exitcode.OK, false
		}
		return exitcode.Usage, false
	}
	return 0, true
}
