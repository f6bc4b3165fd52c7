package gpumon

import (
	"slices"
	"strings"
	"testing"
)

var fourGPUs = []deviceInfo{
	{Index: 0, UUID: "GPU-aaaa1111-0000-0000-0000-000000000000", Name: "NVIDIA H100 80GB HBM3"},
	{Index: 1, UUID: "GPU-bbbb2222-0000-0000-0000-000000000000", Name: "NVIDIA H100 80GB HBM3"},
	{Index: 2, UUID: "GPU-bbbb3333-0000-0000-0000-000000000000", Name: "NVIDIA H100 80GB HBM3"},
	{Index: 3, UUID: "GPU-dddd4444-0000-0000-0000-000000000000", Name: "NVIDIA H100 80GB HBM3"},
}

func TestParseVisibleDevices(t *testing.T) {
	cases := []struct {
		in   string
		want []string
	}{
		{"0,1", []string{"0", "1"}},
		{" 2 , 0 ", []string{"2", "0"}},
		{"0,0,1", []string{"0", "1"}},
		{"0,-1,1", []string{"0"}},  // CUDA stops at the first invalid entry
		{"1,foo,2", []string{"1"}}, // same
		{"0,,1", []string{"0"}},    // an empty entry is invalid too
		{"-1", nil},                // hide every GPU
		{"GPU-bbbb2222,3", []string{"GPU-bbbb2222", "3"}},
		{"MIG-abc", []string{"MIG-abc"}},
	}
	for _, c := range cases {
		if got := parseVisibleDevices(c.in); !slices.Equal(got, c.want) {
			t.Errorf("parseVisibleDevices(%q) = %q, want %q", c.in, got, c.want)
		}
	}
}

func indices(ds []deviceInfo) []int {
	out := make([]int, len(ds))
	for i, d := range ds {
		out[i] = d.Index
	}
	return out
}

func TestSelectDevices(t *testing.T) {
	cases := []struct {
		name       string
		configured []string
		visible    string
		want       []int
		note, err  string
	}{
		{name: "all", want: []int{0, 1, 2, 3}},
		{name: "visible indices", visible: "2,0", want: []int{2, 0}},
		{name: "visible uuid prefix", visible: "GPU-dddd,GPU-aaaa1111-0000-0000-0000-000000000000", want: []int{3, 0}},
		{name: "configured wins", configured: []string{"1"}, visible: "2", want: []int{1}},
		{name: "configured uuid", configured: []string{" GPU-bbbb3333 "}, want: []int{2}},
		{name: "configured duplicate", configured: []string{"1", "GPU-bbbb2222"}, want: []int{1}},
		{name: "configured missing", configured: []string{"7"}, err: `[gpu] devices entry "7": GPU index 7 does not exist (NVML sees 4 GPUs)`},
		{name: "configured ambiguous", configured: []string{"GPU-bbbb"}, err: "matches 2 GPUs"},
		{name: "configured unknown uuid", configured: []string{"GPU-ffff"}, err: "no GPU has UUID"},
		{name: "configured MIG", configured: []string{"MIG-1"}, err: "MIG instance"},
		{name: "visible hides all", visible: "-1", want: []int{0, 1, 2, 3}, note: "names none"},
		{name: "visible unknown", visible: "9", want: []int{0, 1, 2, 3}, note: "GPU index 9 does not exist"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			got, note, err := selectDevices(fourGPUs, c.configured, c.visible)
			if c.err != "" {
				if err == nil || !strings.Contains(err.Error(), c.err) {
					t.Fatalf("err = %v, want one containing %q", err, c.err)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if !slices.Equal(indices(got), c.want) {
				t.Fatalf("chose %v, want %v", indices(got), c.want)
			}
			if !strings.Contains(note, c.note) || (c.note == "") != (note == "") {
				t.Fatalf("note %q, want one containing %q", note, c.note)
			}
		})
	}
}

func FuzzParseVisibleDevices(f *testing.F) {
	for _, s := range []string{"0,1", " 2 , 0 ", "0,-1,1", "GPU-bbbb2222,3", "MIG-abc", "", ",", "1,foo,2", "00,0"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		got := parseVisibleDevices(s)
		seen := map[string]bool{}
		for _, e := range got {
			if e == "" || e != strings.TrimSpace(e) || strings.Contains(e, ",") {
				t.Fatalf("entry %q of %q is not a trimmed, non-empty entry", e, s)
			}
			if seen[e] {
				t.Fatalf("duplicate entry %q of %q", e, s)
			}
			seen[e] = true
		}
		chosen, _, err := selectDevices(fourGPUs, nil, s)
		if err != nil {
			t.Fatalf("CUDA_VISIBLE_DEVICES=%q: an unusable value must fall back, got %v", s, err)
		}
		if len(chosen) == 0 || len(chosen) > len(fourGPUs) {
			t.Fatalf("CUDA_VISIBLE_DEVICES=%q chose %d devices", s, len(chosen))
		}
		dup := map[int]bool{}
		for _, d := range chosen {
			if dup[d.Index] {
				t.Fatalf("CUDA_VISIBLE_DEVICES=%q chose GPU %d twice", s, d.Index)
			}
			dup[d.Index] = true
		}
	})
}
