// Package vllmlog owns what vllm-guard knows about vLLM's log output, in one
// place, for every consumer: the supervisor's log pump, the classifier, the
// vLLM simulator and the classifier's corpus generator.
//
// It holds both sides of the format, so that it is written once:
//
//   - reading: ANSI escape sequences (StripANSI), lines cut at "\n" and at
//     tqdm's "\r" (Splitter), the wrappers operators' tools add (docker and
//     Kubernetes RFC 3339 timestamps with CRI's "stdout F", journalctl's
//     prefix), V1's process prefixes ("(EngineCore_DP0 pid=42) "), the level
//     prefix of each era (Message), Python tracebacks, load phases, the
//     load's progress bars (LoadBar) and uvicorn's access-log lines;
//   - writing: a logger line of a given era with its process prefix
//     (FormatLine), the wrappers (Journal, Docker, CRI), uvicorn's lines.
//
// The facts come from vLLM's source history and from logs its users posted,
// versions 0.6 to 2026. Nothing here allocates on the common V1 shape of a
// line: the classifier reads hundreds of thousands of lines per incident.
package vllmlog
