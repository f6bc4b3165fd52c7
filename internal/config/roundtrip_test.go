package config

import (
	"bytes"
	"fmt"
	"reflect"
	"strings"

	"github.com/vllm-guard/vllm-guard/internal/redact"
)

// sameButMasked says where got (a config read back from WriteEffective)
// differs from want other than by a masked secret: WriteEffective writes
// secrets as *** on purpose (check's output lands in terminals and CI
// logs), so a string may come back with *** in it, and nothing else may
// change. "" when none.
func sameButMasked(got, want reflect.Value, path string) string {
	if got.Type() != want.Type() {
		return fmt.Sprintf("%s: type %s, want %s", path, got.Type(), want.Type())
	}
	switch got.Kind() {
	case reflect.String:
		if g, w := got.String(), want.String(); g != w && !strings.Contains(g, redact.Mask) {
			return fmt.Sprintf("%s: %q, want %q (or it masked)", path, g, w)
		}
		return ""
	case reflect.Struct:
		for i := range got.NumField() {
			if d := sameButMasked(got.Field(i), want.Field(i), path+"."+got.Type().Field(i).Name); d != "" {
				return d
			}
		}
		return ""
	case reflect.Slice:
		if got.Len() != want.Len() || got.IsNil() != want.IsNil() {
			return fmt.Sprintf("%s: %v, want %v", path, got, want)
		}
		for i := range got.Len() {
			if d := sameButMasked(got.Index(i), want.Index(i), fmt.Sprintf("%s[%d]", path, i)); d != "" {
				return d
			}
		}
		return ""
	case reflect.Map:
		if got.Len() != want.Len() || got.IsNil() != want.IsNil() {
			return fmt.Sprintf("%s: %v, want %v", path, got, want)
		}
		for _, k := range want.MapKeys() {
			g := got.MapIndex(k)
			if !g.IsValid() {
				return fmt.Sprintf("%s: key %v lost", path, k)
			}
			if d := sameButMasked(g, want.MapIndex(k), fmt.Sprintf("%s[%v]", path, k)); d != "" {
				return d
			}
		}
		return ""
	}
	if !reflect.DeepEqual(got.Interface(), want.Interface()) {
		return fmt.Sprintf("%s: %v, want %v", path, got, want)
	}
	return ""
}

// roundTrip checks what check prints against cfg: it loads back to cfg
// with its secrets masked and nothing else changed, and printing that
// again gives the same text (masking is settled in one pass). Only an
// output with no *** in it must load back to exactly cfg.
func roundTrip(name string, cfg *Config) error {
	var out bytes.Buffer
	if err := cfg.WriteEffective(&out); err != nil {
		return err
	}
	back, err := parse(name, out.Bytes())
	if err != nil {
		return fmt.Errorf("effective output does not load back: %w\n%s", err, out.String())
	}
	if !strings.Contains(out.String(), redact.Mask) {
		if !reflect.DeepEqual(back, cfg) {
			return fmt.Errorf("round trip differs with no secret masked:\n got %+v\nwant %+v", back, cfg)
		}
		return nil
	}
	if d := sameButMasked(reflect.ValueOf(*back), reflect.ValueOf(*cfg), "Config"); d != "" {
		return fmt.Errorf("round trip differs other than by a masked secret: %s\n%s", d, out.String())
	}
	var again bytes.Buffer
	if err := back.WriteEffective(&again); err != nil {
		return err
	}
	if again.String() != out.String() {
		return fmt.Errorf("masked output printed again differs:\n%s\nthen\n%s", out.String(), again.String())
	}
	return nil
}
