package admission

import "testing"

func TestFitAdmissionLearnsTheCostOfATypicalRequest(t *testing.T) {
	m := FitAdmission(levels(admTokens, 10, 20, 30, 40, 50))
	if !m.Confident {
		t.Fatalf("not confident: %s", m.Why)
	}
	if got := m.RequestBytes(admTokens); got < admPerReq*0.99 || got > admPerReq*1.01 {
		t.Errorf("a request of %d tokens costs %.1f MiB, want %.2f", admTokens, got/(1<<20), float64(admPerReq)/(1<<20))
	}
	// Every request alike: a longer prompt is charged in proportion.
	if got, want := m.RequestBytes(2*admTokens), 2*m.RequestBytes(admTokens); got != want {
		t.Errorf("a request twice as long costs %.1f MiB, want %.1f", got/(1<<20), want/(1<<20))
	}
}

func TestFitAdmissionSeparatesSequencesFromPromptTokens(t *testing.T) {
	var ss []CostSample
	for i, r := range []float64{10, 20, 30, 40, 50, 60} {
		for _, tok := range []float64{500, 4000} {
			ss = append(ss, admSample(r+float64(i%2), tok))
		}
	}
	m := FitAdmission(ss)
	if !m.Confident {
		t.Fatalf("not confident: %s", m.Why)
	}
	if m.PerSeq < admPerSeq*0.98 || m.PerSeq > admPerSeq*1.02 || m.PerToken < admPerTok*0.98 || m.PerToken > admPerTok*1.02 {
		t.Errorf("per sequence %.1f MiB, per token %.1f KiB; want 100 MiB and 16 KiB", m.PerSeq/(1<<20), m.PerToken/(1<<10))
	}
}

func TestFitAdmissionNeedsTwoSamplesAtALevel(t *testing.T) {
	var ss []CostSample
	for _, r := range []float64{10, 20, 30, 40, 50} {
		ss = append(ss, admSample(r, admTokens))
	}
	if m := FitAdmission(ss); m.Confident {
		t.Fatalf("confident on one sample per level: %+v", m)
	}
	if m := FitCost(ss); !m.Confident {
		t.Fatalf("the restart profile's fit should take them: %s", m.Why)
	}
}

// Readings that caught some requests before they reached vLLM's batch
// (memory low for the count) must not pull the cost down: the slope is an
// upper quantile, so the model errs high.
func TestFitAdmissionErrsHigh(t *testing.T) {
	ss := levels(admTokens, 10, 20, 30, 40, 50, 60, 70, 80)
	for i := range ss {
		if i%4 == 0 {
			ss[i].Above -= 8 * admPerReq // eight requests still on their way
		}
	}
	m := FitAdmission(ss)
	med := FitCost(ss)
	if !m.Confident {
		t.Fatalf("not confident: %s", m.Why)
	}
	if m.RequestBytes(admTokens) < med.PerSeq {
		t.Errorf("admission's cost %.1f MiB is below the median fit's %.1f MiB", m.RequestBytes(admTokens)/(1<<20), med.PerSeq/(1<<20))
	}
}
