package heart

import (
	"time"

	"github.com/vllm-guard/vllm-guard/internal/config"
)

var testTime = time.Date(2026, 12, 6, 9, 0, 0, 0, time.UTC)

func testConfig() *config.Config { return config.Default() }
