package adapters

import (
	"os"
	"testing"
)

func TestOOMKillsReadsEitherCgroupVersion(t *testing.T) {
	files := map[string]string{
		"/sys/fs/cgroup/memory/process_api/abc/memory.oom_control":     "oom_kill_disable 0\nunder_oom 0\noom_kill 3\n",
		"/sys/fs/cgroup/system.slice/vllm-guard.service/memory.events": "low 0\nhigh 0\nmax 7\noom 2\noom_kill 2\n",
	}
	read := func(p string) ([]byte, error) {
		if s, ok := files[p]; ok {
			return []byte(s), nil
		}
		return nil, os.ErrNotExist
	}
	for _, c := range []struct {
		Name, Cgroup string
		Want         int64
	}{
		{"v2", "0::/system.slice/vllm-guard.service\n", 2},
		{"v1 memory controller beside an empty v2 hierarchy", "9:name=systemd:/\n4:memory:/process_api/abc\n0::/\n", 3},
		{"v1 with the controllers joined", "5:cpu,memory:/process_api/abc\n", 3},
		{"no memory cgroup readable", "0::/elsewhere\n", -1},
		{"garbage", "nonsense", -1},
	} {
		if got := OomKills(c.Cgroup, read); got != c.Want {
			t.Errorf("%s: oomKills = %d, want %d", c.Name, got, c.Want)
		}
	}
}
