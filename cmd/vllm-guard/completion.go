package main

import (
	"fmt"
	"io"
	"slices"
	"strings"

	"github.com/vllm-guard/vllm-guard/internal/exitcode"
)

// completions is what shell completion offers after each command: its
// flags (the test checks them against each command's --help), or its
// subcommands. Keep it in the order `vllm-guard --help` lists them.
var completions = []struct {
	name  string
	words []string
}{
	{"run", []string{"--config", "--instance", "--init", "--events"}},
	{"check", []string{"--config", "--instance"}},
	{"status", []string{"--socket", "--config", "--instance", "--json", "--watch", "--all", "--runtime-dir"}},
	{"incidents", []string{"--socket", "--config", "--instance", "--json", "-n"}},
	{"restart", []string{"--socket", "--config", "--instance"}},
	{"profile", []string{"reset"}},
	{"diagnose", []string{"--log", "--json", "--config", "--instance"}},
	{"drill", []string{"--url", "--model", "--concurrency", "--prompt-tokens", "--max-tokens", "--duration", "--ramp",
		"--chat", "--stream", "--socket", "--instance", "--timeout", "--json", "--api-key-file"}},
	{"gpus", []string{"--json", "--config", "--instance"}},
	{"version", nil},
	{"completion", []string{"bash", "zsh"}},
	{"help", nil}, // the command names
}

// profileResetFlags follow `vllm-guard profile reset`.
var profileResetFlags = []string{"--socket", "--config", "--instance"}

// fileFlags take a path; instanceFlag takes an instance name (completed
// from the config files and the sockets on this host).
var fileFlags = []string{"--config", "--log", "--events", "--socket", "--api-key-file", "--runtime-dir"}

func commandNames() []string {
	var out []string
	for _, c := range completions {
		out = append(out, c.name)
	}
	return out
}

func isCommand(name string) bool { return slices.Contains(commandNames(), name) }

const completionUsage = `Usage: vllm-guard completion bash|zsh

Prints a completion script for the shell: command names, each command's
flags, file names after flags that take a path, and instance names (from
/etc/vllm-guard/*.toml and /run/vllm-guard/*.sock) after --instance.

  bash:  vllm-guard completion bash > /etc/bash_completion.d/vllm-guard
         (or: source <(vllm-guard completion bash) in ~/.bashrc)
  zsh:   vllm-guard completion zsh > "${fpath[1]}/_vllm-guard"
         (or: source <(vllm-guard completion zsh) in ~/.zshrc, after compinit)
`

func cmdCompletion(args []string, stdout, stderr io.Writer) int {
	if len(args) == 1 && (args[0] == "-h" || args[0] == "--help" || args[0] == "-help") {
		fmt.Fprint(stdout, completionUsage)
		return exitcode.OK
	}
	if len(args) != 1 {
		fmt.Fprint(stderr, completionUsage)
		return exitcode.Usage
	}
	switch args[0] {
	case "bash":
		fmt.Fprint(stdout, bashCompletion())
	case "zsh":
		fmt.Fprint(stdout, zshCompletion())
	default:
		fmt.Fprintf(stderr, "vllm-guard completion: %q: give bash or zsh\n\n%s", args[0], completionUsage)
		return exitcode.Usage
	}
	return exitcode.OK
}

// caseArms writes one shell case arm per command: `name) words="...";;`.
func caseArms(indent, variable string) string {
	var b strings.Builder
	for _, c := range completions {
		words := c.words
		if c.name == "help" {
			words = commandNames()
		}
		if strings.HasPrefix(strings.Join(words, " "), "-") || len(words) == 0 {
			words = append(slices.Clone(words), "--help")
		}
		fmt.Fprintf(&b, "%s%s) %s=%q ;;\n", indent, c.name, variable, strings.Join(words, " "))
	}
	return b.String()
}

// instanceLister lists the instance names on this host (the files of the
// guard with no instance excluded); glob is "" for bash, "(N)" for zsh
// (an unmatched pattern is then empty, not an error).
func instanceLister(glob string) string {
	return `            for f in /etc/vllm-guard/*.toml` + glob + ` /run/vllm-guard/*.sock` + glob + `; do
                [ -e "$f" ] || continue
                f=${f##*/}; f=${f%.*}
                [ "$f" = vllm-guard ] || [ "$f" = guard ] || names="$names $f"
            done
`
}

func bashCompletion() string {
	return `# bash completion for vllm-guard (vllm-guard completion bash)
_vllm_guard() {
    local cur prev cmd words names f
    cur=${COMP_WORDS[COMP_CWORD]}
    prev=${COMP_WORDS[COMP_CWORD-1]}
    COMPREPLY=()
    if [ "$COMP_CWORD" -eq 1 ]; then
        COMPREPLY=( $(compgen -W "` + strings.Join(commandNames(), " ") + ` --help --version" -- "$cur") )
        return 0
    fi
    case "$prev" in
        ` + strings.Join(fileFlags, "|") + `)
            COMPREPLY=( $(compgen -f -- "$cur") )
            return 0 ;;
        --instance)
            names=""
` + instanceLister("") + `            COMPREPLY=( $(compgen -W "$names" -- "$cur") )
            return 0 ;;
    esac
    cmd=${COMP_WORDS[1]}
    if [ "$cmd" = profile ] && [ "$COMP_CWORD" -gt 2 ] && [ "${COMP_WORDS[2]}" = reset ]; then
        words="` + strings.Join(append(slices.Clone(profileResetFlags), "--help"), " ") + `"
    else
        case "$cmd" in
` + caseArms("            ", "words") + `            *) words="" ;;
        esac
    fi
    COMPREPLY=( $(compgen -W "$words" -- "$cur") )
    return 0
}
complete -o default -F _vllm_guard vllm-guard
`
}

func zshCompletion() string {
	return `#compdef vllm-guard
# zsh completion for vllm-guard (vllm-guard completion zsh)
_vllm_guard() {
    local cmd words_ names f
    if (( CURRENT == 2 )); then
        compadd -- ` + strings.Join(commandNames(), " ") + ` --help --version
        return
    fi
    case "${words[CURRENT-1]}" in
        ` + strings.Join(fileFlags, "|") + `)
            _files
            return ;;
        --instance)
            names=""
` + instanceLister("(N)") + `            compadd -- ${=names}
            return ;;
    esac
    cmd=${words[2]}
    if [[ $cmd == profile && $CURRENT -gt 3 && ${words[3]} == reset ]]; then
        words_="` + strings.Join(append(slices.Clone(profileResetFlags), "--help"), " ") + `"
    else
        case "$cmd" in
` + caseArms("            ", "words_") + `            *) words_="" ;;
        esac
    fi
    compadd -- ${=words_}
}
if [[ "${funcstack[1]}" == _vllm_guard || "${funcstack[1]}" == _vllm-guard ]]; then
    _vllm_guard "$@"
else
    compdef _vllm_guard vllm-guard
fi
`
}
