package vllmlog

import (
	"regexp"
	"strconv"
	"strings"
)

// UvicornPrefix starts uvicorn's own lines on stderr ("INFO:     Started
// server process [1951]"), after the process prefix in V1.
const UvicornPrefix = "INFO:     "

// Uvicorn renders one of uvicorn's INFO lines.
func Uvicorn(msg string) string { return UvicornPrefix + msg }

// Access is one line of uvicorn's access log:
// `INFO:     127.0.0.1:54321 - "GET /health HTTP/1.1" 200 OK`.
type Access struct {
	Client string // host, without brackets for IPv6
	Port   int
	Method string
	Path   string // as requested, query included
	Proto  string // "HTTP/1.1"
	Status int
	Reason string // "OK"; "" when uvicorn printed none
}

// FormatAccess renders an access-log line (without the process prefix).
// client is "host:port".
func FormatAccess(client, method, path, proto string, status int, reason string) string {
	s := UvicornPrefix + client + ` - "` + method + " " + path + " " + proto + `" ` + strconv.Itoa(status)
	if reason != "" {
		s += " " + reason
	}
	return s
}

// ParseAccess parses an access-log line. line may carry the wrappers and
// prefixes Message strips.
func ParseAccess(line string) (Access, bool) {
	s := Message(line)
	if !strings.HasPrefix(s, "INFO: ") {
		return Access{}, false
	}
	s = strings.TrimLeft(s[len("INFO:"):], " ")
	dash := strings.Index(s, ` - "`)
	if dash <= 0 {
		return Access{}, false
	}
	var a Access
	addr := s[:dash]
	colon := strings.LastIndexByte(addr, ':')
	if colon <= 0 {
		return Access{}, false
	}
	port, err := strconv.Atoi(addr[colon+1:])
	if err != nil || port < 0 || port > 65535 || addr[colon+1] == '+' || addr[colon+1] == '-' {
		return Access{}, false
	}
	a.Client, a.Port = addr[:colon], port
	if len(a.Client) > 2 && a.Client[0] == '[' && a.Client[len(a.Client)-1] == ']' {
		a.Client = a.Client[1 : len(a.Client)-1]
	}
	if strings.ContainsAny(a.Client, " \"") {
		return Access{}, false
	}
	s = s[dash+len(` - "`):]
	end := strings.LastIndex(s, `" `)
	if end < 0 {
		return Access{}, false
	}
	req, tail := s[:end], s[end+2:]
	sp := strings.IndexByte(req, ' ')
	last := strings.LastIndexByte(req, ' ')
	if sp <= 0 || last <= sp {
		return Access{}, false
	}
	a.Method, a.Path, a.Proto = req[:sp], req[sp+1:last], req[last+1:]
	if !strings.HasPrefix(a.Proto, "HTTP/") || a.Path == "" {
		return Access{}, false
	}
	for i := 0; i < len(a.Method); i++ {
		if c := a.Method[i]; c < 'A' || c > 'Z' {
			return Access{}, false
		}
	}
	if len(tail) < 3 || tail[0] < '1' || tail[0] > '9' || !isDigit(tail[1]) || !isDigit(tail[2]) || (len(tail) > 3 && tail[3] != ' ') {
		return Access{}, false
	}
	a.Status = int(tail[0]-'0')*100 + int(tail[1]-'0')*10 + int(tail[2]-'0')
	if len(tail) > 3 {
		a.Reason = tail[4:]
	}
	return a, true
}

// accessShape is uvicorn's access line whatever its client field holds:
// `INFO:     <client> - "<METHOD> <path> HTTP/<version>" <status>[ <reason>]`.
// The client field is not necessarily host:port: behind a proxy uvicorn
// trusts (vLLM's trusts 127.0.0.1) it prints X-Forwarded-For's client,
// text of the client's choosing, spaces, colons and quotes included. The
// method is any token (uvicorn prints it as sent).
var accessShape = regexp.MustCompile("(?s)^INFO: +.* - \"[!#$%&'*+.^_`|~0-9A-Za-z-]+ .* HTTP/[^ ]*\" [1-9][0-9][0-9](?: .*)?$")

// IsAccessShape reports whether line (with any wrapper and process
// prefix) has the shape of one of uvicorn's access lines. Every line
// ParseAccess reads has it, and more: one whose client field is not an
// address. Such a line is the client's text however it reads.
func IsAccessShape(line string) bool {
	if !strings.Contains(line, "HTTP/") {
		return false
	}
	return accessShape.MatchString(Message(line))
}

// clientQuoting start the messages of vLLM's logger that quote what a
// client sent: a prompt, a model name, a request id, a LoRA name, an
// error built from the request (vLLM 0.32.0; docs/how-it-decides.md,
// "Lines that quote a client", names each site).
var clientQuoting = []string{
	"Received request ", "Generated response ", "Error with model ", "Added request ", "Aborted request(s) ", "Request ",
	"Exception caught. Request id:", "Engine Exception caught. Request id:", "HTTPException caught. Request id:",
	"RequestValidationError caught. Request id:", "Chat template rejected the request", "Loaded new LoRA adapter",
	"Failed to load LoRA", "Removed LoRA adapter", "Reloaded LoRA adapter", "Resolved and loaded LoRA adapter",
	"Unexpected error pre-processing request ", "Multi-modal cache miss for request ",
}

// IsClientText reports whether a line carries what a client sent: one of
// uvicorn's access lines (the client's path and query, copied as sent) or
// one of vLLM's lines that quote a request (clientQuoting: "Received
// request …: prompt: '…'", "Error with model error=ErrorInfo(message='The
// model `…` does not exist.'", "Added request …" …). Such lines are never
// evidence of a failure and never say what vLLM serves: a client could
// write anything in them. An access line counts by its shape
// (IsAccessShape), whatever its client field holds: X-Forwarded-For:
// torch.OutOfMemoryError: CUDA out of memory…, 127.0.0.1 makes that text
// the client (issue 32).
//
// This is the reading of a saved log (vllm-guard diagnose); the live
// guard reads only what vLLM's structure owns (policy's provenance) and
// needs no list: a line of a client's that is not here is no evidence
// there either.
func IsClientText(line string) bool {
	if IsAccessShape(line) {
		return true
	}
	if !strings.Contains(line, "equest") && !strings.Contains(line, "esponse ") && !strings.Contains(line, "LoRA") &&
		!strings.Contains(line, "rror with model") {
		return false
	}
	if msg, ok := LoggerMessage(line); ok {
		for _, p := range clientQuoting {
			if strings.HasPrefix(msg, p) {
				return true
			}
		}
	}
	return false
}
