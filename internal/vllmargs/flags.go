package vllmargs

import (
	"slices"
	"strings"
)

// vLLM's FlexibleArgumentParser is argparse with allow_abbrev on: a long
// flag may be written as any prefix that no other flag shares (`--api-ke X`
// is `--api-key X`; `--api X` is refused, "ambiguous option: --api could
// match --api-server-count, --api-key"), with underscores for dashes and
// its value after `=` or as the next argument. ResolveFlag is that reading,
// in one place: the command line the guard reads (the API key its probes
// send), the masking of secrets wherever the guard shows a command line
// (internal/redact), the Helm chart's refusal of a key in its values and
// the simulator all use it.

// olderFlags are flags the guard reads that today's vLLM no longer has
// (older versions, run directly): they resolve like vLLM's own.
var olderFlags = []string{
	"--disable-async-output-proc", "--disable-frontend-multiprocessing", "--disable-log-requests",
	"--disable-mm-preprocessor-cache", "--enable-lora-bias", "--prompt-adapters",
	"--ssl-keyfile-password", "--task",
}

// knownFlags is vllmFlags and olderFlags, sorted.
var knownFlags = func() []string {
	all := append(slices.Clone(vllmFlags), olderFlags...)
	slices.Sort(all)
	return slices.Compact(all)
}()

// ResolveFlag reads a flag's name as vLLM's parser does: short aliases
// (-tp) become their long names, underscores dashes, and an abbreviation
// the flag it abbreviates. When the name abbreviates several flags it is
// returned unchanged with them (vLLM refuses it as ambiguous); an unknown
// name is returned unchanged. name is the part before any '='.
func ResolveFlag(name string) (flag string, ambiguous []string) {
	name = normName(name)
	if !strings.HasPrefix(name, "--") || len(name) == 2 {
		return name, nil
	}
	// Dotted JSON arguments (--compilation-config.level) are taken apart
	// by vLLM before argparse sees them.
	if strings.Contains(name, ".") {
		return name, nil
	}
	i, exact := slices.BinarySearch(knownFlags, name)
	if exact {
		return name, nil
	}
	var matches []string
	for _, f := range knownFlags[i:] {
		if !strings.HasPrefix(f, name) {
			break
		}
		matches = append(matches, f)
	}
	if len(matches) == 1 {
		return matches[0], nil
	}
	return name, matches
}

// IsSecretFlag reports whether vLLM reads arg (a flag, with or without
// "=value") as a flag whose value is a secret: --api-key, --hf-token and
// their unambiguous abbreviations and underscore spellings.
func IsSecretFlag(arg string) bool {
	if !strings.HasPrefix(arg, "--") {
		return false
	}
	name, _, _ := strings.Cut(arg, "=")
	flag, _ := ResolveFlag(name)
	return secretFlags[flag]
}

// SecretFlags are the flags whose values are secrets, sorted.
func SecretFlags() []string {
	out := make([]string, 0, len(secretFlags))
	for f := range secretFlags {
		out = append(out, f)
	}
	slices.Sort(out)
	return out
}

// ShortestAbbrev is the shortest prefix of flag that vLLM reads as flag:
// every name from it up to flag itself names flag (--api-k for --api-key).
func ShortestAbbrev(flag string) string {
	for n := 3; n < len(flag); n++ {
		if f, _ := ResolveFlag(flag[:n]); f == flag {
			return flag[:n]
		}
	}
	return flag
}

// TakesSeveral reports whether vLLM reads every argument after flag up to
// the next flag as its values (--api-key k1 k2, --served-model-name a b).
// An unknown flag does not.
func TakesSeveral(flag string) bool {
	name, _ := ResolveFlag(flag)
	return multiFlags[name]
}

// Known reports whether flag names (or abbreviates) one flag vLLM knows.
func Known(flag string) bool {
	name, _ := ResolveFlag(flag)
	_, found := slices.BinarySearch(knownFlags, name)
	return found
}
