package config

import (
	"fmt"
	"strings"
	"time"
)

// UnmarshalTOML sees the raw TOML value, so a bare number is caught here
// instead of becoming nanoseconds.
func (d *Duration) UnmarshalTOML(v any) error {
	switch x := v.(type) {
	case string:
		return d.UnmarshalText([]byte(x))
	case int64:
		return fmt.Errorf("%d is a number; write a duration string with a unit, such as \"%ds\" or \"%dm\"", x, x, x)
	case float64:
		return fmt.Errorf("%g is a number; write a duration string with a unit, such as \"%gs\" or \"%gm\"", x, x, x)
	default:
		return fmt.Errorf("is %s; write a duration string such as \"30s\" or \"5m\"", tomlTypeName(v))
	}
}

// UnmarshalText parses "500ms", "30s", "5m", "1h30m". Negative durations are
// refused: every duration in the config is a wait or an interval.
func (d *Duration) UnmarshalText(b []byte) error {
	s := strings.TrimSpace(string(b))
	v, err := time.ParseDuration(s)
	if err != nil {
		return fmt.Errorf("%s is not a duration; write a number with a unit (ms, s, m, h), such as \"500ms\", \"30s\" or \"5m\"", tomlQuote(string(b)))
	}
	if v < 0 {
		return fmt.Errorf("%s is negative; write a duration of \"0s\" or more", tomlQuote(string(b)))
	}
	d.Duration = v
	return nil
}

// MarshalText writes the short form ("5m", not "5m0s") that UnmarshalText reads back.
func (d Duration) MarshalText() ([]byte, error) { return []byte(d.String()), nil }

// String is the short form: "5m" rather than "5m0s", "1h30m" rather than "1h30m0s".
func (d Duration) String() string { return formatDuration(d.Duration) }

func formatDuration(v time.Duration) string {
	s := v.String()
	if strings.HasSuffix(s, "m0s") {
		s = strings.TrimSuffix(s, "0s")
	}
	if strings.HasSuffix(s, "h0m") {
		s = strings.TrimSuffix(s, "0m")
	}
	return s
}
