package main

import (
	"fmt"
	"net/http"
	"strings"
	"unicode"
)

// The lines vLLM 0.32.0 prints that quote what a client sent (issue 41):
// a model it does not serve, named in the ERROR line of the chat route,
// and with --enable-log-requests the request id, X-Request-Id as sent.
// The guard must never read them as evidence of why vLLM died.

// logUnknownModel is vllm/entrypoints/openai/chat_completion/serving.py:274,
// logger.error("Error with model %s", error_check_ret): the ErrorResponse
// printed by pydantic, its message built by
// vllm/entrypoints/serve/engine/serving.py:213.
func (a *apiServer) logUnknownModel(model string) {
	a.log.error("serving.py:274", "Error with model error=ErrorInfo(message=%s, type='NotFoundError', param='model', code=404)",
		pyRepr(fmt.Sprintf("The model `%s` does not exist.", model)))
}

// logAddedRequest is vllm/v1/engine/async_llm.py:578 with
// --enable-log-requests, logger.info("Added request %s.", request_id);
// the id is prefix + X-Request-Id when the client sent one
// (serving.py _base_request_id), else prefix + vLLM's own id.
func (a *apiServer) logAddedRequest(r *http.Request, prefix, own string) {
	if !a.args.EnableLogRequests {
		return
	}
	id := own
	if h, ok := r.Header["X-Request-Id"]; ok && len(h) > 0 {
		id = prefix + h[0]
	}
	a.log.info("async_llm.py:578", "Added request %s.", id)
}

// pyRepr is Python's repr of a str: single quotes unless the text holds a
// single quote and no double quote; backslashes, the quote, and
// unprintable characters escaped (a newline is `\n`, never a new line).
func pyRepr(s string) string {
	q := byte('\'')
	if strings.Contains(s, "'") && !strings.Contains(s, `"`) {
		q = '"'
	}
	var b strings.Builder
	b.WriteByte(q)
	for _, r := range s {
		switch {
		case r == '\\' || r == rune(q):
			b.WriteByte('\\')
			b.WriteRune(r)
		case r == '\n':
			b.WriteString(`\n`)
		case r == '\r':
			b.WriteString(`\r`)
		case r == '\t':
			b.WriteString(`\t`)
		case r == unicode.ReplacementChar || !unicode.IsPrint(r) && r != ' ':
			switch {
			case r < 0x100:
				fmt.Fprintf(&b, `\x%02x`, r)
			case r < 0x10000:
				fmt.Fprintf(&b, `\u%04x`, r)
			default:
				fmt.Fprintf(&b, `\U%08x`, r)
			}
		default:
			b.WriteRune(r)
		}
	}
	b.WriteByte(q)
	return b.String()
}
