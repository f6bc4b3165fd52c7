package policy

// Classify gives one cause, with its evidence, for one death of vLLM.
func Classify(e Exit) Verdict {
	switch {
	case e.StartFailure != "":
		return Verdict{Cause: CauseConfigError, Confidence: "high", Summary: e.StartFailure}
	case e.Hang != "":
		return Verdict{Cause: CauseHang, Confidence: "high", Summary: e.Hang}
	}
	return Verdict{Cause: CauseCrash, Confidence: "low", Summary: "vLLM exited"}
}
