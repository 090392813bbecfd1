// Package procstatus reads a process's memory figures from Linux's
// /proc/PID/status, for the tests and benchmarks that report them.
package procstatus

import (
	"bufio"
	"fmt"
	"os"
	"strconv"
	"strings"
)

// KiB is the field ("VmRSS", "VmHWM", ...) of /proc/pid/status, in KiB. A
// missing /proc is an error errors.Is(err, fs.ErrNotExist) recognizes.
func KiB(pid int, field string) (int64, error) {
	f, err := os.Open(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		return 0, err
	}
	defer f.Close()
	s := bufio.NewScanner(f)
	for s.Scan() {
		if rest, ok := strings.CutPrefix(s.Text(), field+":"); ok {
			kb, err := strconv.ParseInt(strings.TrimSpace(strings.TrimSuffix(strings.TrimSpace(rest), "kB")), 10, 64)
			if err != nil {
				return 0, fmt.Errorf("/proc/%d/status %s: %w", pid, field, err)
			}
			return kb, nil
		}
	}
	if err := s.Err(); err != nil {
		return 0, fmt.Errorf("read /proc/%d/status: %w", pid, err)
	}
	return 0, fmt.Errorf("no %s in /proc/%d/status", field, pid)
}
